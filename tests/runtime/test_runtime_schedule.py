"""The runtime loop's parts beside `Run`'s schedule: the trainer's GRPO advantages (``PolicyTrainer.train_groups``,
the Ray actor only forwards), the eval queue (``EvalQueue``: evaluations due and done) and the step in flight
(``StepInFlight``: what a step drops while its batch is chosen). No Ray: stand-ins at the actor interface."""

from __future__ import annotations

import math
from collections import deque

import pytest

from epic_slime.runtime.batches import Group


def _reference_advantages(rewards):
    """GRPO in float64 from the definition: (r - mean) / (population std + 1e-6)."""
    n = len(rewards)
    mean = math.fsum(rewards) / n
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / n)
    return [(r - mean) / (std + 1e-6) for r in rewards]


def test_train_groups_trains_on_each_groups_grpo_advantages():
    """Two trainers from one state: train_groups(groups) must take exactly the step train_step takes on
    the samples with the reference advantages (same loss, same updated weights)."""
    import torch
    from support.runtime_helpers import tiny_trainer

    trainer, samples, _ = tiny_trainer()
    twin, _, _ = tiny_trainer()
    rewards = [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    plain = [{k: v for k, v in s.items() if k != "advantage"} | {"reward": r} for s, r in zip(samples, rewards)]
    groups = [Group(group_id=i, version=0, samples=plain[4 * i : 4 * i + 4]) for i in range(4)]
    ref = [a for g in groups for a in _reference_advantages([s["reward"] for s in g.samples])]
    assert any(a != 0 for a in ref)
    metrics = trainer.train_groups(groups)
    expected = twin.train_step([{**s, "advantage": a} for s, a in zip(plain, ref)])
    assert metrics["train/pg_loss"] == pytest.approx(expected["train/pg_loss"], rel=1e-6, abs=1e-9)
    for name, w in trainer.get_weights().items():
        assert torch.allclose(w, twin.get_weights()[name], atol=1e-6), name


# ---- EvalQueue ----


class _EvalWorker:
    def __init__(self):
        self.started = []
        outer = self

        class _Evaluate:
            def remote(self, weights, version, problems, sampling):
                outer.started.append((weights, version))
                return ("eval", version)

        self.evaluate = _Evaluate()


class _Log:
    def __init__(self):
        self.lines = []

    def evaluation(self, step, result, version, correct, weight_version, tool_counts=None):
        self.lines.append((step, version, weight_version))


def _queue(tmp_path, monkeypatch):
    import ray
    from support.runtime_helpers import tiny_config

    from epic_slime.runtime.eval_queue import EvalQueue

    # the stand-in's future is ("eval", version): the worker held that version and scored 1 of 2 right
    monkeypatch.setattr(ray, "get", lambda fut: (fut[1], [[True, False]], {}, None))  # EvalWorker.evaluate
    monkeypatch.setattr(ray, "wait", lambda futs, **kw: (futs, []))
    queue = EvalQueue(tiny_config(tmp_path), _Log())
    queue.worker = _EvalWorker()
    return queue


def test_evaluations_due_run_in_order_once_per_version(tmp_path, monkeypatch):
    queue = _queue(tmp_path, monkeypatch)
    queue.due_now("w0", 0)
    queue.due_now("w0", 0)  # due again while in flight: not twice
    queue.due_now("w2", 2)
    queue.due_now("w4", 4)
    queue.due_now("w2", 2)  # due again while queued: not twice
    assert queue.worker.started == [("w0", 0)] and [v for _, v in queue.due] == [2, 4]
    assert queue.owns(queue.future) and not queue.owns(("eval", 9))
    queue.collect(step=5)  # the next one starts as one finishes, with the weights it was due on
    assert queue.worker.started == [("w0", 0), ("w2", 2)]
    queue.collect(step=5)
    # two finished within one step: the metrics line gets the newest, the log has both
    done = queue.take_done()
    assert done["eval/version"] == 2 and queue.take_done() == {}
    assert queue.log.lines == [(5, 0, 0), (5, 2, 2)]
    assert done["eval/heldout/mean@2"] == 0.5 and done["eval/heldout/pass@2"] == 1.0


def test_the_last_step_collects_every_queued_evaluation_then_the_final_one(tmp_path, monkeypatch):
    queue = _queue(tmp_path, monkeypatch)
    queue.due_now("w0", 0)
    queue.due_now("w2", 2)
    queue.finish(step=4, weights_ref="w4", version=4)
    assert [v for _, v in queue.worker.started] == [0, 2, 4]
    assert [line[1] for line in queue.log.lines] == [0, 2, 4] and queue.future is None and not queue.due
    assert queue.take_done()["eval/version"] == 4


# ---- the step in flight ----


def test_groups_dropped_while_a_batch_is_chosen_count_once_for_that_step(tmp_path):
    """Two takes before a batch is ready, each dropping a stale group: the step's line counts both, the
    next step starts from zero."""
    from support.runtime_helpers import tiny_config

    from epic_slime.runtime.driver import Run

    run = Run(tiny_config(tmp_path, "--max-staleness", "1"))
    pool, n = run.pool, run.cfg.n_samples_per_prompt
    pool.version = 3
    pool.buffer = deque([Group(0, 1, [{}] * n), Group(1, 3, [{}] * n)])  # group 0: lag 2 > K
    pool.budget.restore(2)
    assert run._take_batch().batch is None
    pool.buffer.extend(Group(g, 3 if g != 2 else 0, [{}] * n) for g in (2, 3, 4, 5))  # group 2: lag 3
    sel = run._take_batch()
    assert [g.group_id for g in sel.batch] == [1, 3, 4, 5]
    assert run.training.dropped_samples == 2 * n and run.training.dropped_ids == [0, 2]
    assert pool.dropped_group_ids == [0, 2] and pool.acc.dropped == 2 * n and pool.budget.live == 0

    class _Trainer:
        class train_step:  # noqa: N801 - the actor method's name
            remote = staticmethod(lambda batch: "step-future")

    run.training.start(sel.batch, run.version, _Trainer())
    assert run.training.future == "step-future" and run.training.lags == [0] * (4 * n)
