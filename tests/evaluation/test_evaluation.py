"""mean@k, pass@k, equal-weight average, checkpoint selection, seed aggregation, records."""

from __future__ import annotations

import itertools
import json
import math
import types

import pytest

from epic_slime.evaluation import (
    EvalRecord,
    RecordError,
    benchmark_pass_at_k,
    checkpoint_average,
    group_records,
    mean_and_std,
    mean_at_k,
    method_table,
    pass_at_k,
    read_records,
    select_best_checkpoint,
    write_records,
)
from epic_slime.slime.eval_hooks import eval_records_from_rollout, log_eval_rollout


def _pass_at_k_by_enumeration(outcomes: list[bool], k: int) -> float:
    """Definition: the chance that a uniformly drawn k-subset of the n samples has a correct one."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (4, 1, 1, 0.25),
        (4, 1, 2, 0.5),
        (5, 2, 3, 0.9),
        (8, 0, 4, 0.0),
        (8, 8, 1, 1.0),
        (8, 7, 2, 1.0),
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_matches_subset_enumeration():
    for n in range(1, 9):
        for c in range(n + 1):
            outcomes = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_by_enumeration(outcomes, k)), (n, c, k)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_mean_at_k_averages_over_prompts_and_samples():
    assert mean_at_k({"a": [1, 0, 0, 0], "b": [1, 1, 1, 1]}) == pytest.approx(0.625)
    assert mean_at_k({"a": [True, False], "b": [True] * 4}) == pytest.approx(0.75)  # prompts weigh equally
    assert mean_at_k({"a": [False] * 8}) == 0.0
    assert benchmark_pass_at_k({"a": [1, 0, 0, 0], "b": [0, 0, 0, 0]}, 2) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="no samples"):
        mean_at_k({"a": []})


def _records(run, method, seed, step, benchmark, correct_counts, samples=2):
    """One record per (prompt, sample): correct_counts[p] of prompt p's samples are correct."""
    out = []
    for p, c in enumerate(correct_counts):
        for s in range(samples):
            out.append(EvalRecord(run, method, seed, step, benchmark, f"{benchmark}-{p}", s, s < c))
    return out


BENCH = ("aime_2024", "aime_2025", "amc_2023", "hmmt_feb_2025")


def test_average_weighs_benchmarks_equally_whatever_their_size():
    records = _records("r", "m", 1, 0, "big", [0, 0, 0, 0, 0, 0], samples=1) + _records(
        "r", "m", 1, 0, "small", [1], samples=1
    )
    runs = group_records(records)
    assert checkpoint_average(runs["r"].scores[0], ["big", "small"]) == pytest.approx(0.5)  # not 1/7
    assert checkpoint_average(runs["r"].scores[0], ["big", "small", "missing"]) is None


def test_best_checkpoint_selection_ties_and_incomplete_steps():
    records = []
    for step, counts in {5: (1, 1, 0, 0), 10: (2, 1, 0, 1), 15: (1, 2, 1, 0)}.items():  # averages .25 .5 .5
        for benchmark, c in zip(BENCH, counts):
            records += _records("r", "m", 1, step, benchmark, [c], samples=2)
    for benchmark in BENCH[:3]:  # step 20: perfect but HMMT missing -> not eligible
        records += _records("r", "m", 1, 20, benchmark, [2], samples=2)
    runs = group_records(records)
    assert select_best_checkpoint(runs["r"], BENCH) == 10  # tie with 15: the earliest wins
    assert select_best_checkpoint(runs["r"], BENCH[:3]) == 20


def test_mean_and_std_over_seeds():
    mean, std = mean_and_std([0.5, 0.6, 0.7])
    assert mean == pytest.approx(0.6) and std == pytest.approx(0.1)  # sample std (ddof=1)
    assert mean_and_std([0.3]) == (0.3, None)


def test_method_table_selects_per_run_then_aggregates():
    records = []
    # seed 1 is best at step 5 (average .375), seed 2 at step 10 (average .75)
    plan = {(1, 5): (2, 1, 2, 1), (1, 10): (1, 1, 1, 1), (2, 5): (0, 0, 0, 0), (2, 10): (2, 2, 1, 1)}
    for (seed, step), counts in plan.items():
        for benchmark, c in zip(BENCH, counts):
            records += _records(f"m-s{seed}", "m", seed, step, benchmark, [c, 0], samples=2)
    (row,) = method_table(group_records(records), BENCH)
    assert row.selected_steps == {"m-s1": 5, "m-s2": 10}
    # AIME 24 at the selected steps: seed 1 (2+0)/4 = .5, seed 2 (2+0)/4 = .5
    assert row.cells["aime_2024"] == pytest.approx((0.5, 0.0))
    # HMMT: .25 and .25; AMC: .5 and .25 -> mean .375, std .25/sqrt(2)
    assert row.cells["amc_2023"][0] == pytest.approx(0.375)
    assert row.cells["amc_2023"][1] == pytest.approx(0.25 / math.sqrt(2))
    # averages: seed 1 (.5+.25+.5+.25)/4 = .375, seed 2 (.5+.5+.25+.25)/4 = .375
    assert row.cells["average"] == pytest.approx((0.375, 0.0))


def test_inconsistent_records_are_errors():
    base = _records("r", "m", 1, 0, "aime_2024", [1], samples=1)
    with pytest.raises(RecordError, match="duplicate eval record"):
        group_records(base + base)
    with pytest.raises(RecordError, match="one method and one seed"):
        group_records(base + _records("r", "other", 1, 5, "aime_2024", [1], samples=1))
    with pytest.raises(RecordError, match="two runs with seed 1"):
        group_records(base + _records("r2", "m", 1, 0, "aime_2024", [1], samples=1))
    with pytest.raises(RecordError, match="have no records"):
        method_table(group_records(base), ["aime_2024"], methods=["nope"])


def test_records_round_trip_and_validation(tmp_path):
    path = tmp_path / "sub" / "records.jsonl"
    first = _records("r", "epic", 1, 5, "aime_2024", [1, 0], samples=2)
    assert write_records(str(path), first) == 4
    assert write_records(str(path), [first[0].to_dict() | {"step": 10}]) == 1  # dicts accepted, appended
    back = read_records(str(path))
    assert back[:4] == first and back[4].step == 10 and back[4].correct is True
    with pytest.raises(RecordError, match="missing field"):
        write_records(str(path), [{"run": "r"}])
    bad = dict(first[0].to_dict(), correct="yes")
    with pytest.raises(RecordError, match="field 'correct'"):
        write_records(str(path), [bad])
    path.write_text(path.read_text() + json.dumps(dict(first[0].to_dict(), seed="x")) + "\n")
    with pytest.raises(RecordError, match=r"records.jsonl:6: field 'seed' must be an integer"):
        read_records(str(path))
    assert write_records(str(path), first, append=False) == 4 and len(read_records(str(path))) == 4


def test_slime_eval_hook_writes_records_from_plain_objects(tmp_path):
    def sample(index, benchmark, problem_id):
        return types.SimpleNamespace(index=index, metadata={"benchmark": benchmark, "problem_id": problem_id})

    # two prompts x 2 samples, completed out of order (slime sorts by index; the hook must not rely on it)
    samples = [
        sample(1, "aime_2024", "p0"),
        sample(0, "aime_2024", "p0"),
        sample(2, "aime_2024", "p1"),
        sample(3, "aime_2024", "p1"),
    ]
    data = {"aime_2024": {"rewards": [1.0, 0.0, 0.0, 1], "samples": samples, "truncated": [False] * 4}}
    path = tmp_path / "eval.jsonl"
    args = types.SimpleNamespace(
        epic_eval_records_path=str(path), epic_run_name="run-a", epic_method="epic", seed=3, n_samples_per_eval_prompt=2
    )
    assert log_eval_rollout(15, args, data, {}) is False  # slime keeps logging its own metrics
    got = {(r.prompt_id, r.sample_idx): r.correct for r in read_records(str(path))}
    assert got == {("p0", 0): False, ("p0", 1): True, ("p1", 0): False, ("p1", 1): True}
    assert {(r.run, r.method, r.seed, r.step, r.benchmark) for r in read_records(str(path))} == {
        ("run-a", "epic", 3, 15, "aime_2024")
    }
    # without samples (or metadata): prompt = index // k, dataset name as benchmark; DAPO's +1/-1 scores
    fallback = eval_records_from_rollout(
        0,
        types.SimpleNamespace(n_samples_per_eval_prompt=2, policy_loss="grpo"),
        {"amc_2023": {"rewards": [1, -1, -1, -1]}},
    )
    assert [(r.benchmark, r.prompt_id, r.sample_idx, r.correct, r.method) for r in fallback] == [
        ("amc_2023", "0", 0, True, "grpo"),
        ("amc_2023", "0", 1, False, "grpo"),
        ("amc_2023", "1", 0, False, "grpo"),
        ("amc_2023", "1", 1, False, "grpo"),
    ]
    # no records path configured: nothing written, no error
    assert log_eval_rollout(0, types.SimpleNamespace(), data) is False
