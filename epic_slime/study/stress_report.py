"""The stress ladder's part of study.md and summary.json (numbers from `study.stress`, nothing run)."""

from __future__ import annotations

from pathlib import Path

from . import figures, stress
from .plan import setting_values, plan

HEADROOM = 0.8  # the best method at an axis's mildest level should be at most about this


def _f(x, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _stress_settings(cfg, name: str) -> dict:
    """The keys a setting changes from the shared train block (its stress), and its task."""
    values = setting_values(cfg, name)
    own = {k: v for k, v in next(s for s in cfg.settings if s["name"] == name).items() if k != "name"}
    return {
        **own,
        "task_name": values.get("task_name"),
        "lr": values.get("lr"),
        "update_depth": values.get("update_depth"),
        "max_staleness": values.get("max_staleness", 0),
    }


def stress_section(cfg, out: Path, results: list[dict], metrics: dict, warm: dict, summary: dict, k: int) -> list[str]:
    st = stress.stress_summary(cfg, results, metrics, warm)
    methods = [m for m in cfg.methods]
    cells, axes, points = st["cells"], st["axes"], st["breaking_points"]
    first = cfg.settings[0]["name"]
    warm_first = st["warm_start_by_setting"][first]
    chance = st["chance_by_setting"][first]
    figures.stress_heatmap(st, methods, warm_first, chance, k, out / "stress.png")
    n_planned = len(plan(cfg))
    complete = [
        s
        for s, c in cells.items()
        if len(c) == len(methods) and all(c[m]["n_seeds"] == len(cfg.seeds) for m in methods)
    ]
    paired = [s for s, c in cells.items() if len(c) == len(methods) and all(c[m]["n_seeds"] >= 2 for m in methods)]
    summary["stress"] = {
        "runs_finished": len(results),
        "runs_planned": n_planned,
        "cells_complete": complete,
        "cells_every_method_two_seeds": paired,
        "rule": st["rule"],
        "axes": axes,
        "hypothesis": st["hypothesis"],
        "near_breaks": st["near_breaks"],
        "cells": {
            s: {"stress": _stress_settings(cfg, s), "warm_start_test": st["warm_start_by_setting"][s], "methods": c}
            for s, c in cells.items()
        },
        "breaking_point": {m: {a: p["level"] for a, p in by_axis.items()} for m, by_axis in points.items()},
        "breaking_point_detail": points,
    }
    lines = [
        "## The stress ladder",
        "",
        f"**Finished: {len(results)} of {n_planned} planned runs; complete cells (every method, every seed): "
        f"{len(complete)} of {len(cfg.settings)}** ({', '.join(complete) or 'none'}); cells with every method "
        f"at 2 or more seeds (paired intervals): {', '.join(paired) or 'none'}. A cell with fewer seeds "
        "than planned is reported with the seeds it has; a method or level missing below did not finish.",
        "",
        "Fixed before the runs (configs and `epic_slime/study/stress.py`):",
        "",
        "- Axes, mildest first: " + "; ".join(f"**{a}**: {' -> '.join(v)}" for a, v in axes.items()) + ".",
        "- Settings: "
        + "; ".join(
            f"`{s['name']}` " + ", ".join(f"{key}={v}" for key, v in s.items() if key != "name") for s in cfg.settings
        )
        + ".",
        f"- A cell **breaks** when at least {stress.BREAK_COLLAPSE_FRAC:.0%} of its seeds collapse (validation "
        f"below the warm start's by more than 0.05 at each of the last 2 evaluations, or the run diverged), or "
        f"when its mean test mean@{k} at the last checkpoint is below its own warm start's (same task, same "
        f"seeds) by more than {stress.BREAK_MARGIN}. A method's **breaking point** on an axis is the mildest "
        "level at which it breaks. A cell whose warm start lies within "
        f"{stress.BREAK_MARGIN} of its task's chance level is **untestable** (it has no room to fall by the "
        "margin) and breaks nowhere; its level does not count as finished. (This last clause was added after "
        "the runs, when the long task's warm start stayed at chance; it changes no other cell.)",
        "- Hypothesis (the paper's): *EPIC stays above the warm start at stresses where GRPO and GSPO "
        "collapse*. Tested on every cell where GRPO or GSPO breaks: the pooled paired difference EPIC - warm "
        "start (one pair per cell and seed), 95% t interval. Rejected when the interval lies below 0 or EPIC "
        "breaks at half or more of those cells; supported when it lies above 0 and EPIC breaks at none; "
        "otherwise not rejected (a null).",
        "",
    ]
    lines += _headroom_lines(cells, axes, methods)
    lines += [
        f"Test mean@{k} at the last checkpoint, mean ± sd over seeds; **B**: the cell breaks; "
        "(c x): collapse rate; `*`: the paired 95% interval to EPIC excludes 0. Warm start per setting in the "
        "last row.",
        "",
        *_pivot(cells, cfg, methods, st["warm_start_by_setting"], set(st["untestable_settings"])),
        "",
        "![stress ladder](stress.png)",
        "",
        "### Breaking points",
        "",
        *_points_table(points, axes, methods),
        "",
        "Paired difference to EPIC (last checkpoint, 95% t interval) next to each breaking point "
        "(offset -1: the level before it, 0: at it, +1: after it):",
        "",
        *_near_lines(st["near_breaks"]),
        "",
        "### The mechanism per cell (late stage: last 25% of steps, mean over seeds)",
        "",
        *_mechanism_table(cells, cfg, methods),
        "",
        "### The hypothesis",
        "",
        *_hypothesis_lines(st["hypothesis"]),
        "",
        "### Which method is most robust",
        "",
        *_robust_lines(st, methods),
        "",
    ]
    return lines


def _headroom_lines(cells, axes, methods) -> list[str]:
    out = []
    for axis, levels in axes.items():
        c = cells.get(levels[0], {})
        if c:
            best = max(c, key=lambda m: c[m]["test_last_mean"])
            ok = "leaves headroom" if c[best]["test_last_mean"] <= HEADROOM + 0.02 else "leaves little headroom"
            out.append(
                f"Headroom on **{axis}** (mildest level `{levels[0]}`): the best method, {best}, reaches "
                f"{c[best]['test_last_mean']:.3f}: {ok} (target at most about {HEADROOM})."
            )
    return out + [""] if out else []


def _pivot(cells, cfg, methods, warm_by_setting, at_chance: set[str]) -> list[str]:
    names = [s["name"] for s in cfg.settings]
    lines = ["| method | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for m in methods:
        row = []
        for n in names:
            d = cells.get(n, {}).get(m)
            if d is None:
                row.append("")
                continue
            sd = "" if d["test_last_sd"] is None else f" ± {d['test_last_sd']:.2f}"
            star = " *" if d.get("diff_vs_epic") and stress.interval_excludes_zero(d["diff_vs_epic"]) else ""
            coll = f" (c {d['collapse_frac']:.2f})" if d["collapse_frac"] > 0 else ""
            row.append(f"{'**B** ' if d['breaks'] else ''}{d['test_last_mean']:.3f}{sd}{star}{coll}")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    lines.append(
        "| *warm start* | "
        + " | ".join(_f(warm_by_setting[n]) + (" (at chance: untestable)" if n in at_chance else "") for n in names)
        + " |"
    )
    return lines


def _points_table(points, axes, methods) -> list[str]:
    lines = ["| method | " + " | ".join(axes) + " |", "|---" * (len(axes) + 1) + "|"]
    for m in methods:
        row = []
        for a in axes:
            p = points[m][a]
            if p["level"] is not None:
                row.append(
                    f"{p['level']}" + (" (provisional: a milder level has not finished)" if p["provisional"] else "")
                )
            else:
                gap = f"; {', '.join(p['untestable'])} untestable, at chance" if p.get("untestable") else ""
                row.append(f"none ({p['finished_levels']} of {p['levels']} levels finished{gap})")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    return lines


def _near_lines(rows) -> list[str]:
    if not rows:
        return ["No method other than EPIC broke on the finished cells: nothing to compare."]
    lines = ["| method | axis | setting | offset | method - EPIC | EPIC breaks there |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['axis']} | {r['setting']} | {r['offset']:+d} | "
            f"{stress.interval_text(r['diff_vs_epic'])} | {r['epic_breaks']} |"
        )
    return lines


def _gap(x) -> str:
    return "" if x is None else f"{x:.1e}"


def _mechanism_table(cells, cfg, methods) -> list[str]:
    lines = [
        "| setting | method | mean \\|log r\\| / token | \\|L_t\\| at 50% | \\|L_t\\| at 90% | clip (mask) frac | "
        "upper / lower | gradient removed | entropy | lag reached | step-start gap | failed runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in [x["name"] for x in cfg.settings]:
        for m in methods:
            d = cells.get(s, {}).get(m)
            if d is None:
                continue
            lines.append(
                f"| {s} | {m} | {_f(d['mean_abs_log_ratio'], 4)} | {_f(d['prefix_log_ratio_p50'])} | "
                f"{_f(d['prefix_log_ratio_p90'])} | {_f(d['clipfrac'], 4)} | {_f(d['clipfrac_upper'], 4)} / "
                f"{_f(d['clipfrac_lower'], 4)} | {_f(d['grad_removed_frac'])} | {_f(d['entropy'])} | "
                f"{_f(d.get('lag_mean'), 2)} | {_gap(d.get('train_gap'))} | {d['failed_runs']} |"
            )
    return lines


def _hypothesis_lines(h) -> list[str]:
    if h["verdict"] == "untested":
        return [f"**Untested**: {h['reason']}. Cells where GRPO or GSPO break: {', '.join(h['cells']) or 'none'}."]
    return [
        f"Cells where GRPO or GSPO break: {', '.join(h['cells'])}; EPIC breaks at "
        f"{', '.join(h['epic_breaks_at']) or 'none of them'}. EPIC - warm start over {h['pairs']} (cell, seed) "
        f"pairs: {h['mean']:+.3f} [{h['low']:+.3f}, {h['high']:+.3f}] (sd {h['sd']:.3f}). **Verdict: "
        f"{h['verdict']}.** Power: with these pairs and this sd, a true drop below the warm start of "
        f"{_f(h['minimum_detectable_drop'])} or more would be detected with 80% power (two-sided 5%); a smaller "
        "one could hide in a 'not rejected'."
    ]


def _robust_lines(st, methods) -> list[str]:
    ranking = stress.robustness_ranking(st, methods)
    if not ranking:
        return ["No finished cells."]
    best, broken, score = ranking[0]
    epic_rank = next((i for i, r in enumerate(ranking) if r[0] == "epic"), None)
    lines = [
        "Ranked by the axes a method breaks on (fewest first), then how late it breaks, then its mean last "
        "test score over the cells every method finished: "
        + ", ".join(f"{m} ({b} broken, {s:.3f})" for m, b, s in ranking)
        + "."
    ]
    if len({(b, round(s, 2)) for _, b, s in ranking}) == 1 or all(
        abs(s - score) < 0.03 and b == broken for _, b, s in ranking
    ):
        lines.append(
            "The ranking does not separate the methods: every method breaks on the same axes and their "
            "mean scores are within 0.03 of each other (a null, not a ranking)."
        )
    if best != "epic" and not any(
        c.get(best, {}).get("diff_vs_epic") and stress.interval_excludes_zero(c[best]["diff_vs_epic"])
        for c in st["cells"].values()
    ):
        lines.append(
            f"No paired interval between {best} and EPIC excludes 0 on any finished cell: the order is "
            "not significant at these seeds."
        )
    harsh = [levels[-1] for levels in st["axes"].values()]
    diag, numbers = [], {}
    for m in dict.fromkeys([best, "epic"]):
        vals = [st["cells"][s][m] for s in harsh if m in st["cells"].get(s, {})]
        if vals:

            def avg(key):
                xs = [v[key] for v in vals if v[key] is not None]
                return sum(xs) / len(xs) if xs else None

            numbers[m] = {k: avg(k) for k in ("grad_removed_frac", "mean_abs_log_ratio")}
            diag.append(
                f"{m} at the harshest finished levels: clip fraction {_f(avg('clipfrac'), 4)}, gradient "
                f"removed {_f(avg('grad_removed_frac'))}, mean |log r| {_f(avg('mean_abs_log_ratio'), 4)}, "
                f"|L_t| at 90% {_f(avg('prefix_log_ratio_p90'))}, entropy {_f(avg('entropy'))}"
            )
    if epic_rank == 0:
        lines.append("EPIC ranks first. " + "; ".join(diag) + ".")
        return lines
    lines.append(
        f"EPIC is not ranked first: {best} is, EPIC ranks "
        f"{epic_rank + 1 if epic_rank is not None else 'n/a'} of {len(ranking)}. " + "; ".join(diag) + "."
    )
    b, e = numbers.get(best), numbers.get("epic")
    if b and e and None not in (*b.values(), *e.values()):
        if e["grad_removed_frac"] > b["grad_removed_frac"] and e["mean_abs_log_ratio"] < b["mean_abs_log_ratio"]:
            lines.append(
                f"EPIC's bound removes more of the gradient there ({e['grad_removed_frac']:.3f} vs "
                f"{b['grad_removed_frac']:.3f}) and keeps the drift smaller ({e['mean_abs_log_ratio']:.4f} vs "
                f"{b['mean_abs_log_ratio']:.4f}), yet that did not keep it above {best}: restraining the "
                "drift was not what decided the score at these cells."
            )
        elif e["grad_removed_frac"] < b["grad_removed_frac"]:
            lines.append(
                f"{best} removes more of the gradient there than EPIC ({b['grad_removed_frac']:.3f} vs "
                f"{e['grad_removed_frac']:.3f}): its tighter bound is the likelier reason it holds on."
            )
    return lines
