"""Issue 28, section 1: an eval-only run (``--num-rollout`` at or below ``start_rollout_id``, as
launch/reeval.sh and a checkpoint re-evaluation do) replaces exactly the step it evaluates and
leaves every other record of the run alone. Before the fix it replaced the run's records from its
step on, and the rollout-0 checkpoint (labelled step -1) wiped the whole run."""

from __future__ import annotations

import types

from epic_slime.evaluation import read_records
from epic_slime.evaluation.records import PRE_TRAINING_STEP
from epic_slime.slime import eval_hooks
from epic_slime.slime import rollout as project_rollout
from epic_slime.slime.flags import ROLLOUT_FUNCTION_PATH
from epic_slime.slime.train import eval_before_training

BENCH, PROMPTS, K = "aime_2024", 3, 2


def _data(tag: int) -> dict:
    """One eval's output; ``tag`` sets which samples are correct, so a test can tell evals apart."""
    samples = [
        types.SimpleNamespace(index=i, metadata={"benchmark": BENCH, "problem_id": f"p{i // K}"})
        for i in range(PROMPTS * K)
    ]
    return {BENCH: {"rewards": [float((i * 7 + tag) % 3 == 0) for i in range(PROMPTS * K)], "samples": samples}}


def _signature(tag: int) -> tuple:
    args = types.SimpleNamespace(n_samples_per_eval_prompt=K)
    return tuple(r.correct for r in eval_hooks.eval_records_from_rollout(0, args, _data(tag)))


def _args(path, run="r1"):
    return types.SimpleNamespace(
        epic_eval_records_path=str(path),
        epic_run_name=run,
        epic_method="epic",
        seed=1,
        n_samples_per_eval_prompt=K,
        rollout_function_path=ROLLOUT_FUNCTION_PATH,
    )


class Process:
    """One RolloutManager process: the hook's state starts empty, no training rollout generated."""

    def __init__(self, monkeypatch):
        self.monkeypatch = monkeypatch
        monkeypatch.setattr(eval_hooks, "_last_written", {})
        monkeypatch.setattr(project_rollout, "_first_rollout_id", None)

    def generated(self, rollout_id: int) -> None:
        if project_rollout._first_rollout_id is None:
            self.monkeypatch.setattr(project_rollout, "_first_rollout_id", rollout_id)

    def eval(self, rollout_id: int, args, tag: int) -> None:
        assert eval_hooks.log_eval_rollout(rollout_id, args, _data(tag), {}) is False


def _by_step(path, run="r1") -> dict[int, tuple]:
    out: dict[int, list] = {}
    for r in read_records(str(path)):
        if r.run == run:
            out.setdefault(r.step, []).append(r)
    return {
        step: tuple(r.correct for r in sorted(rs, key=lambda r: (r.prompt_id, r.sample_idx)))
        for step, rs in out.items()
    }


def _trained_run(monkeypatch, path, args):
    """A finished training run: the pre-training eval (tag 0) and evals 0..3 (tags 1..4)."""
    proc = Process(monkeypatch)
    proc.eval(0, args, tag=0)
    for rollout_id, tag in zip(range(4), range(1, 5)):
        proc.generated(rollout_id)
        proc.eval(rollout_id, args, tag)


def _eval_only(monkeypatch, path, args, start: int, tag: int) -> int:
    """A fresh process loading checkpoint ``start - 1`` with --num-rollout 0: one eval, no training."""
    eval_args = types.SimpleNamespace(**vars(args), start_rollout_id=start, num_rollout=0, eval_interval=1)
    rollout_id = eval_before_training(eval_args)
    assert rollout_id == max(start - 1, 0)
    Process(monkeypatch).eval(rollout_id, eval_args, tag)
    return rollout_id


def test_eval_only_of_an_intermediate_checkpoint_keeps_later_steps(tmp_path, monkeypatch):
    path = tmp_path / "evals.jsonl"
    args = _args(path)
    _trained_run(monkeypatch, path, args)
    before = _by_step(path)
    assert sorted(before) == [PRE_TRAINING_STEP, 0, 1, 2, 3]
    _eval_only(monkeypatch, path, args, start=2, tag=9)  # checkpoint 1 re-evaluated
    after = _by_step(path)
    assert sorted(after) == [PRE_TRAINING_STEP, 0, 1, 2, 3]  # before the fix: 2 and 3 were gone
    assert after[1] == _signature(9)
    assert {s: after[s] for s in after if s != 1} == {s: before[s] for s in before if s != 1}


def test_eval_only_of_rollout0_checkpoint_replaces_only_the_pretraining_step(tmp_path, monkeypatch):
    path = tmp_path / "evals.jsonl"
    args = _args(path)
    _trained_run(monkeypatch, path, args)
    before = _by_step(path)
    _eval_only(monkeypatch, path, args, start=0, tag=9)  # the initial weights, step -1
    after = _by_step(path)
    assert sorted(after) == [PRE_TRAINING_STEP, 0, 1, 2, 3]  # before the fix: only -1 was left
    assert after[PRE_TRAINING_STEP] == _signature(9)
    assert {s: after[s] for s in after if s != PRE_TRAINING_STEP} == {
        s: before[s] for s in before if s != PRE_TRAINING_STEP
    }


def test_reevaluating_the_same_step_twice_replaces_it_each_time(tmp_path, monkeypatch):
    path = tmp_path / "evals.jsonl"
    args = _args(path)
    _trained_run(monkeypatch, path, args)
    count = len(read_records(str(path)))
    _eval_only(monkeypatch, path, args, start=3, tag=7)
    _eval_only(monkeypatch, path, args, start=3, tag=8)
    after = _by_step(path)
    assert len(read_records(str(path))) == count  # no duplicates
    assert after[2] == _signature(8)
    assert sorted(after) == [PRE_TRAINING_STEP, 0, 1, 2, 3]


def test_other_runs_untouched_by_an_eval_only_run(tmp_path, monkeypatch):
    path = tmp_path / "evals.jsonl"
    _trained_run(monkeypatch, path, _args(path, run="other"))
    other = _by_step(path, run="other")
    _trained_run(monkeypatch, path, _args(path))
    _eval_only(monkeypatch, path, _args(path), start=0, tag=9)
    assert _by_step(path, run="other") == other


def test_num_rollout_0_is_eval_only_in_slimes_rollout_manager_too(tmp_path, monkeypatch):
    """slime's RolloutManager gets its args before the checkpoint sets start_rollout_id (None when a
    Megatron checkpoint is loaded): --num-rollout 0 must still replace only its own step. Failed
    before: the hook saw no eval-only run and replaced the run's records from step 1 on."""
    path = tmp_path / "evals.jsonl"
    args = _args(path)
    _trained_run(monkeypatch, path, args)
    before = _by_step(path)
    manager_args = types.SimpleNamespace(**vars(args), start_rollout_id=None, num_rollout=0, eval_interval=1)
    assert eval_hooks.eval_only_run(manager_args)
    Process(monkeypatch).eval(1, manager_args, tag=9)  # the driver's eval of checkpoint 1
    after = _by_step(path)
    assert sorted(after) == [PRE_TRAINING_STEP, 0, 1, 2, 3] and after[1] == _signature(9)
    assert {s: after[s] for s in after if s != 1} == {s: before[s] for s in before if s != 1}
    assert not eval_hooks.eval_only_run(types.SimpleNamespace(start_rollout_id=None, num_rollout=5))
