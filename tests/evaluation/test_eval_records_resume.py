"""Eval records over a resume (issue 17, section 4): one record set per step, the pre-training
eval keyed apart from the one after rollout 0, other runs untouched, and a crash mid-rewrite
losing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

from support.eval_helpers import REPO_ROOT, report_on_records
from epic_slime.evaluation import read_record_paths, read_records, write_records
from epic_slime.evaluation.records import PRE_TRAINING_STEP, EvalRecord, RecordError
from epic_slime.slime import eval_hooks
from epic_slime.slime import rollout as project_rollout
from epic_slime.slime.cli.flags import ROLLOUT_FUNCTION_PATH

BENCH = "aime_2024"
PROMPTS, K = 3, 2


def _data(tag: int) -> dict:
    """One eval's output; ``tag`` sets which samples are correct, so a test can tell evals apart."""
    samples = [
        types.SimpleNamespace(index=i, metadata={"benchmark": BENCH, "problem_id": f"p{i // K}"})
        for i in range(PROMPTS * K)
    ]
    return {BENCH: {"rewards": [float((i * 7 + tag) % 3 == 0) for i in range(PROMPTS * K)], "samples": samples}}


def _signature(tag: int) -> tuple:
    return tuple(
        r.correct
        for r in eval_hooks.eval_records_from_rollout(0, types.SimpleNamespace(n_samples_per_eval_prompt=K), _data(tag))
    )


def _args(path, run="r1", method="epic", **extra):
    return types.SimpleNamespace(
        epic_eval_records_path=str(path),
        epic_run_name=run,
        epic_method=method,
        seed=1,
        n_samples_per_eval_prompt=K,
        rollout_function_path=ROLLOUT_FUNCTION_PATH,
        **extra,
    )


class Process:
    """One RolloutManager process: the hook's module state starts empty, and the project rollout
    function's record of the first training rollout it generated (None: none yet)."""

    def __init__(self, monkeypatch, first_training_rollout=None):
        self.monkeypatch = monkeypatch
        monkeypatch.setattr(eval_hooks, "_last_written", {}, raising=False)  # absent before the fix
        monkeypatch.setattr(project_rollout, "_first_rollout_id", first_training_rollout)

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


def _first_run_then_resume(monkeypatch, path, args):
    """--eval-interval 1: the pre-training eval and evals 0..3 (tags 0..4), then a crash; the resumed
    process starts at rollout 2 (checkpoint 1) and evaluates 2, 3, 4 (tags 5..7)."""
    first = Process(monkeypatch)
    first.eval(0, args, tag=0)  # before training: slime's rollout id 0
    for rollout_id, tag in zip(range(4), range(1, 5)):
        first.generated(rollout_id)
        first.eval(rollout_id, args, tag)
    resumed = Process(monkeypatch)  # no pre-training eval on a resume
    for rollout_id, tag in zip(range(2, 5), range(5, 8)):
        resumed.generated(rollout_id)
        resumed.eval(rollout_id, args, tag)


def test_resumed_run_supersedes_its_records_and_report_accepts(tmp_path, monkeypatch):
    path = tmp_path / "eval_records.jsonl"
    _first_run_then_resume(monkeypatch, path, _args(path))
    got = report_on_records(str(path), str(tmp_path / "report"))
    assert got["records_per_step"] == {"r1": {step: PROMPTS * K for step in (-1, 0, 1, 2, 3, 4)}}
    # steps 2 and 3 are the resumed process's evals, the ones before it the first process's
    assert _by_step(path) == {
        -1: _signature(0),
        0: _signature(1),
        1: _signature(2),
        2: _signature(5),
        3: _signature(6),
        4: _signature(7),
    }
    assert set(got["selection"]["epic"]["r1"]) == {"seed", "step"}


def test_run_restarted_from_scratch_supersedes_its_earlier_attempt(tmp_path, monkeypatch):
    path = tmp_path / "eval_records.jsonl"
    args = _args(path)
    _first_run_then_resume(monkeypatch, path, args)
    again = Process(monkeypatch)  # no checkpoint: rollout 0 again, pre-training eval again
    again.eval(0, args, tag=8)
    assert _by_step(path) == {-1: _signature(8)}


@pytest.mark.parametrize(
    "rollout_function, skip_before_train, trained_first, steps",
    [
        (ROLLOUT_FUNCTION_PATH, False, False, [-1, 0, 1]),  # the driver's schedule
        (None, False, False, [-1, 0, 1]),  # another rollout function: by the schedule
        (None, True, False, [0, 1]),  # --skip-eval-before-train
        (ROLLOUT_FUNCTION_PATH, False, True, [0, 1]),  # slime's train_async.py: no eval before training
    ],
)
def test_eval_interval_1_keys_the_pre_training_eval_apart(
    tmp_path, monkeypatch, rollout_function, skip_before_train, trained_first, steps
):
    path = tmp_path / "eval_records.jsonl"
    args = _args(path, skip_eval_before_train=skip_before_train)
    args.rollout_function_path = rollout_function
    process = Process(monkeypatch)
    if not trained_first and not skip_before_train:
        process.eval(0, args, tag=0)
    for rollout_id in (0, 1):
        process.generated(rollout_id)
        process.eval(rollout_id, args, tag=rollout_id + 1)
    assert sorted(_by_step(path)) == steps
    assert _by_step(path)[0] == _signature(1)  # rollout 0's eval is the trained weights'
    report_on_records(str(path), str(tmp_path / "report"))


def test_records_of_other_runs_stay_line_for_line(tmp_path, monkeypatch):
    path = tmp_path / "shared.jsonl"
    other = [EvalRecord("other", "grpo", 2, step, BENCH, "q", 0, True) for step in (0, 5, 9)]
    write_records(str(path), other[:1])
    # written by hand, not in the writer's key order or spacing: kept as it is
    path.write_text(
        path.read_text() + '{"step": 5, "run": "other", "method": "grpo", "seed": 2,  "benchmark": '
        '"aime_2024", "prompt_id": "q", "sample_idx": 0, "correct": 1}\n'
    )
    args = _args(path)
    process = Process(monkeypatch)
    process.eval(0, args, tag=0)
    write_records(str(path), other[2:])  # another run's appends between this run's evals
    before = [ln for ln in path.read_text().splitlines() if json.loads(ln)["run"] == "other"]
    _first_run_then_resume(monkeypatch, path, args)
    assert [ln for ln in path.read_text().splitlines() if json.loads(ln)["run"] == "other"] == before
    assert sorted(_by_step(path, "other")) == [0, 5, 9]
    got = report_on_records(str(path), str(tmp_path / "report"))
    assert got["records_per_step"]["r1"] == {step: PROMPTS * K for step in (-1, 0, 1, 2, 3, 4)}


def test_a_run_name_is_one_method_and_seed(tmp_path, monkeypatch):
    path = tmp_path / "eval_records.jsonl"
    Process(monkeypatch).eval(0, _args(path), tag=0)
    before = path.read_bytes()
    with pytest.raises(
        RecordError, match=r"eval_records.jsonl:1: run 'r1' has field 'method' 'epic' there, the new records 'grpo'"
    ):
        Process(monkeypatch).eval(0, _args(path, method="grpo"), tag=1)
    assert path.read_bytes() == before


def test_steps_must_increase_within_a_process(tmp_path, monkeypatch):
    path = tmp_path / "eval_records.jsonl"
    args = _args(path)
    process = Process(monkeypatch, first_training_rollout=0)
    process.eval(3, args, tag=0)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"run 'r1' step 3 \(rollout id 3\) comes after step 3"):
        process.eval(3, args, tag=1)
    with pytest.raises(ValueError, match="step 2 .* comes after step 3"):
        process.eval(2, args, tag=1)
    assert path.read_bytes() == before


def test_step_field_accepts_the_pre_training_step_only_below_zero(tmp_path):
    record = EvalRecord("r", "m", 1, PRE_TRAINING_STEP, BENCH, "p", 0, True).to_dict()
    assert EvalRecord.from_dict(record).step == -1
    with pytest.raises(RecordError, match=r"field 'step' must be >= -1 \(-1: the pre-training evaluation\), got -2"):
        EvalRecord.from_dict(record | {"step": -2})
    with pytest.raises(RecordError, match="field 'sample_idx' must be >= 0, got -1"):
        EvalRecord.from_dict(record | {"sample_idx": -1})


def test_failed_rewrite_leaves_the_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "eval_records.jsonl"
    args = _args(path)
    Process(monkeypatch, first_training_rollout=0).eval(3, args, tag=0)
    before = path.read_bytes()

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        Process(monkeypatch, first_training_rollout=2).eval(2, args, tag=1)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["eval_records.jsonl", "eval_records.jsonl.lock"]


def test_crash_mid_rewrite_loses_no_record(tmp_path, monkeypatch):
    """A process killed (SIGKILL) with the rewritten file complete but not yet renamed: the old file
    is intact, the stray temporary is never read as records, and the next process writes normally."""
    path = tmp_path / "eval_records.jsonl"
    args = _args(path)
    _first_run_then_resume(monkeypatch, path, args)
    before = path.read_bytes()
    child = textwrap.dedent(f"""
        import os, signal, types
        from epic_slime.evaluation import records
        from epic_slime.slime import eval_hooks, rollout
        records.os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)
        rollout._first_rollout_id = 3
        samples = [types.SimpleNamespace(index=i, metadata={{"benchmark": "{BENCH}", "problem_id": "p0"}}) for i in range(2)]
        args = types.SimpleNamespace(epic_eval_records_path={str(path)!r}, epic_run_name="r1", epic_method="epic",
                                     seed=1, n_samples_per_eval_prompt=2, rollout_function_path={ROLLOUT_FUNCTION_PATH!r})
        eval_hooks.log_eval_rollout(3, args, {{"{BENCH}": {{"rewards": [1, 1], "samples": samples}}}})
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stderr
    assert path.read_bytes() == before
    stray = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert len(stray) == 1 and stray[0].startswith(".eval_records.jsonl.")
    assert read_record_paths([str(tmp_path)]) == read_records(str(path))  # the folder reads the file only
    report_on_records(str(path), str(tmp_path / "report"))
    Process(monkeypatch, first_training_rollout=3).eval(3, args, tag=9)
    assert _by_step(path)[3] == _signature(9) and sorted(_by_step(path)) == [-1, 0, 1, 2, 3]


# ---- from the mutation runs of issue 21
# mutant: record_negative_sample_idx
@pytest.mark.parametrize("sample_idx", [-1, -3])
def test_an_eval_record_with_a_negative_sample_idx_is_refused(sample_idx, tmp_path):
    from epic_slime.evaluation.records import RecordError, read_records

    record = {
        "run": "r",
        "method": "epic",
        "seed": 0,
        "step": 2,
        "benchmark": "aime_2024",
        "prompt_id": "p1",
        "sample_idx": sample_idx,
        "correct": True,
    }
    with pytest.raises(RecordError, match="sample_idx"):
        EvalRecord.from_dict(record)
    path = tmp_path / "eval_records.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(RecordError, match="sample_idx"):
        read_records(str(path))
    assert EvalRecord.from_dict({**record, "sample_idx": 0}).sample_idx == 0
