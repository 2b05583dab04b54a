"""study.md, summary.json and the figures, from the runs' result.json and metrics.jsonl."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from . import figures, ladder
from .analysis import (
    bootstrap_mean_interval,
    interval_excludes_zero,
    late_stage,
    mean_sd,
    paired_difference,
    position_profile,
)
from .files import read_provenance, read_warm_start, run_metrics
from .plan import plan

# The paper's late-stage position CV of the clip fraction (Fig. 3a), for the comparison in words.
PAPER_POSITION_CV = {"epic": 0.054, "ctpo": 0.085, "ripo": 0.126}
SPARSE_CLIPFRAC = 0.005  # below this late-stage clip fraction a position CV is noise from a few tokens
LATE = {
    "entropy": "train/entropy",
    "grad_norm": "train/grad_norm",
    "logprob_gap": "train/logprob_abs_diff_step_start",
    "abs_log_r_pre": "train/policy/abs_L_mean",
}


def _fmt(x, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def method_rows(results: list[dict], methods: list[str]) -> list[dict]:
    """Table 1 rows of one setting: per method the seeds' scores, mean, sd, paired difference to EPIC."""
    by = {m: {r["seed"]: r for r in results if r["method"] == m} for m in methods}
    epic = {s: r["test_at_selected"] for s, r in by["epic"].items()}
    epic_val = {s: r["validation_at_selected"] for s, r in by["epic"].items()}
    epic_final = {s: r["test_at_final"] for s, r in by["epic"].items()}
    rows = []
    for m in methods:
        if not by[m]:
            continue
        test = {s: r["test_at_selected"] for s, r in by[m].items()}
        val = {s: r["validation_at_selected"] for s, r in by[m].items()}
        final = {s: r["test_at_final"] for s, r in by[m].items()}
        t_mean, t_sd = mean_sd(list(test.values()))
        row = {
            "method": m,
            "k": next(iter(by[m].values()))["k"],
            "seeds": sorted(test),
            "test_by_seed": test,
            "test_mean": t_mean,
            "test_sd": t_sd,
            "validation_mean": statistics.fmean(val.values()),
            "test_final_mean": statistics.fmean(final.values()),
            "selected_versions": {s: r["selected_version"] for s, r in by[m].items()},
        }
        if m != "epic" and set(test) & set(epic):
            row["diff_test"] = paired_difference(test, epic)
            row["diff_validation"] = paired_difference(val, epic_val)
            # without selection: a collapse late in training shows here, while selection can hide it
            # behind an early checkpoint (or the warm start)
            row["diff_test_final"] = paired_difference(final, epic_final)
        rows.append(row)
    return rows


def diagnostics(metrics: dict[tuple, list[dict]], results: list[dict], methods: list[str]) -> dict[str, dict]:
    """Per method: late-stage position profile (bins averaged over seeds, CV = mean of the seeds' CVs),
    finite-lower coverage, late-stage entropy / grad norm / log-prob gap / |log r_pre|; plus the runs.
    metrics: each run's metrics.jsonl rows by (setting, method, seed)."""
    diag = {}
    for m in methods:
        runs = [metrics[(r["setting"], r["method"], r["seed"])] for r in results if r["method"] == m]
        if not runs:
            continue
        profs = [position_profile(rows) for rows in runs]
        d = {
            "bins": [statistics.fmean(p["bins"][i] for p in profs) for i in range(len(profs[0]["bins"]))],
            "cv": statistics.fmean(p["cv"] for p in profs),
            "cv_by_seed": [p["cv"] for p in profs],
            "clipfrac": statistics.fmean(p["clipfrac"] for p in profs),
            "finite_lower_frac": statistics.fmean(p["finite_lower_frac"] for p in profs),
            "runs": runs,
        }
        for name, key in LATE.items():
            d[name] = statistics.fmean(statistics.fmean(r[key] for r in late_stage(rows)) for rows in runs)
        diag[m] = d
    return diag


def table1_markdown(rows: list[dict]) -> list[str]:
    k = rows[0]["k"]
    lines = [
        f"| method | test mean@{k} (selected on validation), mean ± sd over seeds | per seed | "
        f"validation mean@{k} at the selected checkpoint (selected and reported on the same split) | "
        f"test mean@{k}, last checkpoint | test: method - EPIC, paired, 95% interval | validation: method - EPIC | "
        f"test, last checkpoint: method - EPIC, paired |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        seeds = ", ".join(f"s{s} {v:.3f}" for s, v in sorted(r["test_by_seed"].items()))
        diff = val_diff = final_diff = "(baseline)"
        if "diff_test" in r:
            diff, val_diff = _interval(r["diff_test"], mark=True), _interval(r["diff_validation"])
            final_diff = _interval(r["diff_test_final"], mark=True)
        lines.append(
            f"| {r['method']} | {r['test_mean']:.3f} ± {_fmt(r['test_sd'])} | {seeds} | "
            f"{r['validation_mean']:.3f} | {r['test_final_mean']:.3f} | {diff} | {val_diff} | {final_diff} |"
        )
    return lines


def _interval(d: dict, mark: bool = False) -> str:
    text = f"{d['mean']:+.3f} [{_fmt(d['low'])}, {_fmt(d['high'])}]"
    return text + (" (overlaps 0)" if mark and not interval_excludes_zero(d) else "")


def diagnostics_markdown(diag: dict[str, dict]) -> list[str]:
    lines = [
        "| method | late clip fraction | position CV (Fig. 3a) | per-bin clip fraction, bins 0..9 | "
        "finite lower bound coverage (Fig. 3c) | entropy | grad norm | train-rollout log-prob gap | "
        "mean \\|log r_pre\\| (Fig. 7) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m, d in diag.items():
        bins = " ".join(f"{b:.2f}" for b in d["bins"])
        lines.append(
            f"| {m} | {d['clipfrac']:.4f} | {d['cv']:.3f} | {bins} | {d['finite_lower_frac']:.3f} | "
            f"{d['entropy']:.3f} | {d['grad_norm']:.3f} | {d['logprob_gap']:.2e} | {d['abs_log_r_pre']:.3f} |"
        )
    return lines


def findings(rows: list[dict], diag: dict[str, dict], results: list[dict]) -> list[str]:
    """Plain-words statements computed from the numbers (nulls stated as nulls)."""
    out = []
    diffs = [r for r in rows if "diff_test" in r]
    undefined = [r["method"] for r in diffs if r["diff_test"]["low"] is None]
    overlap = [
        r["method"] for r in diffs if r["diff_test"]["low"] is not None and not interval_excludes_zero(r["diff_test"])
    ]
    better = [r["method"] for r in diffs if interval_excludes_zero(r["diff_test"]) and r["diff_test"]["mean"] > 0]
    worse = [r["method"] for r in diffs if interval_excludes_zero(r["diff_test"]) and r["diff_test"]["mean"] < 0]
    if undefined:
        out.append(f"With one seed no paired interval exists ({', '.join(undefined)}): the table is a single draw.")
    if overlap:
        out.append(
            f"The paired 95% intervals of {', '.join(overlap)} against EPIC overlap zero: at this scale "
            f"and number of seeds the study does not separate them from EPIC (a null result, not a tie)."
        )
    if worse:
        out.append(f"Below EPIC with the interval excluding zero: {', '.join(worse)}.")
    if better:
        out.append(f"Above EPIC with the interval excluding zero: {', '.join(better)} (against the paper's Table 1).")
    final_apart = [r for r in diffs if interval_excludes_zero(r["diff_test_final"])]
    if final_apart:
        listed = ", ".join(f"{r['method']} {_interval(r['diff_test_final'])}" for r in final_apart)
        out.append(
            f"At the last checkpoint (no selection), apart from EPIC with the interval excluding zero: "
            f"{listed}; every other method's last-checkpoint interval overlaps zero."
        )
    elif diffs and diffs[0]["diff_test_final"]["low"] is not None:
        out.append("At the last checkpoint (no selection) every paired interval against EPIC overlaps zero too.")
    at_start = [r for r in results if r["selected_version"] == 0]
    if at_start:
        out.append(
            f"{len(at_start)} of {len(results)} runs selected the warm start (version 0): in those runs no "
            f"later checkpoint beat the base policy on validation within the budget, so their test score is "
            f"the base policy's and says nothing about the method."
        )
    gap = statistics.fmean(r["validation_at_selected"] - r["test_at_selected"] for r in results)
    if gap > 0:
        out.append(
            f"Selection bias: the validation score at the validation-selected checkpoint exceeds the test "
            f"score of the same checkpoint by {gap:+.3f} on average over runs; selecting and reporting on one "
            f"split (the paper's protocol) overstates every method by about that much."
        )
    else:
        out.append(
            f"Selection bias: validation minus test at the selected checkpoint is {gap:+.3f} on average over "
            f"runs, so no upward bias from selecting on the validation split is visible at this size."
        )
    n_seeds = max((r["diff_test"]["n"] for r in diffs), default=0)
    if 2 <= n_seeds < 5:
        out.append(
            f"With {n_seeds} seeds each interval rests on {n_seeds - 1} degree(s) of freedom, and "
            f"{len(diffs)} methods are compared at once: an interval that excludes zero here is weak evidence "
            f"(about one in twenty would by chance); it needs more seeds to stand."
        )
    have = [m for m in PAPER_POSITION_CV if m in diag]
    if len(have) >= 2:
        ours = ", ".join(f"{m} {diag[m]['cv']:.3f}" for m in have)
        paper = ", ".join(f"{m} {PAPER_POSITION_CV[m]:.3f}" for m in have)
        order_ours = sorted(have, key=lambda m: diag[m]["cv"])
        order_paper = sorted(have, key=lambda m: PAPER_POSITION_CV[m])
        verdict = (
            "the same order as the paper"
            if order_ours == order_paper
            else f"not the paper's order (here {' < '.join(order_ours)})"
        )
        out.append(
            f"Late-stage position CV of the clip fraction (Fig. 3a): {ours} here vs {paper} in the paper: {verdict}."
        )
    sparse = [m for m in diag if diag[m]["clipfrac"] < SPARSE_CLIPFRAC]
    if sparse:
        out.append(
            f"{', '.join(sparse)} clipped fewer than {SPARSE_CLIPFRAC:.1%} of the late-stage tokens, so their "
            f"position CV measures a handful of clipped tokens, not a profile."
        )
    if "epic" in diag and "epic_raw_prob" in diag:
        e, r = diag["epic"], diag["epic_raw_prob"]
        out.append(
            f"Raw-prob ablation (Fig. 3c): finite lower bound coverage {r['finite_lower_frac']:.3f} vs EPIC "
            f"{e['finite_lower_frac']:.3f}; position CV {r['cv']:.3f} vs {e['cv']:.3f}; late clip fraction "
            f"{r['clipfrac']:.4f} vs {e['clipfrac']:.4f}."
        )
    if diag:
        lo = min(diag, key=lambda m: diag[m]["entropy"])
        hi = max(diag, key=lambda m: diag[m]["entropy"])
        out.append(
            f"Late-stage policy entropy ranges from {diag[lo]['entropy']:.3f} ({lo}) to "
            f"{diag[hi]['entropy']:.3f} ({hi}) nats per token; mean |log r_pre| from "
            f"{min(d['abs_log_r_pre'] for d in diag.values()):.3f} to "
            f"{max(d['abs_log_r_pre'] for d in diag.values()):.3f}."
        )
    return out


def write_report(cfg, out: Path, results: list[dict], *, command: str, study_s: float, commit: str) -> Path:
    """study.md, its figures and summary.json, from the files the run phase wrote (nothing is run)."""
    planned = plan(cfg)
    warm = read_warm_start(out)
    if warm is None:
        raise FileNotFoundError(
            f"study report: {out / 'warm_start.json'} is missing (the run phase writes it "
            f"before the first run); run the study without --analyze-only first"
        )
    profile = warm["entropy_profile"]
    figures.entropy_profile_figure(profile, out / "entropy_profile.png")
    k = results[0]["k"] if results else 8
    made_by = sorted({(p["command"], p["commit"]) for p in read_provenance(out) if p["runs_executed"]})
    lines = [
        f"# epic-slime study ({Path(cfg.path).name})",
        "",
        "Runs made by: " + ("; ".join(f"`{c}` at commit `{h}`" for c, h in made_by) or "none yet") + ". "
        f"This report: `{command}`, commit `{commit}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{len(results)} of {len(planned)} planned runs finished; this invocation took {study_s / 60:.1f} min. "
        f"Seeds {cfg.seeds} (fixed in the config), methods {', '.join(cfg.methods)} with the paper's "
        f"parameters, the same budget per run: " + ", ".join(f"{k}={v}" for k, v in cfg.train.items()) + ".",
        "",
        "Protocol: for a seed every method starts from the same warm start, trains on the same prompts in "
        "the same order and is evaluated on the same validation and test prompts with the same sampling "
        "streams, so differences are paired by seed. The checkpoint with the best validation mean@k "
        "(evaluated every `eval_interval` steps and at the end, the warm start included) is selected; "
        f"its test mean@k on {cfg.test_prompts} disjoint test prompts is reported.",
        "",
        "## The task: chains of intermediate results",
        "",
        *warm_start_lines(warm, k),
        f"Warm-started policy on {profile['responses']} sampled responses: mean length "
        f"{profile['mean_length']:.1f} tokens (shortest {profile['min_length']}, truncated "
        f"{profile['truncated_frac']:.2%}), mean entropy {profile['mean_entropy']:.3f} nats per token; "
        f"at step results {profile['entropy_result_tokens']:.3f}, elsewhere {profile['entropy_other_tokens']:.3f}. "
        "Entropy per relative position bin: "
        + " ".join(f"{x:.3f}" for x in profile["entropy_by_relative_bin"])
        + f" (CV across bins {profile['relative_bin_cv']:.2f}): the uncertainty is spread over the whole "
        "response, at every step's result, not at one place.",
        "",
        "![entropy profile](entropy_profile.png)",
        "",
    ]
    summary = {
        "command": command,
        "commit": commit,
        "config": cfg.path,
        "entropy_profile": profile,
        "chance": warm["chance_test"]["chance"],
        "warm_start_test": warm["test_mean"],
        "warm_start_test_by_seed": warm["test_by_seed"],
        "settings": {},
    }
    metrics = {(r["setting"], r["method"], r["seed"]): run_metrics(out, r) for r in results}  # read once
    if cfg.ladder and results:
        lines += ladder_section(cfg, out, results, metrics, warm, summary, k)
    if cfg.stress and results:
        from .stress_report import stress_section

        lines += stress_section(cfg, out, results, metrics, warm, summary, k)
    if getattr(cfg, "contrast", None) and results:
        from .contrast import contrast_section

        lines += contrast_section(cfg, results, metrics, summary)
    if results:
        from .behaviour import behaviour_section

        lines += behaviour_section(cfg, metrics, results, summary, warm)
    for setting in [s["name"] for s in cfg.settings]:
        res = [r for r in results if r["setting"] == setting]
        if not res or not any(r["method"] == "epic" for r in res):
            lines += [f"## Setting {setting}", "", "No finished EPIC run yet: nothing to compare.", ""]
            continue
        rows = method_rows(res, cfg.methods)
        diag = diagnostics(metrics, res, cfg.methods)
        header = f"## Setting {setting}: " + ", ".join(
            f"{key}={v}" for key, v in next(s for s in cfg.settings if s["name"] == setting).items() if key != "name"
        )
        summary["settings"][setting] = {
            "table1": rows,
            "diagnostics": {m: {k: v for k, v in d.items() if k != "runs"} for m, d in diag.items()},
        }
        if cfg.ladder or cfg.stress:  # the ladder's figure stands for its settings; per-setting tables only
            lines += [header, "", *table1_markdown(rows), "", *diagnostics_markdown(diag), ""]
            continue
        figures.table1_figure(rows, setting, out / f"table1_{setting}.png")
        figures.position_figure(
            {m: diag[m] for m in diag if m in ("epic", "ctpo", "ripo", "grpo", "dapo", "gspo")},
            setting,
            out / f"fig3a_position_{setting}.png",
            "late-stage clip fraction by position",
        )
        figures.rawprob_figure(
            {m: diag[m] for m in ("epic", "epic_raw_prob", "epic_cumulative") if m in diag},
            setting,
            out / f"fig3c_rawprob_{setting}.png",
        )
        for stem, (key, label) in figures.CURVES.items():
            figures.curve_figure(
                {m: d["runs"] for m, d in diag.items()}, key, label, setting, out / f"{stem}_{setting}.png"
            )
        lines += [
            header,
            "",
            "### Table 1 at toy scale",
            "",
            *table1_markdown(rows),
            "",
            f"![table 1](table1_{setting}.png)",
            "",
            "### Diagnostics (late stage = last 25% of steps, mean over seeds)",
            "",
            *diagnostics_markdown(diag),
            "",
            "### What this shows",
            "",
            *[f"- {x}" for x in findings(rows, diag, res)],
            "",
            f"![Fig. 3a](fig3a_position_{setting}.png) ![Fig. 3c](fig3c_rawprob_{setting}.png)",
            "",
            *[f"![{stem}]({stem}_{setting}.png)" for stem in figures.CURVES],
            "",
        ]
    lines += [
        "## Where the toy does not reproduce the paper",
        "",
        "- Scale: a ~120 k-parameter model, tens of steps and tens of prompts per step; the paper trains a "
        "30B-A3B MoE for hundreds of steps. Effects smaller than the seed-to-seed spread are invisible here.",
        "- The task is modular arithmetic with exact steps; uncertainty sits at every step's result, but there "
        "is no open-ended reasoning, and rewards come from a policy that is only a few hundred SGD steps old.",
        "- Diagnostics that differ from the paper's numbers are listed above in numbers; no method parameter "
        "was tuned to make them agree.",
        "",
    ]
    (out / "study.md").write_text("\n".join(lines))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return out / "study.md"


def warm_start_lines(warm: dict, k: int) -> list[str]:
    """Chance level and the warm start's test score, computed by the run phase."""
    ch, prof = warm["chance_test"], warm["entropy_profile"]
    lo, hi = bootstrap_mean_interval(warm["test_by_prompt"])
    seeds = ", ".join(f"s{s} {v:.3f}" for s, v in warm["test_by_seed"].items())
    spread = f" (per seed {seeds}; 95% bootstrap interval over the test prompts {lo:.3f}..{hi:.3f})"
    return [
        f"Chance: answering without reading the prompt scores {ch['chance']:.3f} (the most frequent answer of "
        f"{ch['train_problems']} training problems, {ch['best_constant_answer']}, and its frequency there; it scores "
        f"{ch['best_constant_on_test']:.3f} on the {ch['problems']} test prompts; a uniform guess over the "
        f"{ch['distinct_answers']} answers that occur scores {ch['uniform_guess']:.3f}).",
        f"Warm start: test mean@{k} {warm['test_mean']:.3f}{spread}, "
        f"{warm['test_mean'] / ch['chance']:.1f}x chance; entropy at positions that copy the prompt "
        f"{prof.get('entropy_copy_tokens', float('nan')):.3f} nats on average, "
        f"{prof.get('entropy_copy_max_position', float('nan')):.3f} at the most uncertain copy position; at step "
        f"results {prof['entropy_result_tokens']:.3f}.",
        "",
    ]


def ladder_section(
    cfg, out: Path, results: list[dict], metrics: dict[tuple, list[dict]], warm: dict, summary: dict, k: int
) -> list[str]:
    """The lag ladder: table, figure, findings; and its part of summary.json."""
    lad = ladder.ladder_summary(cfg, results, metrics, warm)
    panels = ladder.axes(cfg)
    figures.ladder_figure(
        lad, panels, cfg.methods, warm["test_mean"], warm["chance_test"]["chance"], k, out / "ladder.png"
    )
    summary["ladder"] = {
        "power": lad["power"],
        "collapse_definition": {"margin": ladder.COLLAPSE_MARGIN, "last_evaluations": ladder.COLLAPSE_EVALS},
        "cells": {
            name: {
                "D": c["lag"]["D"],
                "K": c["lag"]["K"],
                "methods": {m: {key: v for key, v in d.items()} for m, d in c["methods"].items()},
            }
            for name, c in lad["cells"].items()
        },
    }
    return [
        "## The policy-lag ladder",
        "",
        f"Each cell: {len(cfg.seeds)} seeds per method (paired), the same budget; the last checkpoint's test "
        f"mean@{k} and the validation-selected one. A run **collapses** when its validation mean@{k} is below the "
        f"warm start's by more than {ladder.COLLAPSE_MARGIN} at each of its last {ladder.COLLAPSE_EVALS} "
        f"evaluations (it fell and stayed there to the end; {ladder.COLLAPSE_MARGIN} is above the validation "
        f"score's sampling noise). `*`: the paired 95% t interval excludes 0.",
        "",
        f"At a glance: test mean@{k} at the last checkpoint, mean ± sd over seeds (`*`: paired interval to "
        f"EPIC excludes 0):",
        "",
        *ladder.ladder_pivot_markdown(lad, cfg.methods, k),
        "",
        "![lag ladder](ladder.png)",
        "",
        "Every cell:",
        "",
        *ladder.ladder_markdown(lad, cfg.methods, k),
        "",
        "### What the ladder shows",
        "",
        *[f"- {x}" for x in ladder.ladder_findings(lad, cfg.methods, warm)],
        "",
    ]
