"""The behaviour (rollout) policy's reward beside each cell's scores (issue 47).

A method can only learn from what its rollouts contain: a cell whose rollout policy is at chance before
any update cannot show whether a loss protects learning. So for every cell (setting x method) the report
gives the reward of its rollouts, `rollout/raw_reward` of the run's metrics: at the first rollout (the
behaviour policy before any update: the warm start as the rollout engine runs it, mismatch included),
averaged over the run's rollouts, and at the last. Per setting, the first-rollout reward pooled over every
run, and its fraction of the clean setting's: the setting with the same train keys and no mismatch key
(`MISMATCH_KEYS`); the gate of issue 47 is `GATE_FRACTION` of it.
"""

from __future__ import annotations

import statistics

from .analysis import paired_difference
from .calibration import GATE_FRACTION, meets_gate
from .plan import setting_values

REWARD_KEY = "rollout/raw_reward"
MISMATCH_KEYS = ("rollout_router_noise", "rollout_dtype", "use_tis", "behavior_logprobs")


def _rewards(rows: list[dict]) -> list[float]:
    return [r[REWARD_KEY] for r in rows if r.get(REWARD_KEY) is not None]


def clean_setting(cfg, setting: str) -> str | None:
    """The setting with `setting`'s train keys less its mismatch keys, and none of its own; None if absent."""
    strip = {k: v for k, v in setting_values(cfg, setting).items() if k not in MISMATCH_KEYS}
    for s in cfg.settings:  # a setting with a mismatch key of its own differs from `strip` in it
        if setting_values(cfg, s["name"]) == strip:
            return s["name"]
    return None


def rollout_reward_cells(cfg, metrics: dict[tuple, list[dict]], results: list[dict], warm: dict | None = None) -> dict:
    """{setting: {"first": pooled first-rollout reward, "clean": name, "of_clean": fraction, "passes_gate",
    "methods": {method: {"first", "mean", "last", "test_final", "seeds", "gain"}}}} over finished runs;
    "gain": test at the last checkpoint minus the setting's warm start, paired by seed, with its 95% t
    interval (when `warm`, the study's warm_start.json, scores that setting's warm start per seed)."""
    test = {(r["setting"], r["method"], r["seed"]): r["test_at_final"] for r in results}
    warm_by = (warm or {}).get("by_setting", {})
    cells: dict = {}
    for (setting, method, seed), rows in sorted(metrics.items()):
        rewards = _rewards(rows)
        if not rewards:
            continue
        cell = cells.setdefault(setting, {"methods": {}}).setdefault("methods", {}).setdefault(method, {"runs": []})
        cell["runs"].append((rewards[0], statistics.fmean(rewards), rewards[-1], test[(setting, method, seed)], seed))
    for setting, entry in cells.items():
        firsts = []
        for method, cell in entry["methods"].items():
            runs = cell.pop("runs")
            firsts += [r[0] for r in runs]
            cell.update({k: statistics.fmean(r[i] for r in runs) for i, k in enumerate(("first", "mean", "last"))})
            cell["test_final"] = statistics.fmean(r[3] for r in runs)
            cell["seeds"] = len(runs)
            start = {int(k): v for k, v in warm_by.get(setting, {}).get("test_by_seed", {}).items()}
            if start and set(start) >= {r[4] for r in runs}:
                d = paired_difference({r[4]: r[3] for r in runs}, start)
                cell["gain"] = {k: d[k] for k in ("mean", "low", "high", "n")}
        entry["first"] = statistics.fmean(firsts)
    for setting, entry in cells.items():
        clean = clean_setting(cfg, setting)
        entry["clean"] = clean
        if clean != setting and clean in cells and cells[clean]["first"] > 0:
            entry["of_clean"] = entry["first"] / cells[clean]["first"]
            entry["passes_gate"] = meets_gate(entry["first"], cells[clean]["first"])
    return cells


def _gain(c: dict) -> str:
    g = c.get("gain")
    if not g:
        return ""
    return (
        f" ({g['mean']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}])" if g["low"] is not None else f" ({g['mean']:+.3f})"
    )


def behaviour_section(cfg, metrics: dict, results: list[dict], summary: dict, warm: dict | None = None) -> list[str]:
    cells = rollout_reward_cells(cfg, metrics, results, warm)
    summary["rollout_reward"] = cells
    if not cells:
        return []
    methods = [m for m in cfg.methods if any(m in c["methods"] for c in cells.values())]
    lines = [
        "## Rollout (behaviour) reward beside the scores",
        "",
        "Reward of each cell's own rollouts (`rollout/raw_reward`, mean over seeds): at the first rollout (the "
        "behaviour policy before any update, mismatch included) / mean over the run's rollouts; then test "
        "mean@k at the last checkpoint and, in brackets, its gain over the setting's warm start (paired by seed, 95% t interval). Per setting: the first-rollout reward over every run, its fraction of "
        f"the clean setting's (same train keys, no mismatch), and whether it passes issue 47's gate (at least "
        f"{GATE_FRACTION:.0%} of clean).",
        "",
        "| setting | first rollout | of clean | gate | "
        + " | ".join(f"{m}: rollout first / mean; test" for m in methods)
        + " |",
        "|---|---|---|---|" + "---|" * len(methods),
    ]
    for setting in [s["name"] for s in cfg.settings if s["name"] in cells]:
        e = cells[setting]
        frac = (
            f"{e['of_clean']:.0%} of {e['clean']}" if "of_clean" in e else "(clean)" if e["clean"] == setting else "n/a"
        )
        gate = ("passes" if e["passes_gate"] else "**fails**") if "passes_gate" in e else "-"
        per = [
            f"{c['first']:.3f} / {c['mean']:.3f}; {c['test_final']:.3f}{_gain(c)}" if (c := e["methods"].get(m)) else ""
            for m in methods
        ]
        lines.append(f"| {setting} | {e['first']:.3f} | {frac} | {gate} | " + " | ".join(per) + " |")
    return lines + [""]
