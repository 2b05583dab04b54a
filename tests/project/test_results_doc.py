"""docs/results.md's generated tables are what `python bench/make_results.py` writes from the committed output
files today: regenerated in memory and compared, so a re-run bench or simulator fails this until the doc follows."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_results_md_is_current():
    sys.path.insert(0, str(REPO / "bench"))
    import make_results

    current = make_results.RESULTS.read_text(encoding="utf-8")
    fresh = make_results.render(current)
    changed = [
        f"{i}: {old!r} -> {new!r}"
        for i, (old, new) in enumerate(zip(current.splitlines(), fresh.splitlines()), start=1)
        if old != new
    ]
    assert fresh == current, "docs/results.md is stale; run python bench/make_results.py\n" + "\n".join(changed[:10])


def _results_agent():
    sys.path.insert(0, str(REPO / "bench"))
    import results_agent

    return results_agent


def _agent_seed(root: Path, seed: int, start: float, final: float, config_seed: int | None = None) -> None:
    import json

    folder = root / f"s{seed}"
    folder.mkdir(parents=True)
    summary = {
        "eval_start": start,
        "eval_final": final,
        "eval_final_step": 20,
        "eval_final_tool": {"tool_calls_per_response": 1.0, "tool_errors_per_response": 0.0, "turns_per_response": 2.0},
        "staleness_max": 2,
        "accounting/dropped": 0,
        "accounting/lost": 0,
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "config.json").write_text(
        json.dumps({"seed": seed if config_seed is None else config_seed, "max_staleness": 2})
    )


def test_the_agent_table_pairs_each_seeds_gain_and_gives_the_t_interval(tmp_path):
    import math
    import statistics

    module = _results_agent()
    module.REPO = tmp_path  # sources named relative to the folder given
    scores = {1: (0.25, 0.5), 2: (0.5, 0.5), 3: (0.125, 0.625)}
    for seed, (start, final) in scores.items():
        _agent_seed(tmp_path, seed, start, final)
    try:
        lines = module.agent_runtime(tmp_path)
    finally:
        module.REPO = REPO
    diffs = [f - s for s, f in scores.values()]
    half = 4.302652729911275 * statistics.stdev(diffs) / math.sqrt(3)  # t(0.975, 2 df), float64
    mean = statistics.fmean(diffs)
    assert "| 2 | 0.500 | 0.500 (20) | +0.000 |" in lines[3]
    (gain,) = [ln for ln in lines if ln.startswith("RL gain")]
    assert f"{mean:+.3f}, 95% t interval [{mean - half:+.3f}, {mean + half:+.3f}]" in gain
    from epic_slime.runtime import task_calc

    assert f"the warm start is {0.125 - task_calc.chance():+.3f} or more above it" in gain  # seed 3's, the lowest


def test_a_missing_or_mislabelled_agent_seed_is_named(tmp_path):
    import pytest

    module = _results_agent()
    _agent_seed(tmp_path, 1, 0.1, 0.2)
    _agent_seed(tmp_path, 2, 0.1, 0.2, config_seed=7)
    with pytest.raises(ValueError, match=r"s2/config.json: seed 7, expected 2"):
        module.read_seeds(tmp_path)
    (tmp_path / "s2" / "config.json").write_text('{"seed": 2, "max_staleness": 2}')
    with pytest.raises(FileNotFoundError, match=r"s3/summary.json: the agent run of seed 3 is missing"):
        module.read_seeds(tmp_path)


def _graded_cell(epic: float, grpo: float) -> dict:
    rows = [("epic", epic), ("grpo", grpo)]
    return {"table1": [{"method": m, "seeds": [1, 2], "test_final_mean": v} for m, v in rows]}


def test_the_graded_table_reads_each_level_and_the_contrast_from_the_summary(tmp_path):
    import json

    sys.path.insert(0, str(REPO / "bench"))
    import results_graded

    summary = {
        "settings": {"none": _graded_cell(0.5, 0.25), "s030": _graded_cell(0.125, 0.375)},
        "gap_by_setting": {"none": {"mean": 1e-8}, "s030": {"mean": 9e-3}},
        "rollout_reward": {"none": {"first": 0.4}, "s030": {"first": 0.3}},
        "contrast": [
            {"method": "epic", "baseline": "grpo", "target": "s030", "reference": "none", "n": 2, "mean": -0.5,
             "low": -0.75, "high": -0.25, "sign_flip_p": 0.5, "mdd_80": 0.3, "verdict": "EPIC loses"}
        ],
        "chance": 0.14,
        "warm_start_test": 0.36,
    }  # fmt: skip
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    results_graded.REPO = tmp_path
    try:
        lines = results_graded.graded(path)
    finally:
        results_graded.REPO = REPO
    assert "| none | 1.00e-08 | 0.400 | 0.500 | 0.250 | 2 |" in lines
    assert "| s030 | 9.00e-03 | 0.300 | 0.125 | 0.375 | 2 |" in lines
    assert any(
        ln.startswith("| (epic - grpo)[s030] - (epic - grpo)[none] | 2 | -0.500 | [-0.750, -0.250] | 0.500")
        for ln in lines
    )
