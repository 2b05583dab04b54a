"""Staleness accounting of the streaming rollout function, on fake samples (no slime)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from epic_slime.slime.stream.gate import (
    StalenessGate,
    collect_admitted_groups,
    group_staleness,
    parse_weight_version,
    sample_version,
    trainer_version_for_rollout,
)


def _group(index, *versions):
    return [SimpleNamespace(index=index * 10 + i, weight_versions=list(v), metadata={}) for i, v in enumerate(versions)]


def test_versions_and_staleness():
    assert trainer_version_for_rollout(0) == 1
    assert trainer_version_for_rollout(7, start_rollout_id=5) == 3
    assert parse_weight_version("12") == 12 and parse_weight_version("default") == 0
    assert sample_version(["3", "4"]) == 3  # generated across an update: the oldest counts
    assert group_staleness([3, 5], trainer_version=6) == 3
    with pytest.raises(ValueError, match="weight_versions is empty"):
        sample_version([], sample_index=7)
    with pytest.raises(ValueError, match="not an integer"):
        parse_weight_version("v2")
    with pytest.raises(ValueError, match="newer than the training policy"):
        group_staleness([4], trainer_version=3)


def test_gate_drop_and_keep_are_counted():
    drop = StalenessGate(max_staleness=1, stale_policy="drop")
    assert drop.admit(0, 8) and drop.admit(1, 8) and not drop.admit(2, 8)
    m = drop.metrics()
    assert (m["staleness/dropped_groups"], m["staleness/dropped_samples"]) == (1.0, 8.0)
    assert m["staleness/mean"] == 0.5 and m["staleness/max"] == 1.0 and m["staleness/frac_on_policy"] == 0.5
    keep = StalenessGate(max_staleness=1, stale_policy="keep")
    assert keep.admit(3, 8)
    m = keep.metrics()
    assert m["staleness/kept_over_limit_groups"] == 1.0 and m["staleness/dropped_groups"] == 0.0
    assert m["staleness/groups_at_3"] == 1.0
    with pytest.raises(ValueError, match="stale_policy"):
        StalenessGate(1, "maybe")


def test_collect_streams_until_target_and_annotates():
    # queue: group 0 at version 1 (stale by 2 at trainer version 3), then fresh groups
    queue = [_group(0, ["1"], ["1"]), _group(1, ["2"], ["2", "3"]), _group(2, ["3"], ["3"]), _group(3, ["3"], ["3"])]
    calls = []

    def pop(limit):
        calls.append(limit)
        out, queue[:] = queue[:1], queue[1:]  # one finished group at a time, like a slow generator
        return out

    gate = StalenessGate(max_staleness=1, stale_policy="drop")
    groups = asyncio.run(collect_admitted_groups(pop, trainer_version=3, gate=gate, target=2, poll_seconds=0))
    assert [g[0].index for g in groups] == [10, 20]
    assert gate.dropped_groups == 1 and gate.dropped_samples == 2
    assert groups[0][1].metadata == {"epic_policy_version": 2, "epic_trainer_version": 3, "epic_group_staleness": 1}
    assert len(queue) == 1 and calls[0] == 2  # the last group stays queued for the next batch


def test_collect_times_out_with_a_reason():
    gate = StalenessGate(max_staleness=0)
    with pytest.raises(TimeoutError, match="0/1 groups"):
        asyncio.run(collect_admitted_groups(lambda n: [], 1, gate, target=1, poll_seconds=0.001, max_wait_seconds=0.01))


# ---- the gate at its limits, from the mutation runs of issue 21 (each test names the mutants of
# tests/mutation/mutants.yaml it was written for)
# survived the issue 21 mutation run (a bug with no entry in tests/mutation/mutants.yaml)
def test_staleness_min_is_the_smallest_admitted_lag():
    gate = StalenessGate(max_staleness=3, stale_policy="drop")
    for lag in (2, 3, 1, 2):
        assert gate.admit(lag, 4)
    m = gate.metrics()
    assert m["staleness/min"] == 1.0 and m["staleness/max"] == 3.0 and m["staleness/mean"] == 2.0
    assert not gate.admit(4, 4) and gate.metrics()["staleness/min"] == 1.0  # a dropped group is not a lag


# mutants: over_limit_unbounded, over_limit_inclusive
def test_no_staleness_bound_admits_every_lag():
    """max_staleness None (no --max-staleness) is unbounded: nothing is over the limit or dropped."""
    from collections import deque

    from epic_slime.runtime.batches import Group, select_batch
    from epic_slime.staleness import over_limit

    assert not over_limit(10**6, None) and over_limit(3, 2) and not over_limit(2, 2)
    gate = StalenessGate(max_staleness=None, stale_policy="drop")
    assert all(gate.admit(lag, 4) for lag in (0, 5, 50))
    assert gate.dropped_groups == 0 and gate.kept_over_limit_groups == 0 and gate.metrics()["staleness/max"] == 50.0
    buffer = deque(Group(group_id=i, version=v, samples=[{}, {}]) for i, v in enumerate([0, 9, 1]))
    sel = select_batch(buffer, 10, 3, None, "drop")
    assert [g.group_id for g in sel.batch] == [0, 1, 2] and sel.dropped == [] and sel.stale_kept == 0


# mutant: select_groups_one_extra
def test_select_groups_admits_at_most_target_and_leaves_the_rest_unexamined():
    from epic_slime.slime.stream.gate import select_groups

    groups = [[object()] * 2 for _ in range(5)]
    versions = [[3, 3], [1, 1], [3, 2], [3, 3], [2, 3]]  # lags at trainer version 3: 0, 2, 1, 0, 1
    gate = StalenessGate(max_staleness=1, stale_policy="drop")
    chosen, lags = select_groups(groups, versions, 3, gate, target=2)
    assert (chosen, lags) == ([0, 2], [0, 1])
    assert gate.admitted_groups == 2 and gate.dropped_groups == 1  # group 1 dropped; 3 and 4 not examined
    assert select_groups(groups, versions, 3, StalenessGate(max_staleness=1), target=3)[0] == [0, 2, 3]
