"""Tests a mutation run showed missing (each kills a small plausible bug that survived the suite)."""

from __future__ import annotations

import json

import pytest

from epic_slime.evaluation.records import EvalRecord
from epic_slime.reward import math_reward
from epic_slime.reward.normalize import normalize_answer
from epic_slime.slime.gate import StalenessGate


def test_staleness_min_is_the_smallest_admitted_lag():
    gate = StalenessGate(max_staleness=3, stale_policy="drop")
    for lag in (2, 3, 1, 2):
        assert gate.admit(lag, 4)
    m = gate.metrics()
    assert m["staleness/min"] == 1.0 and m["staleness/max"] == 3.0 and m["staleness/mean"] == 2.0
    assert not gate.admit(4, 4) and gate.metrics()["staleness/min"] == 1.0  # a dropped group is not a lag


@pytest.mark.parametrize("text,expected", [("0", "0"), ("00", "0"), ("-0", "0"), ("007", "7"), ("+0", "0")])
def test_zero_answers_stay_zero(text, expected):
    assert normalize_answer(text) == expected


def test_answer_zero_is_scored_and_an_empty_answer_is_not():
    assert math_reward("so the result is\nAnswer: 0", "0") == 1.0
    assert math_reward("so the result is\nAnswer: 000", "0") == 1.0
    assert math_reward("so the result is\nAnswer: ", "0") == 0.0  # "" must not equal a normalised "0"
    assert math_reward("so the result is\nAnswer: 1", "0") == 0.0


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


def test_select_groups_admits_at_most_target_and_leaves_the_rest_unexamined():
    from epic_slime.slime.gate import select_groups

    groups = [[object()] * 2 for _ in range(5)]
    versions = [[3, 3], [1, 1], [3, 2], [3, 3], [2, 3]]  # lags at trainer version 3: 0, 2, 1, 0, 1
    gate = StalenessGate(max_staleness=1, stale_policy="drop")
    chosen, lags = select_groups(groups, versions, 3, gate, target=2)
    assert (chosen, lags) == ([0, 2], [0, 1])
    assert gate.admitted_groups == 2 and gate.dropped_groups == 1  # group 1 dropped; 3 and 4 not examined
    assert select_groups(groups, versions, 3, StalenessGate(max_staleness=1), target=3)[0] == [0, 2, 3]


def _mutation_runner():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "mutation" / "run.py"
    spec = importlib.util.spec_from_file_location("epic_mutation_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mutation_runner_applies_one_occurrence_and_calls_a_stale_entry_not_applicable():
    run = _mutation_runner()
    text = "a = x <= k\nb = x <= k\nc = y\n"
    assert run.mutate(text, {"original": "y", "replacement": "z"}) == ("a = x <= k\nb = x <= k\nc = z\n", "")
    assert (
        run.mutate(text, {"original": "x <= k", "replacement": "x < k", "occurrence": 2})[0]
        == "a = x <= k\nb = x < k\nc = y\n"
    )
    for entry, why in [
        ({"original": "w = 1"}, "not found"),
        ({"original": "x <= k"}, "found 2 times"),
        ({"original": "x <= k", "occurrence": 3}, "occurrence 3"),
        ({"original": "b = x\nc"}, "one-line"),
    ]:
        mutated, reason = run.mutate(text, {**entry, "replacement": "-"})
        assert mutated is None and why in reason
    with open(run.HERE / "mutants.yaml") as f:  # the list parses and every entry is complete
        assert len(run.load_mutants(run.HERE / "mutants.yaml")) == len(__import__("yaml").safe_load(f))


def test_mutation_runner_keeps_its_per_mutant_limit_when_a_test_leaves_children(tmp_path):
    """A mutant whose test hangs after starting a child (as a Ray node or a stand-in server is): the
    run is cut at its limit and the child is ended with it. subprocess.run's timeout killed pytest
    only, and the child ran on, taking the cores of the mutants after it."""
    import os
    import time

    run = _mutation_runner()
    pid_file = tmp_path / "child.pid"
    (tmp_path / "test_hangs.py").write_text(
        "import subprocess, time\n\n\ndef test_hangs():\n"
        f"    child = subprocess.Popen(['sleep', '60'])\n    open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "    time.sleep(3600)\n"
    )
    start = time.monotonic()
    rc, seconds, last = run.run_tests(tmp_path, ["test_hangs.py", "-s", "-p", "no:timeout"], timeout=3)
    assert rc == -1 and "timed out after 3s" in last and time.monotonic() - start < 30, (rc, last)
    child = int(pid_file.read_text())
    for _ in range(50):  # SIGKILLed with its group; reaped by init
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the test's child {child} outlived the mutant's run")
