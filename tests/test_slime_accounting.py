"""Prompt accounting (GroupLedger), the driver's slime flag additions (old-log-prob forward,
data source) and the driver's RSS metric; no slime needed."""

from __future__ import annotations

import pytest

from epic_slime.slime.flags import ProjectFlagError
from epic_slime.slime.train import DATA_SOURCE_PATH, driver_argv, driver_rss_mb, needs_old_logprob_forward
from epic_slime.staleness import GroupLedger

BASE = [
    "--loss-type", "custom_loss",
    "--custom-loss-function-path", "epic_slime.slime.loss.policy_loss",
    "--rollout-function-path", "epic_slime.slime.rollout.generate_rollout",
    "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
]


def test_ledger_follows_every_group_to_trained_dropped_or_in_flight():
    ledger = GroupLedger()
    for key in range(6):
        ledger.consume(key, {"prompt": key})
    ledger.deliver(0, rollout_id=0)
    ledger.deliver(1, rollout_id=0)
    ledger.drop(2)
    ledger.deliver(3, rollout_id=1)
    ledger.check(worker_in_flight=2)            # 4 and 5 are still generating
    assert ledger.in_flight() == 5 and ledger.undelivered() == 2 and ledger.dropped == 1
    ledger.close_rollout(0)
    assert ledger.trained == 2
    ledger.check(worker_in_flight=2)
    # a save now must regenerate rollout 1's group and the two generating ones
    assert ledger.pending_payloads() == [{"prompt": 3}, {"prompt": 4}, {"prompt": 5}]
    m = ledger.metrics()
    assert (m["rollout/accounting/consumed_groups"], m["rollout/accounting/trained_groups"],
            m["rollout/accounting/dropped_groups"], m["rollout/accounting/in_flight_groups"]) == (6, 2, 1, 3)


def test_ledger_check_catches_a_lost_group_and_double_use():
    ledger = GroupLedger()
    ledger.consume(0, None)
    ledger.consume(1, None)
    with pytest.raises(RuntimeError, match="holds 1 groups, the ledger 2"):
        ledger.check(worker_in_flight=1)        # the worker lost one (e.g. a crashed task)
    with pytest.raises(ValueError, match="consumed twice"):
        ledger.consume(0, None)
    ledger.deliver(0, 0)
    with pytest.raises(ValueError, match="delivered twice"):
        ledger.deliver(0, 1)
    with pytest.raises(ValueError, match="never consumed"):
        ledger.drop(7)


@pytest.mark.parametrize(
    "extra, needed",
    [([], False), (["--behavior-logprobs", "recompute"], True), (["--use-routing-replay"], True),
     (["--use-routing-replay", "--use-rollout-routing-replay"], False)],
)
def test_old_logprob_forward_only_where_needed(extra, needed):
    out = driver_argv(BASE + extra)
    assert ("--use-rollout-logprobs" in out) == (not needed)
    behavior = "recompute" if "recompute" in extra else "rollout"
    assert needs_old_logprob_forward(behavior, "--use-routing-replay" in extra,
                                     "--use-rollout-routing-replay" in extra) == needed


def test_driver_sets_the_streaming_data_source_and_rejects_another():
    out = driver_argv(BASE)
    assert out[out.index("--data-source-path") + 1] == DATA_SOURCE_PATH
    assert driver_argv(BASE + ["--data-source-path", DATA_SOURCE_PATH]).count("--data-source-path") == 1
    with pytest.raises(ProjectFlagError, match="--data-source-path"):
        driver_argv(BASE + ["--data-source-path", "slime.rollout.data_source.RolloutDataSourceWithBuffer"])
    other = ["--rollout-function-path", "slime.rollout.sglang_rollout.generate_rollout"]
    assert "--data-source-path" not in driver_argv(BASE[:4] + other + BASE[6:])


def test_driver_rss_grows_with_an_allocation():
    before = driver_rss_mb()
    block = bytearray(64 * 2**20)
    block[:: 4096] = b"x" * len(block[:: 4096])   # touch every page
    assert driver_rss_mb() - before > 48
    del block
