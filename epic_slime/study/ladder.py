"""The policy-lag ladder: where each method breaks as update depth D and staleness K grow.

A ladder study is an ordinary study (`study.plan`) whose settings vary the lag along two axes: update
depth at K = 0 (synchronous) and staleness at D = 8 (asynchronous). This module reads the finished
runs (`study.files`) and summarises each (method, lag) cell:

- test mean@k at the last checkpoint and at the validation-selected one (mean, sd over seeds, the
  paired difference to EPIC with its 95% t interval, and the paired gain over the warm start);
- the collapse rate (`collapsed`): the share of runs whose validation score sits below the warm
  start's by more than `COLLAPSE_MARGIN` at each of the last `COLLAPSE_EVALS` evaluations;
- late-stage clip fraction, mean |log r_pre|, policy entropy, and the staleness the runs reached;
- power: the smallest paired difference the seeds could detect (80% power, two-sided 5%), from the
  observed seed-to-seed sd of the paired differences, and the seeds a 0.05 difference would need.
"""

from __future__ import annotations

import statistics

from .analysis import (
    interval_excludes_zero,
    late_stage,
    mean_sd,
    minimum_detectable_difference,
    paired_difference,
    pairs_needed,
)
from .plan import StudyConfig, setting_values

COLLAPSE_MARGIN = 0.05  # validation points below the warm start that count as "below" (noise is ~0.03)
COLLAPSE_EVALS = 2  # ... at each of this many last evaluations ("and stays there to the end")
TARGET_DIFFERENCE = 0.05
LATE_KEYS = {
    "clipfrac": "train/policy/clipfrac",
    "abs_log_r_pre": "train/policy/abs_L_mean",
    "entropy": "train/entropy",
}
STALENESS_MAX, STALENESS_MEAN = "rollout/staleness/max", "rollout/staleness/mean"


def lag_of(cfg: StudyConfig, setting: str) -> dict:
    """(D, K) of a setting: update depth, and the staleness bound (0 for a synchronous setting)."""
    v = setting_values(cfg, setting)
    k = 0 if v.get("rollout_mode") == "sync" else int(v.get("max_staleness", 2))
    return {"setting": setting, "D": int(v.get("update_depth", 8)), "K": k}


def axes(cfg: StudyConfig) -> dict[str, list[dict]]:
    """The two panels: D at K = 0, and K at D = 8 (the D = 8, K = 0 origin belongs to both)."""
    lags = [lag_of(cfg, s["name"]) for s in cfg.settings]
    return {
        "D": sorted((x for x in lags if x["K"] == 0), key=lambda x: x["D"]),
        "K": sorted((x for x in lags if x["D"] == 8), key=lambda x: x["K"]),
    }


def collapsed(
    validation_curve: list, warm_start_score: float, margin: float = COLLAPSE_MARGIN, last: int = COLLAPSE_EVALS
) -> bool:
    """True when each of the last `last` validation scores (after the warm start's own) is below the
    warm start's by more than `margin`."""
    later = [score for version, score in validation_curve if version > 0]
    if len(later) < last:
        return False
    return all(score < warm_start_score - margin for score in later[-last:])


def cell(
    results: list[dict], metrics: dict[tuple, list[dict]], warm_by_seed: dict[int, float], epic_results: list[dict]
) -> dict:
    """The summary of one (method, lag) cell from its runs (one per seed)."""
    last = {r["seed"]: r["test_at_final"] for r in results}
    sel = {r["seed"]: r["test_at_selected"] for r in results}
    out = {"n_seeds": len(results), "seeds": sorted(last)}
    out["test_last_mean"], out["test_last_sd"] = mean_sd(list(last.values()))
    out["test_sel_mean"], out["test_sel_sd"] = mean_sd(list(sel.values()))
    warm = {s: warm_by_seed[s] for s in last if s in warm_by_seed}
    if warm:
        out["gain_last_over_warm_start"] = paired_difference(last, warm)
    flags = [collapsed(r["validation_curve"], dict(map(tuple, r["validation_curve"]))[0]) for r in results]
    out["collapse_frac"] = sum(flags) / len(flags)
    if epic_results and results[0]["method"] != "epic":
        epic_last = {r["seed"]: r["test_at_final"] for r in epic_results}
        epic_sel = {r["seed"]: r["test_at_selected"] for r in epic_results}
        if set(last) & set(epic_last):
            out["diff_last_vs_epic"] = paired_difference(last, epic_last)
            out["diff_sel_vs_epic"] = paired_difference(sel, epic_sel)
    runs = [metrics[(r["method"], r["seed"])] for r in results]
    for name, key in LATE_KEYS.items():
        out[name] = statistics.fmean(statistics.fmean(row[key] for row in late_stage(rows)) for rows in runs)
    out["staleness_max"] = max(max(row.get(STALENESS_MAX, 0) for row in rows) for rows in runs)
    out["staleness_mean"] = statistics.fmean(
        statistics.fmean(row.get(STALENESS_MEAN, 0.0) for row in rows) for rows in runs
    )
    return out


def ladder_summary(cfg: StudyConfig, results: list[dict], metrics: dict[tuple, list[dict]], warm: dict) -> dict:
    """{setting: {"lag": (D, K), "methods": {method: cell}}} plus the power of the ladder."""
    warm_by_seed = {int(s): v for s, v in warm["test_by_seed"].items()}
    cells = {}
    for s in cfg.settings:
        name = s["name"]
        res = [r for r in results if r["setting"] == name]
        epic = [r for r in res if r["method"] == "epic"]
        mets = {(r["method"], r["seed"]): metrics[(name, r["method"], r["seed"])] for r in res}
        cells[name] = {
            "lag": lag_of(cfg, name),
            "methods": {
                m: cell([r for r in res if r["method"] == m], mets, warm_by_seed, epic)
                for m in cfg.methods
                if any(r["method"] == m for r in res)
            },
        }
    return {"cells": cells, "power": power(cells)}


def power(cells: dict) -> dict:
    """From the paired differences to EPIC at the last checkpoint: the observed sd of one seed's
    difference (pooled over cells: the root mean square of the cells' sds), the smallest difference
    the ladder's seed count detects, and the seeds a TARGET_DIFFERENCE needs."""
    sds, ns, spreads = [], [], []
    for c in cells.values():
        for m, d in c["methods"].items():
            if d.get("test_last_sd") is not None:
                spreads.append(d["test_last_sd"])
            diff = d.get("diff_last_vs_epic")
            if diff and diff["n"] >= 2:
                sds.append(statistics.stdev(diff["diffs"]))
                ns.append(diff["n"])
    if not sds:
        return {
            "n_seeds": max(ns, default=1),
            "pooled_diff_sd": None,
            "minimum_detectable_difference": None,
            "seeds_for_target": None,
            "target_difference": TARGET_DIFFERENCE,
            "seed_to_seed_sd_mean": statistics.fmean(spreads) if spreads else None,
        }
    pooled = (sum(x * x for x in sds) / len(sds)) ** 0.5
    n = min(ns)
    return {
        "n_seeds": n,
        "pooled_diff_sd": pooled,
        "minimum_detectable_difference": minimum_detectable_difference(pooled, n),
        "seeds_for_target": pairs_needed(TARGET_DIFFERENCE, pooled),
        "target_difference": TARGET_DIFFERENCE,
        "seed_to_seed_sd_mean": statistics.fmean(spreads) if spreads else None,
    }


def _fmt_interval(d: dict | None) -> str:
    if not d:
        return "(baseline)"
    if d["low"] is None:
        return f"{d['mean']:+.3f} (one seed)"
    mark = " *" if interval_excludes_zero(d) else ""
    return f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]{mark}"


def ladder_markdown(summary: dict, methods: list[str], k: int) -> list[str]:
    lines = [
        f"| D | K | method | seeds | test mean@{k}, last (mean ± sd) | last: method - EPIC, paired 95% | "
        f"last - warm start, paired 95% | test mean@{k}, selected | selected: method - EPIC | collapse rate | "
        "late clip fraction | mean \\|log r_pre\\| | entropy | staleness mean / max |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in summary["cells"].items():
        for m in methods:
            d = c["methods"].get(m)
            if d is None:
                continue
            sd = "n/a" if d["test_last_sd"] is None else f"{d['test_last_sd']:.3f}"
            sel_sd = "n/a" if d["test_sel_sd"] is None else f"{d['test_sel_sd']:.3f}"
            lines.append(
                f"| {c['lag']['D']} | {c['lag']['K']} | {m} | {d['n_seeds']} | {d['test_last_mean']:.3f} ± {sd} | "
                f"{_fmt_interval(d.get('diff_last_vs_epic')) if m != 'epic' else '(baseline)'} | "
                f"{_fmt_interval(d.get('gain_last_over_warm_start'))} | {d['test_sel_mean']:.3f} ± {sel_sd} | "
                f"{_fmt_interval(d.get('diff_sel_vs_epic')) if m != 'epic' else '(baseline)'} | "
                f"{d['collapse_frac']:.2f} | {d['clipfrac']:.4f} | {d['abs_log_r_pre']:.3f} | {d['entropy']:.3f} | "
                f"{d['staleness_mean']:.2f} / {d['staleness_max']:.0f} |"
            )
    return lines


def ladder_pivot_markdown(summary: dict, methods: list[str], k: int) -> list[str]:
    """The ladder at a glance: one row per method, one column per lag; each cell the last checkpoint's
    test mean@k ± sd over seeds, `*` where the paired interval to EPIC excludes 0, and the collapse rate
    when it is above 0."""
    cells = summary["cells"]
    names = list(cells)
    head = [f"D = {cells[n]['lag']['D']}, K = {cells[n]['lag']['K']}" for n in names]
    lines = ["| method | " + " | ".join(head) + " |", "|---" * (len(names) + 1) + "|"]
    for m in methods:
        row = []
        for n in names:
            d = cells[n]["methods"].get(m)
            if d is None:
                row.append("")
                continue
            sd = "" if d["test_last_sd"] is None else f" ± {d['test_last_sd']:.3f}"
            diff = d.get("diff_last_vs_epic")
            mark = " *" if diff and interval_excludes_zero(diff) else ""
            coll = f" (collapse {d['collapse_frac']:.2f})" if d["collapse_frac"] > 0 else ""
            row.append(f"{d['test_last_mean']:.3f}{sd}{mark}{coll}")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    return lines


def ladder_findings(summary: dict, methods: list[str], warm: dict) -> list[str]:
    """Plain statements computed from the table (nulls as nulls)."""
    out = []
    cells = summary["cells"]
    for name, c in cells.items():
        lag = f"D = {c['lag']['D']}, K = {c['lag']['K']}"
        learned = [
            m
            for m, d in c["methods"].items()
            if d.get("gain_last_over_warm_start")
            and interval_excludes_zero(d["gain_last_over_warm_start"])
            and d["gain_last_over_warm_start"]["mean"] > 0
        ]
        fell = [
            m
            for m, d in c["methods"].items()
            if d.get("gain_last_over_warm_start")
            and interval_excludes_zero(d["gain_last_over_warm_start"])
            and d["gain_last_over_warm_start"]["mean"] < 0
        ]
        flat = [m for m in c["methods"] if m not in learned and m not in fell]
        below = [
            m
            for m, d in c["methods"].items()
            if d.get("diff_last_vs_epic")
            and interval_excludes_zero(d["diff_last_vs_epic"])
            and d["diff_last_vs_epic"]["mean"] < 0
        ]
        above = [
            m
            for m, d in c["methods"].items()
            if d.get("diff_last_vs_epic")
            and interval_excludes_zero(d["diff_last_vs_epic"])
            and d["diff_last_vs_epic"]["mean"] > 0
        ]
        coll = [f"{m} {d['collapse_frac']:.2f}" for m, d in c["methods"].items() if d["collapse_frac"] > 0]
        text = f"{lag}: above the warm start (paired interval excludes 0): {', '.join(learned) or 'none'}"
        if fell:
            text += f"; below it: {', '.join(fell)}"
        if flat:
            text += f"; not separated from it: {', '.join(flat)}"
        text += (
            f". Against EPIC at the last checkpoint: below {', '.join(below) or 'none'}, above "
            f"{', '.join(above) or 'none'}; every other interval overlaps 0 (a null, not a tie)."
        )
        if coll:
            text += f" Collapse rate > 0: {', '.join(coll)}."
        out.append(text)
    p = summary["power"]
    if p["minimum_detectable_difference"] is not None:
        out.append(
            f"Power: with {p['n_seeds']} seeds and a pooled sd of one seed's paired difference to EPIC of "
            f"{p['pooled_diff_sd']:.3f}, the smallest difference the ladder detects with 80% power "
            f"(two-sided 5%) is {p['minimum_detectable_difference']:.3f}; a difference of "
            f"{p['target_difference']:.2f} would need {p['seeds_for_target'] or 'more than 10000'} seeds. "
            f"Mean seed-to-seed sd of a cell's test score: {p['seed_to_seed_sd_mean']:.3f}."
        )
    out.append(
        f"{len(cells)} lag settings x {len(methods)} methods were compared at once without correction for "
        f"multiple comparisons: about one interval in twenty excludes zero by chance, so a single starred "
        f"cell is exploratory."
    )
    return out
