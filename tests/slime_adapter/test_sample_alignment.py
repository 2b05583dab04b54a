"""A generate function whose per-token fields do not align with its tokens (issue 44, item 9): one
line naming the sample, the field and the lengths, raised by the rollout function before any group
is delivered for training (the prompts stay in the ledger's consumed-not-trained set)."""

from __future__ import annotations


import pytest

from support.preconditions import slime_or_skip

with slime_or_skip("needs slime's source (set SLIME_PATH)"):
    from slime.utils.types import Sample

from epic_slime.slime.stream.sample_checks import SampleAlignmentError, check_groups_alignment, check_sample_alignment  # noqa: E402


def _sample(**fields):
    sample = Sample(index=3, tokens=[1, 2, 3])
    sample.append_response_tokens(None, tokens=[4, 5], log_probs=[-0.1, -0.2])
    sample.append_response_tokens(None, tokens=[6, 7, 8], trainable=False)
    for name, value in fields.items():
        setattr(sample, name, value)
    return sample


def test_slimes_own_appends_are_aligned():
    sample = _sample()
    check_sample_alignment(sample)
    assert sample.loss_mask == [1, 1, 0, 0, 0] and sample.rollout_log_probs == [-0.1, -0.2, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            dict(loss_mask=[1, 1, 0, 0]),
            "sample 3 (generate function output): loss_mask has 4 entries, response_length is 5 (tokens 8, prompt 3)",
        ),
        (
            dict(rollout_log_probs=[-0.1] * 6),
            "sample 3 (generate function output): rollout_log_probs has 6 entries, response_length is 5 "
            "(tokens 8, prompt 3)",
        ),
        (
            dict(tokens=[4, 5, 6, 7, 8]),
            "sample 3 (generate function output): tokens has 5 entries for response_length=5 "
            "(needs at least one prompt token)",
        ),
        (dict(loss_mask=[1, 1, 0, 2, 0]), "sample 3 (generate function output): loss_mask holds 2; it must be 0 or 1"),
    ],
)
def test_misaligned_fields_are_one_line_errors(fields, message):
    with pytest.raises(SampleAlignmentError) as info:
        check_groups_alignment([[_sample()], [_sample(**fields)]])
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_the_boundary_one_prompt_token_and_mask_none():
    sample = _sample(tokens=[1, 4, 5, 6, 7, 8])
    check_sample_alignment(sample)
    check_sample_alignment(_sample(loss_mask=None, rollout_log_probs=None))


def test_the_rollout_function_refuses_before_delivering(monkeypatch):
    """The synchronous rollout (slime's own batch generation) with one misaligned sample: the error,
    and no group delivered: both stay consumed-not-trained in the ledger (a resume hands them out)."""
    from epic_slime.slime import rollout
    from slime_adapter.test_slime_sync import _args, _ledger_data_source, _slime_rollout_modules

    sglang_rollout, output_type, _ = _slime_rollout_modules()

    def slime_generate_rollout(args, rollout_id, data_source, evaluation=False):
        groups = []
        for g in (0, 1):
            group = [_sample(index=2 * g + i, group_index=g, weight_versions=["1"]) for i in range(2)]
            data_source.ledger.consume(g, group)
            groups.append(group)
        groups[1][1].loss_mask = groups[1][1].loss_mask[:-1]
        return output_type(samples=groups, metrics={})

    monkeypatch.setattr(sglang_rollout, "generate_rollout", slime_generate_rollout)
    monkeypatch.setattr(rollout, "_first_rollout_id", None)
    source = _ledger_data_source()
    with pytest.raises(SampleAlignmentError, match="sample 3 .*loss_mask has 4 entries, response_length is 5"):
        rollout.generate_rollout(_args(rollout_batch_size=2), 7, source)
    ledger = source.ledger
    assert ledger.undelivered() == 2 and ledger.metrics()["rollout/accounting/delivered_untrained_groups"] == 0
    assert len(ledger.pending_payloads()) == 2  # what a resume hands out again
