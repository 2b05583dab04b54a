"""The calc agent task's result table (``epic_slime.runtime.agent_report``): its figures against an
independent computation, and docs/agents.md holding the table of the committed run verbatim."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import pytest

from epic_slime.runtime import agent_report

REPO = pathlib.Path(__file__).resolve().parents[2]
RUN = REPO / "docs" / "agent_task" / "run.json"
FIRST_RUN = REPO / "docs" / "agent_task" / "run_lr1e-3.json"  # RL learning rate 1e-3 (docs/agents.md)


def _row(seed, arm, warm, after):
    stats = {"tool_calls_per_response": 1.0, "tool_errors_per_response": 0.0, "turns_per_response": 2.0}
    return {
        "seed": seed,
        "arm": arm,
        "warm_start": {"accuracy": warm, **stats},
        "after_rl": {"accuracy": after, **({**stats, "tool_calls_per_response": seed} if arm == "tool" else stats)},
    }


def test_the_gain_and_its_interval_against_scipy():
    from scipy import stats

    tool = {1: (0.3, 0.5), 2: (0.4, 0.7), 3: (0.35, 0.45)}
    rows = [_row(s, "tool", *v) for s, v in tool.items()] + [_row(s, "no_tool", 0.0, 0.01 * s) for s in tool]
    run = {"chance": 0.001, "settings": {"eval_samples": 4, "eval_prompts": 64}, "rows": rows}
    s = agent_report.summary(run)
    diffs = [after - warm for warm, after in tool.values()]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    half = stats.t.ppf(0.975, 2) * sd / math.sqrt(3)
    assert s["rl_gain_tool"]["mean"] == pytest.approx(mean, abs=1e-12)
    assert (s["rl_gain_tool"]["low"], s["rl_gain_tool"]["high"]) == pytest.approx((mean - half, mean + half))
    margin = [tool[k][1] - 0.01 * k for k in tool]
    assert s["tool_over_no_tool"]["mean"] == pytest.approx(sum(margin) / 3)
    assert s["warm_start_over_chance"]["mean"] == pytest.approx(sum(v[0] for v in tool.values()) / 3 - 0.001)
    assert s["use_after_rl"]["tool_calls_per_response"] == pytest.approx(2.0)  # seeds 1, 2, 3 averaged
    text = agent_report.table(run)
    assert "| 2 | 0.400 | 0.700 | 0.000 | 0.020 |" in text
    assert f"- RL gain with the tool: {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]" in text


@pytest.mark.parametrize("run", [RUN, FIRST_RUN], ids=["run", "first_run"])
def test_the_docs_hold_the_committed_runs_tables(run):
    if not run.exists():
        pytest.fail(f"{run} is missing: run python -m epic_slime.runtime.agent_train {run}")
    table = agent_report.table(json.loads(run.read_text()))
    assert table in (REPO / "docs" / "agents.md").read_text(), (
        f"docs/agents.md does not hold the table of {run.relative_to(REPO)}: paste the output of "
        f"python -m epic_slime.runtime.agent_report {run.relative_to(REPO)}"
    )


def test_the_committed_run_has_the_modules_settings_and_seeds():
    from epic_slime.runtime import agent_train, task_calc

    run = json.loads(RUN.read_text())
    assert run["settings"] == dataclasses.asdict(agent_train.RUN) and run["seeds"] == list(agent_train.SEEDS)
    assert run["chance"] == task_calc.chance()
