"""docs/results.md's table of the graded mismatch study (issue 47; bench/make_results.py, section
``graded``): per level the behaviour policy's rollout reward, the step-start gap and each method's held-out score
at the last checkpoint, then the pre-registered contrast, all read from the study's committed summary.json."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUMMARY = REPO / "docs" / "study" / "mismatch_graded" / "summary.json"


def graded(path: Path = SUMMARY) -> list[str]:
    s = json.loads(path.read_text())
    lines = [
        "| level | step-start gap, mean per token | rollout reward before training | EPIC, last checkpoint | GRPO, last "
        "checkpoint | seeds |",
        "|---|---|---|---|---|---|",
    ]
    for level, cell in s["settings"].items():
        rows = {r["method"]: r for r in cell["table1"]}
        seeds = sorted({len(r["seeds"]) for r in rows.values()})
        lines.append(
            f"| {level} | {s['gap_by_setting'][level]['mean']:.2e} | {s['rollout_reward'][level]['first']:.3f} "
            f"| {rows['epic']['test_final_mean']:.3f} | {rows['grpo']['test_final_mean']:.3f} "
            f"| {', '.join(map(str, seeds))} |"
        )
    lines += [
        "",
        "| contrast | seeds | mean | 95% t interval | exact sign-flip p | smallest detectable (80%) | verdict |",
    ]
    lines.append("|---|---|---|---|---|---|---|")
    for c in s["contrast"]:
        lines.append(
            f"| ({c['method']} - {c['baseline']})[{c['target']}] - ({c['method']} - {c['baseline']})[{c['reference']}] "
            f"| {c['n']} | {c['mean']:+.3f} | [{c['low']:+.3f}, {c['high']:+.3f}] | {c['sign_flip_p']:.3f} "
            f"| {c['mdd_80']:.3f} | {c['verdict']} |"
        )
    lines += [
        "",
        f"Chance {s['chance']:.3f}; the warm start scores {s['warm_start_test']:.3f} on the test split.",
        f"Source: `{path.relative_to(REPO)}`.",
    ]
    return lines
