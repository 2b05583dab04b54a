"""The stress ladder: push the policy off-policy until methods break, and say where each one breaks.

A stress study is an ordinary study (`study.plan`) whose config names its axes (`stress.axes`: each an
ordered list of settings, mildest first): the learning rate, the update depth at a large rate, the
staleness bound, and the response length (a long-response task). This module reads the finished runs
(`study.files`) and the warm starts (`warm_start.json`, `by_setting`: each setting's own task) and
computes, with the rules fixed before the runs (`BREAK_MARGIN`, `BREAK_COLLAPSE_FRAC`):

- per (method, setting) cell: test mean@k at the last checkpoint (mean, sd), collapse rate, the paired
  difference to EPIC, and the mechanism in the late stage (last 25% of steps): mean |log r| per token,
  |L_t| at 50% / 90% of the response, each trust region's clip (or mask) fraction, entropy and the
  share of the gradient weight the bound removed; `breaks` per the rule below;
- per method and axis: the breaking point (the mildest level at which it breaks), and the paired
  comparison with EPIC at the levels next to it;
- the paper's hypothesis as a test: "EPIC stays above the warm start at stresses where GRPO and GSPO
  collapse", with its power.

Breaking rule: a cell breaks when at least `BREAK_COLLAPSE_FRAC` of its seeds collapse (`ladder.collapsed`,
or the run diverged), or when its mean test score at the last checkpoint is below the mean test score of
its warm start (same seeds, same task) by more than `BREAK_MARGIN`. A cell whose warm start is within
`BREAK_MARGIN` of its task's chance level is **untestable**: there is no room to fall below it by the
margin, so it breaks nowhere and does not count as a finished level (a result at chance is no result).
"""

from __future__ import annotations

import statistics

from .analysis import (
    interval_excludes_zero,
    late_stage,
    mean_sd,
    minimum_detectable_difference,
    paired_difference,
    t_quantile_975,
)
from .ladder import collapsed

BREAK_MARGIN = 0.05  # test below the warm start by more than this breaks (noise of a cell mean ~0.02-0.03)
BREAK_COLLAPSE_FRAC = 0.5  # ... or at least this share of the seeds collapsed
HYPOTHESIS_BASELINES = ("grpo", "gspo")
MECHANISM = {  # summary name: logged metric (late-stage mean)
    "mean_abs_log_ratio": "train/policy/logprob_abs_diff",
    "prefix_log_ratio_p50": "train/policy/abs_L_p50_position",
    "prefix_log_ratio_p90": "train/policy/abs_L_p90_position",
    "abs_L_mean": "train/policy/abs_L_mean",
    "clipfrac": "train/policy/clipfrac",
    "clipfrac_upper": "train/policy/clipfrac_upper",
    "clipfrac_lower": "train/policy/clipfrac_lower",
    "grad_removed_frac": "train/policy/grad_removed_frac",
    "entropy": "train/entropy",
    "lag_mean": "rollout/staleness/mean",  # the lag actually reached (a buffer ramps up)
    "train_gap": "train/logprob_abs_diff_step_start",  # the train-inference gap at the step start
}


def _late_mean(rows: list[dict], key: str) -> float | None:
    values = [row[key] for row in late_stage(rows) if key in row]
    return statistics.fmean(values) if values else None


def run_collapsed(result: dict) -> bool:
    """A diverged run, or one whose validation stays below its warm start's to the end."""
    curve = result["validation_curve"]
    return bool(result.get("failed")) or collapsed(curve, dict(map(tuple, curve))[0])


def stress_cell(
    results: list[dict],
    metrics: dict[int, list[dict]],
    warm_by_seed: dict[int, float],
    epic: list[dict],
    chance: float | None = None,
) -> dict:
    """One (method, setting) cell from its runs (one per seed); metrics: seed -> metrics.jsonl rows;
    chance: the task's chance level (None: unknown, the cell counts as testable)."""
    last = {r["seed"]: r["test_at_final"] for r in results}
    out = {"n_seeds": len(results), "seeds": sorted(last)}
    out["test_last_mean"], out["test_last_sd"] = mean_sd(list(last.values()))
    warm = {s: warm_by_seed[s] for s in last if s in warm_by_seed}
    out["warm_start_mean"] = statistics.fmean(warm.values()) if warm else None
    out["gain_over_warm_start"] = paired_difference(last, warm) if warm else None
    out["collapse_frac"] = sum(map(run_collapsed, results)) / len(results)
    out["failed_runs"] = sum(bool(r.get("failed")) for r in results)
    if epic and results[0]["method"] != "epic":
        epic_last = {r["seed"]: r["test_at_final"] for r in epic}
        out["diff_vs_epic"] = paired_difference(last, epic_last) if set(last) & set(epic_last) else None
    for name, key in MECHANISM.items():
        per_run = [v for v in (_late_mean(metrics[r["seed"]], key) for r in results) if v is not None]
        out[name] = statistics.fmean(per_run) if per_run else None
    out["chance"] = chance
    out["testable"] = testable(out["warm_start_mean"], chance)
    out["breaks"] = breaks(out)
    return out


def testable(warm_start_mean: float | None, chance: float | None) -> bool:
    """Whether a cell can break by the margin rule: its warm start lies more than BREAK_MARGIN above chance."""
    return warm_start_mean is None or chance is None or warm_start_mean - chance > BREAK_MARGIN


def breaks(cell: dict) -> bool:
    """The breaking rule (fixed before the runs; see the module docstring); an untestable cell never breaks."""
    if not cell.get("testable", True):
        return False
    below = cell["warm_start_mean"] is not None and cell["test_last_mean"] < cell["warm_start_mean"] - BREAK_MARGIN
    return cell["collapse_frac"] >= BREAK_COLLAPSE_FRAC or below


def breaking_points(cells: dict, axes: dict[str, list[str]], methods: list[str]) -> dict:
    """{method: {axis: {"level": setting or None, "index": i or None, "finished_levels": n, "provisional",
    "untestable": [setting, ...]}}}: the mildest finished level of each axis at which the method breaks
    (None: on no finished level); provisional when a milder level (or, with no break, any level) has not
    finished or is untestable (its warm start at chance)."""
    out = {}
    for m in methods:
        out[m] = {}
        for axis, levels in axes.items():
            untestable = [s for s in levels if m in cells.get(s, {}) and not cells[s][m].get("testable", True)]
            done = [s for s in levels if m in cells.get(s, {}) and s not in untestable]
            hit = next((i for i, s in enumerate(levels) if m in cells.get(s, {}) and cells[s][m]["breaks"]), None)
            # provisional: a milder level has not finished, so the method might break earlier
            milder = levels if hit is None else levels[:hit]
            out[m][axis] = {
                "level": None if hit is None else levels[hit],
                "index": hit,
                "finished_levels": len(done),
                "levels": len(levels),
                "untestable": untestable,
                "provisional": any(m not in cells.get(s, {}) or s in untestable for s in milder),
            }
    return out


def comparisons_near_breaks(cells: dict, axes: dict[str, list[str]], points: dict) -> list[dict]:
    """For each method's breaking point: its paired difference to EPIC at the level before, at, and
    after it (those that finished)."""
    rows = []
    for m, by_axis in points.items():
        if m == "epic":
            continue
        for axis, p in by_axis.items():
            if p["index"] is None:
                continue
            levels = axes[axis]
            for i in range(max(p["index"] - 1, 0), min(p["index"] + 2, len(levels))):
                c = cells.get(levels[i], {}).get(m)
                if c is not None and c.get("diff_vs_epic"):
                    rows.append(
                        {
                            "method": m,
                            "axis": axis,
                            "setting": levels[i],
                            "offset": i - p["index"],
                            "diff_vs_epic": c["diff_vs_epic"],
                            "epic_breaks": cells[levels[i]]["epic"]["breaks"] if "epic" in cells[levels[i]] else None,
                        }
                    )
    return rows


def hypothesis_test(cells: dict, runs: dict[tuple, dict], warm: dict[str, dict[int, float]]) -> dict:
    """ "EPIC stays above the warm start at stresses where GRPO and GSPO collapse."

    The cells: every setting where GRPO or GSPO breaks. Per (cell, seed) the paired difference EPIC's
    last test score - the warm start's; pooled, its mean and 95% t interval. The hypothesis is rejected
    when the interval lies below 0, or EPIC itself breaks at half or more of those cells; supported when
    the interval lies above 0 and EPIC breaks at none; otherwise neither (a null). Power: the smallest
    drop below the warm start the pooled pairs detect (80%, two-sided 5%), from their observed sd."""
    where = [s for s, c in cells.items() if any(c.get(b, {}).get("breaks") for b in HYPOTHESIS_BASELINES)]
    out = {"cells": where, "baselines": list(HYPOTHESIS_BASELINES)}
    diffs, epic_breaks = [], []
    for s in where:
        if "epic" not in cells[s]:
            continue
        epic_breaks.append(cells[s]["epic"]["breaks"])
        for seed, w in warm[s].items():
            r = runs.get((s, "epic", seed))
            if r is not None:
                diffs.append(r["test_at_final"] - w)
    out["epic_breaks_at"] = [s for s, b in zip([s for s in where if "epic" in cells[s]], epic_breaks) if b]
    out["pairs"] = len(diffs)
    if len(diffs) < 2:
        out.update(
            verdict="untested",
            reason="GRPO and GSPO broke nowhere on the finished cells"
            if not where
            else "fewer than 2 (cell, seed) pairs of EPIC runs there",
            mean=None,
            low=None,
            high=None,
            minimum_detectable_drop=None,
        )
        return out
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    half = t_quantile_975(len(diffs) - 1) * sd / len(diffs) ** 0.5
    out.update(
        mean=mean,
        sd=sd,
        low=mean - half,
        high=mean + half,
        minimum_detectable_drop=minimum_detectable_difference(sd, len(diffs)) if sd > 0 else 0.0,
    )
    if mean + half < 0 or (epic_breaks and sum(epic_breaks) >= len(epic_breaks) / 2):
        out["verdict"] = "rejected"
    elif mean - half > 0 and not any(epic_breaks):
        out["verdict"] = "supported"
    else:
        out["verdict"] = "not rejected"
    return out


def stress_summary(cfg, results: list[dict], metrics: dict[tuple, list[dict]], warm_record: dict) -> dict:
    """cells {setting: {method: cell}}, breaking points, comparisons near them, the hypothesis test."""
    # each setting's own warm start; a record from before by_setting existed holds one warm start for all
    by_setting = warm_record.get("by_setting")
    pick = (lambda name: by_setting.get(name)) if by_setting is not None else (lambda name: warm_record)
    warm = {
        s["name"]: {int(k): v for k, v in (pick(s["name"]) or {"test_by_seed": {}})["test_by_seed"].items()}
        for s in cfg.settings
    }
    chance = {
        s["name"]: (pick(s["name"]) or {}).get("chance", (warm_record.get("chance_test") or {}).get("chance"))
        for s in cfg.settings
    }
    runs = {(r["setting"], r["method"], r["seed"]): r for r in results}
    cells = {}
    for s in cfg.settings:
        name = s["name"]
        res = [r for r in results if r["setting"] == name]
        epic = [r for r in res if r["method"] == "epic"]
        cells[name] = {}
        for m in cfg.methods:
            mine = [r for r in res if r["method"] == m]
            if mine:
                cells[name][m] = stress_cell(
                    mine, {r["seed"]: metrics[(name, m, r["seed"])] for r in mine}, warm[name], epic, chance[name]
                )
    axes = cfg.stress["axes"]
    points = breaking_points(cells, axes, cfg.methods)
    return {
        "cells": cells,
        "axes": axes,
        "breaking_points": points,
        "near_breaks": comparisons_near_breaks(cells, axes, points),
        "hypothesis": hypothesis_test(cells, runs, warm),
        "warm_start_by_setting": {s: statistics.fmean(w.values()) if w else None for s, w in warm.items()},
        "chance_by_setting": chance,
        # a setting is untestable when its warm start is at chance (every method's cell shares it)
        "untestable_settings": [s for s, c in cells.items() if any(not x["testable"] for x in c.values())],
        "rule": {"break_margin": BREAK_MARGIN, "break_collapse_frac": BREAK_COLLAPSE_FRAC},
    }


def robustness_ranking(summary: dict, methods: list[str]) -> list[tuple[str, int, float]]:
    """(method, breaking points found, mean last test score over the cells every method finished with
    the same seeds), most robust first: fewest axes broken, then the later its breaks, then the higher
    its mean score."""
    rows = []
    # the mean over the cells every method has (a cell half finished would favour the methods in it)
    common = [
        c
        for c in summary["cells"].values()
        if all(m in c for m in methods) and len({c[m]["n_seeds"] for m in methods}) == 1
    ]
    for m in methods:
        pts = summary["breaking_points"][m].values()
        broken = sum(p["index"] is not None for p in pts)
        lateness = sum(p["index"] for p in pts if p["index"] is not None)
        scores = [c[m]["test_last_mean"] for c in common]
        if scores:
            rows.append((m, broken, -lateness, statistics.fmean(scores)))
    rows.sort(key=lambda x: (x[1], x[2], -x[3]))
    return [(m, b, s) for m, b, _, s in rows]


def interval_text(d: dict | None) -> str:
    if not d:
        return "n/a"
    if d["low"] is None:
        return f"{d['mean']:+.3f} (one seed)"
    return f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]" + (" *" if interval_excludes_zero(d) else "")
