"""Issue 28, section 1: an eval-only run (``--num-rollout`` at or below ``start_rollout_id``, as
launch/reeval.sh and a checkpoint re-evaluation do) replaces exactly the step it evaluates and
leaves every other record of the run alone. Before the fix it replaced the run's records from its
step on, and the rollout-0 checkpoint (labelled step -1) wiped the whole run."""

from __future__ import annotations

import types

import pytest

from epic_slime.evaluation import read_records
from epic_slime.evaluation.records import PRE_TRAINING_STEP, EvalRecord, replace_run_records
from epic_slime.slime import eval_hooks
from epic_slime.slime import rollout as project_rollout
from epic_slime.slime.cli.flags import ROLLOUT_FUNCTION_PATH
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


# ---- eval-only runs with the args slime really hands the hook, and replace_run_records' range check
# (issue 28 item 7's mutation pass: the tests above set both ids and never a training run's, and never
# hand replace_run_records a record past to_step).
# mutants: eval_only_strict, eval_only_one_rollout_early
@pytest.mark.parametrize(
    "start, end, eval_only",
    [
        (0, 300, False),  # a fresh training run
        (150, 300, False),  # resumed mid-run
        (299, 300, False),  # resumed for its last rollout: it trains one, its evals supersede the crashed ones
        (300, 300, True),  # --num-rollout at the start: the loaded checkpoint is re-scored
        (0, 0, True),  # --num-rollout 0 on the initial weights
        (7, 0, True),  # --num-rollout 0 on checkpoint 6
    ],
)
def test_eval_only_is_num_rollout_at_or_below_the_start(start, end, eval_only):
    args = types.SimpleNamespace(start_rollout_id=start, num_rollout=end)
    assert eval_hooks.eval_only_run(args) is eval_only


def _record(step: int, sample_idx: int = 0, correct: bool = True) -> EvalRecord:
    return EvalRecord(
        run="r1",
        method="epic",
        seed=1,
        step=step,
        benchmark="aime_2024",
        prompt_id="p0",
        sample_idx=sample_idx,
        correct=correct,
    )


# mutant: records_range_unchecked_above
def test_a_record_past_to_step_is_refused_and_the_file_is_left_alone(tmp_path):
    path = str(tmp_path / "evals.jsonl")
    replace_run_records(path, [_record(s) for s in (1, 2, 3)], run="r1", from_step=1)
    with pytest.raises(ValueError, match=r"record at step 3 outside \[2, 2\]"):
        replace_run_records(
            path, [_record(2, correct=False), _record(3, correct=False)], run="r1", from_step=2, to_step=2
        )
    assert [(r.step, r.correct) for r in read_records(path)] == [(1, True), (2, True), (3, True)]
    assert replace_run_records(path, [_record(2, correct=False)], run="r1", from_step=2, to_step=2) == 1
    assert sorted((r.step, r.correct) for r in read_records(path)) == [(1, True), (2, False), (3, True)]


def test_eval_only_run_with_the_args_the_rollout_manager_holds_keeps_later_steps(tmp_path, monkeypatch):
    """slime creates the RolloutManager before create_training_models fills args.start_rollout_id from
    the loaded checkpoint, so the hook's copy has start_rollout_id None. Found by the mutation pass as a
    strict xfail (the eval-only run deleted every later step); fixed in eval_hooks (h-rel, d7681c5)."""
    path = tmp_path / "evals.jsonl"
    base = dict(
        epic_eval_records_path=str(path),
        epic_run_name="r1",
        epic_method="epic",
        seed=1,
        n_samples_per_eval_prompt=1,
        rollout_function_path=ROLLOUT_FUNCTION_PATH,
    )
    replace_run_records(str(path), [_record(s) for s in (-1, 0, 1, 2, 3)], run="r1", from_step=-1)
    # `--load <megatron ckpt of rollout 1> --num-rollout 0`: the driver's args get start 2 and
    # evaluate rollout 1 (eval_before_training); the RolloutManager's copy kept start None
    args = types.SimpleNamespace(**base, start_rollout_id=None, num_rollout=0, eval_interval=1)
    monkeypatch.setattr(eval_hooks, "_last_written", {})
    monkeypatch.setattr(project_rollout, "_first_rollout_id", None)
    samples = [types.SimpleNamespace(index=0, metadata={"benchmark": "aime_2024", "problem_id": "p0"})]
    eval_hooks.log_eval_rollout(1, args, {"aime_2024": {"rewards": [0.0], "samples": samples}}, {})
    assert sorted(r.step for r in read_records(str(path))) == [-1, 0, 1, 2, 3]
