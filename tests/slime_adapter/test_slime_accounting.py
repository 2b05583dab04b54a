"""Prompt accounting (GroupLedger), the driver's slime flag additions (old-log-prob forward,
data source), the driver's RSS metric, and the streaming data source's save / resume with the resume
hint that names the last consistent save; no slime needed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from epic_slime.slime.cli.flags import DATA_SOURCE_PATH, ProjectFlagError
from epic_slime.slime.cli.command_line import driver_argv, needs_old_logprob_forward
from epic_slime.slime.train import log_driver_metrics
from epic_slime.slime.stream.ledger import GroupLedger

BASE = [
    "--loss-type",
    "custom_loss",
    "--custom-loss-function-path",
    "epic_slime.slime.loss.policy_loss",
    "--rollout-function-path",
    "epic_slime.slime.rollout.generate_rollout",
    "--rollout-batch-size",
    "4",
    "--n-samples-per-prompt",
    "2",
]


def test_ledger_follows_every_group_to_trained_dropped_or_in_flight():
    ledger = GroupLedger()
    for key in range(6):
        ledger.consume(key, {"prompt": key})
    ledger.deliver(0, rollout_id=0)
    ledger.deliver(1, rollout_id=0)
    ledger.drop(2)
    ledger.deliver(3, rollout_id=1)
    ledger.check(worker_in_flight=2)  # 4 and 5 are still generating
    assert ledger.in_flight() == 5 and ledger.undelivered() == 2 and ledger.dropped == 1
    ledger.close_rollout(0)
    assert ledger.trained == 2
    ledger.check(worker_in_flight=2)
    # a save now must regenerate rollout 1's group and the two generating ones
    assert ledger.pending_payloads() == [{"prompt": 3}, {"prompt": 4}, {"prompt": 5}]
    m = ledger.metrics()
    assert (
        m["rollout/accounting/consumed_groups"],
        m["rollout/accounting/trained_groups"],
        m["rollout/accounting/dropped_groups"],
        m["rollout/accounting/in_flight_groups"],
    ) == (6, 2, 1, 3)


def test_ledger_check_catches_a_lost_group_and_double_use():
    ledger = GroupLedger()
    ledger.consume(0, None)
    ledger.consume(1, None)
    with pytest.raises(RuntimeError, match="holds 1 groups, the ledger 2"):
        ledger.check(worker_in_flight=1)  # the worker lost one (e.g. a crashed task)
    with pytest.raises(ValueError, match="consumed twice"):
        ledger.consume(0, None)
    ledger.deliver(0, 0)
    with pytest.raises(ValueError, match="delivered twice"):
        ledger.deliver(0, 1)
    with pytest.raises(ValueError, match="never consumed"):
        ledger.drop(7)


@pytest.mark.parametrize(
    "extra, needed",
    [
        ([], False),
        (["--behavior-logprobs", "recompute"], True),
        (["--use-routing-replay"], True),
        (["--use-routing-replay", "--use-rollout-routing-replay"], False),
        (["--use-tis"], True),
        (["--use-tis", "--tis-clip", "2", "--behavior-logprobs", "recompute"], True),
    ],
)
def test_old_logprob_forward_only_where_needed(extra, needed):
    out = driver_argv(BASE + extra)
    assert ("--use-rollout-logprobs" in out) == (not needed)
    # --use-tis makes the recompute (pi_old) the loss's ratio base
    behavior = "recompute" if "recompute" in extra or "--use-tis" in extra else "rollout"
    assert (
        needs_old_logprob_forward(behavior, "--use-routing-replay" in extra, "--use-rollout-routing-replay" in extra)
        == needed
    )


def test_driver_sets_the_streaming_data_source_and_rejects_another():
    out = driver_argv(BASE)
    assert out[out.index("--data-source-path") + 1] == DATA_SOURCE_PATH
    assert driver_argv(BASE + ["--data-source-path", DATA_SOURCE_PATH]).count("--data-source-path") == 1
    with pytest.raises(ProjectFlagError, match="--data-source-path"):
        driver_argv(BASE + ["--data-source-path", "slime.rollout.data_source.RolloutDataSourceWithBuffer"])
    other = ["--rollout-function-path", "slime.rollout.sglang_rollout.generate_rollout"]
    assert "--data-source-path" not in driver_argv(BASE[:4] + other + BASE[6:])


def test_driver_rss_metric_grows_with_an_allocation():
    def rss() -> float:
        return log_driver_metrics(SimpleNamespace(), 0)["perf/driver_rss_mb"]

    before = rss()
    block = bytearray(64 * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    assert rss() - before > 48
    del block


# ---- the streaming data source's save / load (resume), with slime's data-source state stood in


class _InnerSource:
    """slime's RolloutDataSourceWithBuffer as StreamingDataSource uses it: numbered prompts, and
    save / load of its offset at slime's path (rollout/global_dataset_state_dict_{id}.pt)."""

    def __init__(self, args):
        self.args, self.offset = args, 0

    def get_samples(self, n):
        from types import SimpleNamespace

        out = [[SimpleNamespace(group_index=i, prompt=f"p{i}")] for i in range(self.offset, self.offset + n)]
        self.offset += n
        return out

    def save(self, rollout_id):
        import os

        import torch

        path = os.path.join(self.args.save, f"rollout/global_dataset_state_dict_{rollout_id}.pt")
        torch.save({"offset": self.offset}, path)

    def load(self, rollout_id=None):
        import os

        import torch

        if self.args.load is None or rollout_id is None or rollout_id < 0:
            return
        self.offset = torch.load(os.path.join(self.args.load, f"rollout/global_dataset_state_dict_{rollout_id}.pt"))[
            "offset"
        ]


def _source(tmp_path, load=None):
    import threading
    from collections import deque
    from types import SimpleNamespace

    from epic_slime.slime.rollout import StreamingDataSource

    args = SimpleNamespace(save=str(tmp_path), load=load, rollout_global_dataset=True)
    source = object.__new__(StreamingDataSource)  # __init__ builds slime's real data source
    source.args, source.inner, source.ledger = args, _InnerSource(args), GroupLedger()
    source._lock, source._restored, source._returned = threading.Lock(), deque(), deque()
    return source


def _model_saved(tmp_path, *rollout_ids):
    """The driver's marker that the model checkpoint of these rollouts is on disk whole."""
    from epic_slime.slime.stream.checkpoint_marks import mark_model_complete

    for rollout_id in rollout_ids:
        mark_model_complete(str(tmp_path), rollout_id)


def test_resume_hands_out_the_saved_untrained_prompts_first_and_saves_them_again(tmp_path):
    first = _source(tmp_path)
    for group in first.get_samples(3):  # 0, 1, 2 consumed; 0 trained in rollout 0
        first.ledger.deliver(group[0].group_index, 0 if group[0].group_index == 0 else 1)
    first.save(0)
    _model_saved(tmp_path, 0)
    resumed = _source(tmp_path, load=str(tmp_path))
    resumed.load(0)
    # saved again before any restored prompt was handed out: they must all still be there
    resumed.save(0)
    again = _source(tmp_path, load=str(tmp_path))
    again.load(0)
    assert [g[0].group_index for g in again.get_samples(4)] == [1, 2, 3, 4]


def test_resume_without_its_data_state_is_refused_naming_the_last_consistent_save(tmp_path):
    import os

    source = _source(tmp_path)
    source.get_samples(2)
    source.save(1)
    source.save(3)
    _model_saved(tmp_path, 1, 3)
    os.remove(tmp_path / "rollout" / "global_dataset_state_dict_3.pt")  # killed between the two writes
    with pytest.raises(
        RuntimeError, match=r"rollout-3 checkpoint: its data state .* missing.*last consistent save is rollout 1"
    ):
        _source(tmp_path, load=str(tmp_path)).load(3)
    with pytest.raises(RuntimeError, match="No earlier rollout .* has a complete data state"):
        _source(tmp_path, load=str(tmp_path / "elsewhere")).load(0)
    _source(tmp_path, load=str(tmp_path)).load(-1)  # a fresh start loads nothing and needs nothing


def test_the_pending_groups_are_written_before_slimes_data_state(tmp_path, monkeypatch):
    """slime's state file marks a complete data save: if writing the pending groups fails, it must not exist."""
    import torch

    source = _source(tmp_path)
    source.get_samples(2)

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", fail)
    with pytest.raises(OSError):
        source.save(0)
    assert not (tmp_path / "rollout" / "global_dataset_state_dict_0.pt").exists()


def test_the_refusal_skips_an_older_save_whose_model_write_was_also_cut_short(tmp_path):
    """Saves of rollouts 1 (whole), 2 and 3 (model writes cut short, as by two kills under
    --async-save): resuming from 3 is refused and names 1, never the torn 2."""
    source = _source(tmp_path)
    source.get_samples(2)
    for rollout_id in (1, 2, 3):
        source.save(rollout_id)
    _model_saved(tmp_path, 1)
    with pytest.raises(RuntimeError, match=r"not marked complete.*last consistent save is rollout 1: resume from it"):
        _source(tmp_path, load=str(tmp_path)).load(3)


# mutant: resume_hint_names_the_oldest_save
def test_the_resume_hint_names_the_newest_consistent_of_several_saves(tmp_path):
    """Issue 46 pattern 5: with more than one good save, the hint a dead engine's error carries
    (``engine_faults.resume_hint``) names the newest consistent one, and the one before it once the
    newest's model write is torn."""
    from epic_slime.slime.stream.checkpoint_marks import MODEL_DONE_FILE
    from epic_slime.slime.stream.engine_faults import resume_hint

    source = _source(tmp_path)
    source.get_samples(3)
    for rollout_id in (1, 3, 5):
        source.save(rollout_id)
    _model_saved(tmp_path, 1, 3, 5)
    args = SimpleNamespace(save=str(tmp_path))
    assert "last consistent save is rollout 5: resume from it with --ckpt-step 5" in resume_hint(args)
    (tmp_path / MODEL_DONE_FILE.format(rollout_id=5)).unlink()  # its model write cut short
    assert "last consistent save is rollout 3: resume from it with --ckpt-step 3" in resume_hint(args)
