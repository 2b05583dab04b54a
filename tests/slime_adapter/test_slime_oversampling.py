"""The paper's oversampling ratio and learning-rate warmup on the slime path (paper Table 2)."""

from __future__ import annotations

import asyncio
import os
import sys
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest

from epic_slime.slime.cli.command_line import translate_argv
from epic_slime.slime.cli.dry_run import check_argv
from epic_slime.slime.cli.flags import ProjectFlagError
from epic_slime.slime.cli.oversampling import OversamplingError, groups_in_flight, oversampled_count

# slime's source: SLIME_PATH, else the vendored snapshot next to the repository (CI has one of them)
_SLIME = os.environ.get("SLIME_PATH") or str(
    Path(__file__).resolve().parents[3] / "shared" / "vendor" / "slime-624b824a"
)
if os.path.isdir(_SLIME) and _SLIME not in sys.path:
    sys.path.append(_SLIME)

BASE = [
    "--loss-type",
    "custom_loss",
    "--custom-loss-function-path",
    "epic_slime.slime.loss.policy_loss",
    "--rollout-batch-size",
    "64",
    "--n-samples-per-prompt",
    "8",
]


def _smallest_sufficient(target: int, ratio_text: str) -> int:
    """Reference: count up until m (1 - r) >= target, in exact rational arithmetic."""
    keep = 1 - Fraction(ratio_text)
    m = target
    while m * keep < target:
        m += 1
    return m


@pytest.mark.parametrize("ratio_text", ["0", "0.05", "0.1", "0.25", "0.5", "0.9", "0.125"])
def test_oversampled_count_is_the_smallest_sufficient_count(ratio_text):
    for target in list(range(1, 130)) + [512, 1000, 4096]:
        assert oversampled_count(target, float(ratio_text)) == _smallest_sufficient(target, ratio_text), target


def test_the_authors_numbers_at_the_paper_scale():
    # the fork: 512 sample requests at rate 0.1 -> ceil(512 / 0.9) = 569 started, 57 extra
    assert oversampled_count(512, 0.1) == 569
    assert groups_in_flight(64, 0.1) == 72 and groups_in_flight(64, 0.0) == 64
    assert oversampled_count(9, 0.1) == 10  # float ceil(9 / 0.9) would give 11


@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5, "0.1", True, float("nan")])
def test_bad_ratios_are_named(ratio):
    with pytest.raises(OversamplingError, match="--oversample-ratio must be"):
        oversampled_count(64, ratio)


def test_ratio_and_explicit_groups_in_flight_conflict():
    assert groups_in_flight(64, 0.0, explicit=10) == 10
    with pytest.raises(OversamplingError, match="sets the groups in flight to 72; drop --async-groups-in-flight 10"):
        groups_in_flight(64, 0.1, explicit=10)


def test_driver_turns_the_ratio_into_groups_in_flight():
    out = translate_argv(BASE + ["--oversample-ratio", "0.1"])
    assert out[-2:] == ["--async-groups-in-flight", "72"]
    assert "--async-groups-in-flight" not in translate_argv(BASE + ["--oversample-ratio", "0"])
    config, args, _ = check_argv(BASE + ["--oversample-ratio", "0.1"])
    assert config.oversample_ratio == 0.1 and args.async_groups_in_flight == 72
    with pytest.raises(ProjectFlagError, match="drop --async-groups-in-flight 100"):
        check_argv(BASE + ["--oversample-ratio", "0.1", "--async-groups-in-flight", "100"])
    with pytest.raises(ProjectFlagError, match="--oversample-ratio must be in \\[0, 1\\), got 1.0"):
        check_argv(BASE + ["--oversample-ratio", "1.0"])


def test_a_cap_above_one_batch_is_accepted_at_max_staleness_1():
    """Before the admission budget, K = 1 with more than a batch in flight was refused (leftovers
    reached lag 2); now the budget ((g + 1) * B live) never starts such a group, so the cap is inert."""
    base = BASE + ["--rollout-function-path", "epic_slime.slime.rollout.generate_rollout"]
    check_argv(base + ["--async-groups-in-flight", "65", "--max-staleness", "1"])
    # the paper's ratio (Table 2 rows set it) is not applied at K = 1, as at K = 0
    assert "--async-groups-in-flight" not in translate_argv(
        base + ["--oversample-ratio", "0.1", "--max-staleness", "1"]
    )
    assert translate_argv(base + ["--oversample-ratio", "0.1", "--max-staleness", "2"])[-2:] == [
        "--async-groups-in-flight",
        "72",
    ]
    for ok in (
        ["--max-staleness", "1"],
        ["--max-staleness", "1", "--async-groups-in-flight", "64"],
        ["--oversample-ratio", "0.1", "--max-staleness", "1"],
        ["--oversample-ratio", "0.1", "--max-staleness", "2"],
    ):
        check_argv(base + ok)


def test_warmup_in_rollouts_becomes_megatron_iterations():
    out = translate_argv(BASE + ["--update-depth", "8", "--lr-warmup-rollouts", "10"])
    assert out[-2:] == ["--lr-warmup-iters", "80"]  # 10 rollouts x 8 optimizer steps
    assert translate_argv(BASE + ["--num-steps-per-rollout", "4", "--lr-warmup-rollouts", "10"])[-2:] == [
        "--lr-warmup-iters",
        "40",
    ]
    assert "--lr-warmup-iters" not in translate_argv(BASE)
    with pytest.raises(ProjectFlagError, match="both set the warmup"):
        translate_argv(BASE + ["--lr-warmup-rollouts", "10", "--lr-warmup-iters", "5"])
    with pytest.raises(ProjectFlagError, match="--lr-warmup-rollouts must be >= 0, got -1"):
        translate_argv(BASE + ["--lr-warmup-rollouts", "-1"])


def test_the_oversampling_ratio_caps_the_groups_the_stream_holds(monkeypatch):
    """The project's GroupStream (what the driver runs) with the cap the driver derives from the
    ratio: 72 groups held at most for a batch of 64 (the K = 2 budget alone would allow 192). Batches
    are taken in start order (the admission budget's FIFO), so the batch is groups 0-63 and waits
    for its slow ones (the ratio no longer drops the slowest); taking it frees 64 places at once."""
    sglang_rollout = pytest.importorskip("slime.rollout.sglang_rollout", reason="slime is not importable (SLIME_PATH)")
    from slime.utils.async_utils import run
    from slime.utils.types import Sample

    import epic_slime.slime.rollout as rollout
    from epic_slime.slime.stream.gate import StalenessGate
    from epic_slime.slime.stream.ledger import GroupLedger

    release = asyncio.Event()
    running = {"now": 0, "max": 0, "started": 0}

    async def fake_generate_and_rm_group(args, group, sampling_params, evaluation=False):
        running["now"] += 1  # one event loop: no lock needed
        running["started"] += 1
        running["max"] = max(running["max"], running["now"])
        await asyncio.sleep(0.001)
        if group[0].group_index % 9 == 8:  # every ninth group is slow
            await release.wait()
        for sample in group:
            sample.status, sample.weight_versions = Sample.Status.COMPLETED, ["1"]
        running["now"] -= 1
        return group

    class DataSource:  # StreamingDataSource's interface for the stream: numbered prompts, a ledger
        def __init__(self):
            self.next, self.ledger = 0, GroupLedger()

        def handed_back(self):  # nothing is given back through add_samples here
            return 0

        def get_samples(self, n):
            groups = [[Sample(index=i, group_index=i)] for i in range(self.next, self.next + n)]
            for g in groups:
                self.ledger.consume(g[0].group_index, g)
            self.next += n
            return groups

    monkeypatch.setattr(sglang_rollout, "generate_and_rm_group", fake_generate_and_rm_group)
    monkeypatch.setattr(sglang_rollout, "GenerateState", lambda args: SimpleNamespace(sampling_params={}))
    monkeypatch.setattr(rollout, "_stream", None)
    config, parsed, _ = check_argv(BASE + ["--oversample-ratio", "0.1"])
    args = SimpleNamespace(
        rollout_batch_size=64,
        n_samples_per_prompt=1,
        max_staleness=2,
        async_groups_in_flight=parsed.async_groups_in_flight,
    )
    data_source = DataSource()
    stream = rollout._get_stream(args, data_source)
    try:
        gate = StalenessGate(2, "drop")
        assert stream.cap == 72
        # the slow ones finish later: the batch waits for them
        stream.loop.call_soon_threadsafe(lambda: stream.loop.call_later(0.3, release.set))
        batch, _, held = run(
            asyncio.wait_for(rollout._collect(args, stream, trainer_version=1, gate=gate, rollout_id=0), 20)
        )
        assert [g[0].group_index for g in batch] == list(range(64)) and running["max"] <= 72
        assert held == 72 and running["started"] == 72 + 64  # 8 left + 64 started when the batch was taken
        batch, _, held = run(
            asyncio.wait_for(rollout._collect(args, stream, trainer_version=2, gate=gate, rollout_id=1), 20)
        )
        # the engines still hold version 1: the budget ((1 + 2) * 64 = 192 started) binds before the cap
        assert [g[0].group_index for g in batch] == list(range(64, 128)) and held == 64
        assert running["started"] == 192 and stream.budget.live == 192
        assert gate.dropped_groups == gate.requeued_groups == 0
    finally:
        stream.loop.call_soon_threadsafe(release.set)
