"""Eval-only runs with the args slime really hands the hook, and replace_run_records' range check
(issue 28 item 7's mutation pass: test_eval_only_records.py builds args with both ids set and never
a training run's, and never hands replace_run_records a record past to_step)."""

from __future__ import annotations

import types

import pytest

from epic_slime.evaluation import read_records
from epic_slime.evaluation.records import EvalRecord, replace_run_records
from epic_slime.slime import eval_hooks
from epic_slime.slime import rollout as project_rollout
from epic_slime.slime.flags import ROLLOUT_FUNCTION_PATH


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
