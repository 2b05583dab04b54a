"""The embedded runtime's admission budget around a rollout worker's restart and a resume, in
seconds (issue 35 item 6: these slips were caught only by the ~2-minute end-to-end runs).

No Ray: the workers are stand-ins whose ``generate.remote`` returns a token, and ``ray.get`` of a
dead worker's token raises Ray's own ``RayActorError``, as the driver meets it. The tiny config:
B = 4 groups per batch, 2 workers x 2 prompts per request, 4 samples per prompt, K = 1, so at
version g the runtime admits live groups < (g + K + 1) * B (``AdmissionBudget``, first_train_version 0).
"""

from __future__ import annotations

from collections import deque

import pytest

from epic_slime.runtime.batches import Accounting, Group

ray = pytest.importorskip("ray")


class _Worker:
    def __init__(self, name: str):
        self.name, self.requests = name, []
        outer = self

        class _Generate:
            def remote(self, reqs, weights, version, sampling):
                outer.requests.append(([gid for gid, _ in reqs], weights is not None, version))
                return (outer.name, len(outer.requests))

        self.generate = _Generate()


def _run(tmp_path, *flags, name="run"):
    from support.runtime_helpers import tiny_config

    from epic_slime.runtime.driver import Run

    return Run(tiny_config(tmp_path, "--max-staleness", "1", *flags, name=name))


def _with_workers(run, dead: set):
    run.pool.workers = [_Worker("w0"), _Worker("w1")]
    run.pool.worker_versions = [0, 0]
    made = []

    def new_worker(i):
        made.append(i)
        return _Worker(f"w{i}-restarted{len(made)}")

    run.pool._new_worker = new_worker

    def get(ref):
        if ref in dead:
            raise ray.exceptions.RayActorError()
        return []

    return made, get


def test_a_restarted_worker_gives_back_exactly_its_lost_groups_slots(tmp_path, monkeypatch, capsys):
    run = _run(tmp_path)
    b, n = run.cfg.rollout_batch_size, run.cfg.n_samples_per_prompt
    assert (b, n, run.pool.prompts_per_request) == (4, 4, 2)
    dead: set = set()
    made, get = _with_workers(run, dead)
    monkeypatch.setattr(ray, "get", get)
    run.pool.fill()
    assert run.pool.budget.live == 4 and len(run.pool.pending) == 2
    # worker 0 dies with its request of 2 prompts (8 samples): its 2 groups leave the budget
    (fut0,) = [f for f, (i, _, _) in run.pool.pending.items() if i == 0]
    dead.add(fut0)
    run.pool.version = 1  # a step was trained meanwhile
    run.pool.collect(fut0)
    assert made == [0] and run.pool.acc.lost == 2 * n and run.pool.acc.worker_restarts == 1
    assert run.pool.budget.live == 2  # 4 started - 2 lost, not - 8 samples, not - 0
    assert "rollout worker 0 died" in capsys.readouterr().err
    # the new worker was built with the current weights: its next request carries none
    assert run.pool.worker_versions[0] == 1 and run.pool.submit_version(0) == (False, 1)
    # at version 1 the limit is (1 + 1 + 1) * 4 = 12 live groups: a full request fits again
    assert run.pool.room(0) == 2
    run.pool.fill()
    assert run.pool.budget.live == 4 and run.pool.workers[0].requests == [([4, 5], False, 1)]
    # a second death at the limit's edge: the budget binds before the memory cap
    run.pool.budget.restore(12 - 1 + 2)  # 1 slot short of the limit, plus worker 0's 2 in flight
    (fut0,) = [f for f, (i, _, _) in run.pool.pending.items() if i == 0]
    dead.add(fut0)
    run.pool.collect(fut0)
    assert run.pool.budget.live == 11 and run.pool.acc.worker_restarts == 2
    assert run.pool.room(0) == 1  # the memory cap would allow 2


def test_a_resume_counts_the_buffered_groups_against_the_budget(tmp_path, monkeypatch):
    """The live count after a resume = trained + buffered (a checkpoint is quiescent): with one slot
    left under the limit the budget binds before the memory cap."""
    monkeypatch.setattr(ray, "get", lambda ref: ref)

    class Trainer:
        class _M:
            def __init__(self, fn):
                self.remote = fn

        save_state = _M(lambda path: open(path, "w").write("trainer"))
        load_state = _M(lambda path: 3)

    run = _run(tmp_path, name="a")
    run.out.mkdir(parents=True)
    run.trainer = Trainer()
    run.step = run.pool.version = 3
    run.pool.next_group_id = 19
    run.pool.buffer = deque(Group(group_id=g, version=3, samples=[{}] * 4) for g in (17, 18))
    run.pool.trained_group_ids = list(range(17))
    run.pool.acc = Accounting(generated=19 * 4, trained=17 * 4)
    path = run._checkpoint(top_up=False)
    resumed = _run(tmp_path, "--load", str(path.parent), name="b")
    resumed.trainer = Trainer()
    resumed._check_resume()
    resumed._restore(path)
    assert resumed.pool.budget.live == 19
    resumed.pool.worker_versions = [3, 3]
    # limit at version 3: (3 + 1 + 1) * 4 = 20; the memory cap (2 batches = 32 samples; 8 buffered) allows 2
    assert resumed.pool.room(0) == 1
