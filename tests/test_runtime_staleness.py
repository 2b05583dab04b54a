"""Staleness selection and sample accounting (pure Python)."""

from collections import deque

import pytest

from epic_slime.runtime.staleness import Accounting, Group, select_batch


def _groups(versions, n=2):
    return deque(Group(group_id=i, version=v, samples=[{"i": j} for j in range(n)]) for i, v in enumerate(versions))


def test_fifo_batch_when_everything_is_fresh():
    buf = _groups([0, 0, 1, 1, 1])
    sel = select_batch(buf, current_version=1, n_groups=3, max_staleness=1, stale_policy="drop")
    assert [g.group_id for g in sel.batch] == [0, 1, 2]
    assert sel.dropped == [] and sel.stale_kept == 0
    assert [g.group_id for g in buf] == [3, 4]


def test_drop_policy_removes_groups_older_than_k_and_never_trains_them():
    buf = _groups([0, 3, 1, 4, 5, 5])
    sel = select_batch(buf, current_version=5, n_groups=3, max_staleness=2, stale_policy="drop")
    assert [g.group_id for g in sel.batch] == [1, 3, 4]
    assert [g.group_id for g in sel.dropped] == [0, 2]
    assert all(5 - g.version <= 2 for g in sel.batch)
    assert [g.group_id for g in buf] == [5]


def test_keep_policy_trains_stale_groups_and_counts_them():
    buf = _groups([0, 3, 1, 5], n=3)
    sel = select_batch(buf, current_version=5, n_groups=3, max_staleness=2, stale_policy="keep")
    assert [g.group_id for g in sel.batch] == [0, 1, 2]
    assert sel.dropped == [] and sel.stale_kept == 6          # groups 0 and 2: lag 5 and 4 > K, 3 samples each


def test_not_enough_fresh_groups_leaves_them_in_order_but_drops_are_final():
    buf = _groups([0, 4, 0, 5])
    sel = select_batch(buf, current_version=5, n_groups=3, max_staleness=1, stale_policy="drop")
    assert sel.batch is None
    assert [g.group_id for g in sel.dropped] == [0, 2]
    assert [g.group_id for g in buf] == [1, 3]


def test_on_policy_k0():
    buf = _groups([2, 3, 3])
    sel = select_batch(buf, current_version=3, n_groups=2, max_staleness=0, stale_policy="drop")
    assert [g.group_id for g in sel.batch] == [1, 2] and [g.group_id for g in sel.dropped] == [0]


def test_bad_inputs():
    with pytest.raises(ValueError, match="stale_policy"):
        select_batch(_groups([0]), 0, 1, 0, "ignore")
    with pytest.raises(RuntimeError, match="newer"):
        select_batch(_groups([3]), 2, 1, 0, "drop")


def test_accounting_invariant_and_round_trip():
    acc = Accounting(generated=10, trained=6, dropped=2)
    acc.lag_hist[0] += 4
    acc.lag_hist[2] += 2
    acc.check(buffered=2)
    with pytest.raises(RuntimeError, match="generated 10"):
        acc.check(buffered=1)
    back = Accounting.from_state(acc.state())
    assert back == acc
