"""The calc agent task's result table (issue 44 item 4), from the run file ``agent_train`` writes:

    python -m epic_slime.runtime.agent_report docs/agent_task/run.json

prints the Markdown that docs/agents.md holds verbatim (tests/runtime/test_agent_report.py checks it).
Per seed: held-out mean@k of the warm start and after RL, with the tool and without it; then the RL gain
with the tool and the tool's margin over the no-tool arm after the same RL budget, each a mean over the
seeds with its 95% t interval; the tool's use per response.
"""

from __future__ import annotations

import json
import sys

ARMS = ("tool", "no_tool")


def _cells(rows: list[dict]) -> dict[tuple[int, str], dict]:
    return {(r["seed"], r["arm"]): r for r in rows}


def summary(run: dict) -> dict:
    from epic_slime.study.analysis import paired_difference

    cells = _cells(run["rows"])
    seeds = sorted({s for s, _ in cells})
    acc = {
        (arm, when): {s: cells[s, arm][when]["accuracy"] for s in seeds}
        for arm in ARMS
        for when in ("warm_start", "after_rl")
    }
    return {
        "seeds": seeds,
        "chance": run["chance"],
        "accuracy": acc,
        "rl_gain_tool": paired_difference(acc["tool", "after_rl"], acc["tool", "warm_start"]),
        "rl_gain_no_tool": paired_difference(acc["no_tool", "after_rl"], acc["no_tool", "warm_start"]),
        "tool_over_no_tool": paired_difference(acc["tool", "after_rl"], acc["no_tool", "after_rl"]),
        "warm_start_over_chance": paired_difference(acc["tool", "warm_start"], {s: run["chance"] for s in seeds}),
        "use_after_rl": {
            k: sum(cells[s, "tool"]["after_rl"][k] for s in seeds) / len(seeds)
            for k in ("tool_calls_per_response", "tool_errors_per_response", "turns_per_response")
        },
    }


def _interval(d: dict) -> str:
    return f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def table(run: dict) -> str:
    s = summary(run)
    acc = s["accuracy"]
    settings = run["settings"]
    lines = [
        f"Held-out mean@{settings['eval_samples']} on {settings['eval_prompts']} products "
        f"(temperature 1); chance {s['chance']:.5f}.",
        "",
        "| seed | warm start, tool | after RL, tool | warm start, no tool | after RL, no tool |",
        "|---|---|---|---|---|",
    ]
    for seed in s["seeds"]:
        cells = [acc[arm, when][seed] for arm in ARMS for when in ("warm_start", "after_rl")]
        lines.append(f"| {seed} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    use = s["use_after_rl"]
    lines += [
        "",
        "Means over the seeds, with 95% t intervals:",
        "",
        f"- warm start (tool) above chance: {_interval(s['warm_start_over_chance'])}",
        f"- RL gain with the tool: {_interval(s['rl_gain_tool'])}",
        f"- RL gain without the tool: {_interval(s['rl_gain_no_tool'])}",
        f"- tool over no tool after the same RL: {_interval(s['tool_over_no_tool'])}",
        f"- after RL, per response: {use['tool_calls_per_response']:.2f} tool calls, "
        f"{use['tool_errors_per_response']:.3f} tool errors, {use['turns_per_response']:.2f} turns",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit("usage: python -m epic_slime.runtime.agent_report RUN.json")
    with open(argv[0]) as f:
        sys.stdout.write(table(json.load(f)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
