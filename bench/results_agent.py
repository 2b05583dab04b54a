"""docs/results.md's table of the calc agent on the runtime's own loop (bench/make_results.py, section
``agent_runtime``): the committed end-of-run files of `epic-slime train --config configs/local/agent_calc.yaml
--seed S` for the seeds fixed in advance, and the RL gain over them with its 95% t interval."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEEDS_DIR = REPO / "docs" / "agent_task" / "runtime_seeds"
SEEDS = (1, 2, 3)  # fixed before the runs: docs/agent_task/runtime_seeds/README.md


def read_seeds(root: Path = SEEDS_DIR) -> dict[int, dict]:
    """seed -> its summary.json, with its config.json under "config"; a seed of SEEDS without them is an
    error naming the file."""
    out = {}
    for seed in SEEDS:
        folder = root / f"s{seed}"
        for name in ("summary.json", "config.json"):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"{folder / name}: the agent run of seed {seed} is missing (run {root}/run.sh)")
        out[seed] = {
            **json.loads((folder / "summary.json").read_text()),
            "config": json.loads((folder / "config.json").read_text()),
        }
        if out[seed]["config"]["seed"] != seed:
            raise ValueError(f"{folder / 'config.json'}: seed {out[seed]['config']['seed']}, expected {seed}")
    return out


def agent_runtime(root: Path = SEEDS_DIR) -> list[str]:
    from epic_slime.runtime import task_calc
    from epic_slime.study.analysis import paired_difference

    runs = read_seeds(root)
    start = {s: r["eval_start"] for s, r in runs.items()}
    final = {s: r["eval_final"] for s, r in runs.items()}
    gain = paired_difference(final, start)
    chance = task_calc.chance()
    lines = [
        "| seed | held-out mean@4 at the warm start | after RL (step) | gain | tool calls, errors, turns per response "
        "| staleness max (K) | samples dropped, lost |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed, r in runs.items():
        tool = r["eval_final_tool"]
        lines.append(
            f"| {seed} | {r['eval_start']:.3f} | {r['eval_final']:.3f} ({r['eval_final_step']}) "
            f"| {r['eval_final'] - r['eval_start']:+.3f} | {tool['tool_calls_per_response']:.2f}, "
            f"{tool['tool_errors_per_response']:.3f}, {tool['turns_per_response']:.2f} "
            f"| {r['staleness_max']} ({r['config']['max_staleness']}) "
            f"| {r['accounting/dropped']}, {r['accounting/lost']} |"
        )
    lines += [
        "",
        f"RL gain over the {gain['n']} seeds: {gain['mean']:+.3f}, 95% t interval "
        f"[{gain['low']:+.3f}, {gain['high']:+.3f}]. Chance (a uniform guess over the products): {chance:.5f}; "
        f"the warm start is {min(start.values()) - chance:+.3f} or more above it.",
        "Source: " + ", ".join(f"`{(root / f's{s}' / 'summary.json').relative_to(REPO)}`" for s in runs) + ".",
    ]
    return lines
