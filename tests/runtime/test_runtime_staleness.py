"""Staleness selection and sample accounting (pure Python), and the runtime driver's use of them
(trainable count, top-up, checkpoint and resume) with stand-ins for the trainer and workers."""

import dataclasses
from collections import Counter, deque
from pathlib import Path

import pytest

from epic_slime.runtime.batches import Accounting, Group, select_batch


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
    assert sel.dropped == [] and sel.stale_kept == 6  # groups 0 and 2: lag 5 and 4 > K, 3 samples each


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


def test_accounting_round_trip_keeps_every_counter():
    """Every field non-zero and distinct, so a counter left out of state() / from_state() shows."""
    acc = Accounting(generated=20, trained=11, dropped=3, stale_kept=2, lost=5, worker_restarts=1)
    acc.lag_hist.update({0: 6, 1: 4, 3: 1})
    back = Accounting.from_state(acc.state())
    assert dataclasses.asdict(back) == dataclasses.asdict(acc)
    assert (back.lost, back.worker_restarts, back.stale_kept) == (5, 1, 2)
    assert back.lag_hist == Counter({0: 6, 1: 4, 3: 1})
    back.check(buffered=6)


# ---- the runtime driver's use of the rules (no Ray: the trainer and workers are stand-ins) ----


def _run(tmp_path, *flags, name="run"):
    from support.runtime_helpers import tiny_config

    from epic_slime.runtime.driver import Run

    return Run(tiny_config(tmp_path, *flags, name=name))


@pytest.mark.parametrize("k,policy,expected", [(0, "drop", 2), (1, "drop", 3), (2, "drop", 4), (0, "keep", 4)])
def test_trainable_groups_counts_the_groups_select_batch_would_train(tmp_path, k, policy, expected):
    run = _run(tmp_path, "--max-staleness", str(k), "--stale-policy", policy)
    run.pool.version = 3
    run.pool.buffer = _groups([3, 2, 3, 1])  # lags 0, 1, 0, 2
    assert run.pool.trainable_groups() == expected
    sel = select_batch(deque(run.pool.buffer), 3, expected, k, policy)
    assert sel.batch is not None and len(sel.batch) == expected  # exactly that many are trainable


def test_top_up_with_k0_stops_once_a_fresh_batch_is_buffered(tmp_path):
    """--max-staleness 0: groups of the current version count as trainable (else a save hangs)."""
    run = _run(tmp_path, "--max-staleness", "0")
    run.pool.version = 2
    run.pool.buffer = _groups([1, 1, 1, 1])  # a full batch, all one step stale
    run.pool.workers = [None, None]
    rounds = []

    def submit(i):
        run.pool.buffer.append(Group(group_id=100 + len(run.pool.buffer), version=run.pool.version, samples=[{}, {}]))

    def drain():
        rounds.append(1)
        if len(rounds) > 5:
            raise AssertionError("_top_up does not stop: fresh groups are not counted as trainable")

    run.pool.submit, run.pool.drain = submit, drain
    run.pool.top_up()
    assert len(rounds) == 2 and run.pool.trainable_groups() == 4  # 2 workers x 2 rounds = 4 fresh groups


class _StubTrainer:
    """What _checkpoint / _restore call on the trainer actor (``.remote`` returns the value)."""

    def __init__(self, version):
        outer = self

        class _Method:
            def __init__(self, fn):
                self.remote = fn

        self.version = version
        self.save_state = _Method(lambda path: Path(path).write_text("trainer"))
        self.load_state = _Method(lambda path: outer.version)


def test_checkpoint_and_restore_bring_back_every_driver_field(tmp_path, monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", lambda ref: ref)
    run = _run(tmp_path, "--max-staleness", "1", name="a")
    run.out.mkdir(parents=True)
    run.trainer = _StubTrainer(3)
    run.step, run.pool.version, run.pool.next_group_id = 3, 3, 17
    run.pool.buffer = _groups([2, 3], n=4)
    run.pool.acc = Accounting(generated=60, trained=40, dropped=12, stale_kept=4, lost=8, worker_restarts=2)
    run.pool.acc.lag_hist.update({0: 24, 1: 16})
    run.pool.trained_group_ids, run.pool.dropped_group_ids, run.killed_once = list(range(10)), [10, 12, 14], True
    path = run._checkpoint(top_up=False)

    resumed = _run(tmp_path, "--max-staleness", "1", "--load", str(path.parent), name="b")
    resumed.trainer = _StubTrainer(3)
    assert resumed._check_resume() == path
    resumed._restore(path)
    assert (resumed.step, resumed.version, resumed.pool.next_group_id) == (3, 3, 17)
    assert [(g.group_id, g.version, len(g)) for g in resumed.pool.buffer] == [(0, 2, 4), (1, 3, 4)]
    assert dataclasses.asdict(resumed.pool.acc) == dataclasses.asdict(run.pool.acc)
    assert resumed.pool.trained_group_ids == list(range(10)) and resumed.pool.dropped_group_ids == [10, 12, 14]
    assert resumed.killed_once is True
    # the data continues where it stopped: the next request is prompt 17, not prompt 0 again
    assert [gid for gid, _ in resumed.pool.next_requests()] == [17, 18]
    resumed.pool.acc.check(resumed.pool.buffered_samples())

    wrong = _run(tmp_path, "--max-staleness", "1", "--load", str(path.parent), name="c")
    wrong.trainer = _StubTrainer(2)  # a trainer checkpoint of another step
    wrong._check_resume()
    with pytest.raises(RuntimeError, match="trainer version 2 != driver version 3"):
        wrong._restore(path)


def test_batches_are_taken_in_start_order_and_wait_for_the_oldest_group():
    """Start order = group_id; a group still generating (first_unfinished) holds the batch."""
    buf = deque(Group(group_id=i, version=0, samples=[{}]) for i in (3, 0, 4, 1))  # finished out of order
    sel = select_batch(buf, current_version=1, n_groups=2, max_staleness=2, stale_policy="drop", first_unfinished=2)
    assert [g.group_id for g in sel.batch] == [0, 1] and [g.group_id for g in buf] == [3, 4]
    # group 2 still generating: 3 and 4 cannot form a batch without it
    sel = select_batch(buf, current_version=1, n_groups=2, max_staleness=2, stale_policy="drop", first_unfinished=2)
    assert sel.batch is None and [g.group_id for g in buf] == [3, 4]


def test_runtime_admission_follows_the_budget_in_its_own_versions(tmp_path):
    """The runtime's versions are slime's minus one: at version g, live groups < (g + K + 1) B; the
    last request before the limit is cut to the room left; lost and dropped groups free their room."""
    run = _run(tmp_path, "--max-staleness", "1")
    b, ppr = run.cfg.rollout_batch_size, run.pool.prompts_per_request
    run.pool.worker_versions = [0, 0]
    run.pool.budget.restore(2 * b - 1)
    assert run.pool.room(0) == 1  # (0 + 1 + 1) * B = 2B: one group left
    run.pool.budget.restore(2 * b)
    assert run.pool.room(0) == 0
    run.pool.version, run.pool.worker_versions = 1, [-1, -1]  # the worker gets version 1 with its next request
    assert run.pool.room(0) == min(ppr, b)
    assert b == 4 and ppr == 2
    run.pool.budget.restore(4 * b - 1)  # at version 1 the limit is 3B: over it, no room
    assert run.pool.room(0) == 0
    run.pool.version = 3
    run.pool.budget.restore(10)
    run.pool.buffer = _groups([0, 0, 3], n=run.cfg.n_samples_per_prompt)  # two groups 3 versions old (> K)
    run.pool.pending = {}
    sel = run._take_batch()
    assert sel.batch is None and len(sel.dropped) == 2 and run.pool.budget.live == 8


def _room_states(max_staleness: int, tmp_path):
    """(cap's room, budget-and-cap room) of worker 0 over the reachable states of the default config:
    version 5, a batch training or not, 0..2B groups buffered, 0..2B requested (what the cap admits);
    live = trained + training + buffered + pending (nothing dropped)."""
    from epic_slime.runtime.config import parse_config
    from epic_slime.runtime.driver import Run

    repo = Path(__file__).resolve().parents[2]
    cfg = parse_config(
        [
            "--config",
            str(repo / "configs" / "local" / "default.yaml"),
            "--output-dir",
            str(tmp_path),
            "--max-staleness",
            str(max_staleness),
        ]
    )
    run, batch, n = Run(cfg), cfg.rollout_batch_size, cfg.n_samples_per_prompt
    request, cap = run.pool.prompts_per_request, cfg.rollout_buffer_batches * batch
    run.pool.version, run.pool.worker_versions = 5, [5] * cfg.num_rollout_workers
    for training in (0, batch):
        for buffered in range(0, cap + 1, 8):
            for pending in range(0, cap - buffered + 1, 8):
                run.pool.buffer = deque(Group(g, 5, [{}] * n) for g in range(buffered))
                run.pool.pending = {object(): (1, [(g, None) for g in range(pending)], 5)} if pending else {}
                run.pool.budget.restore(5 * batch + training + buffered + pending)
                yield (request if buffered + pending + request <= cap else 0), run.pool.room(0)


def test_at_the_default_k_the_admission_budget_never_holds_back_a_request_the_memory_cap_admits(tmp_path):
    """Issue 34: does the budget stall the rollout workers? At the default config (K = 2, B = 64, two
    workers of 32 prompts, a cap of 2 batches) the budget's room, (g + K + 1) B - live = 3B - (training +
    buffered + pending), is never below the cap's, 2B - (buffered + pending): every request the runtime
    made before the budget it still makes. At K = 1 the budget does bind (the staleness rule itself)."""
    states = list(_room_states(2, tmp_path / "k2"))
    assert len(states) > 100 and all(budget == cap for cap, budget in states)
    tighter = [(cap, budget) for cap, budget in _room_states(1, tmp_path / "k1") if budget < cap]
    assert tighter  # the test can tell: at K = 1 some admitted request is cut or held
