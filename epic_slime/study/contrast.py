"""The pre-registered difference-in-differences of a study (`contrast:` in its config), and the
train-inference gap each setting reached.

Per seed s: c_s = (M - B)[target, s] - (M - B)[reference, s] on the test score at the last checkpoint;
mean and 95% t interval over the seeds that have all four runs; the verdict from the interval (the
first baseline is the primary test, the others secondary) and the smallest |c| the seeds detect with 80%
power from the observed sd of c_s.
"""

from __future__ import annotations

import statistics

from .analysis import SIGN_FLIP_MAX_PAIRS, minimum_detectable_difference, paired_difference, sign_flip_p

GAP_KEY = "train/logprob_abs_diff_step_start"


def contrast_for(results: list[dict], method: str, baseline: str, target: str, reference: str) -> dict:
    score = {(r["setting"], r["method"], r["seed"]): r["test_at_final"] for r in results}
    seeds = sorted(
        s
        for s in {r["seed"] for r in results}
        if all((st, m, s) in score for st in (target, reference) for m in (method, baseline))
    )
    out = {"method": method, "baseline": baseline, "target": target, "reference": reference, "n": len(seeds)}
    if not seeds:
        return {**out, "verdict": "pending (no seed has all four runs)"}
    diff = {st: {s: score[(st, method, s)] - score[(st, baseline, s)] for s in seeds} for st in (target, reference)}
    d = paired_difference(diff[target], diff[reference])
    out.update(
        mean=d["mean"],
        low=d["low"],
        high=d["high"],
        per_seed=d["diffs"],
        seeds=seeds,
        simple_target=statistics.fmean(diff[target].values()),
        simple_reference=statistics.fmean(diff[reference].values()),
    )
    if len(seeds) < 2:
        out["verdict"] = "pending (one seed)"
        return out
    sd = statistics.stdev(d["diffs"])
    out["sd"], out["mdd_80"] = sd, minimum_detectable_difference(sd, len(seeds))
    if len(seeds) <= SIGN_FLIP_MAX_PAIRS:
        out["sign_flip_p"] = sign_flip_p(d["diffs"])
    out["verdict"] = (
        "supported (interval above 0)"
        if d["low"] > 0
        else "contradicted (interval below 0)"
        if d["high"] < 0
        else "not resolved (interval spans 0)"
    )
    return out


def gap_by_setting(metrics: dict[tuple, list[dict]]) -> dict[str, dict]:
    """The step-start gap |log pi_train - log mu_rollout| per token: mean over every step of every run of a
    setting, its first step's mean, and the largest step value."""
    by: dict[str, list[list[float]]] = {}
    for (setting, _m, _s), rows in metrics.items():
        by.setdefault(setting, []).append([r[GAP_KEY] for r in rows if r.get(GAP_KEY) is not None])
    return {
        s: {
            "mean": statistics.fmean(v for run in runs for v in run),
            "first_step": statistics.fmean(run[0] for run in runs if run),
            "max": max(v for run in runs for v in run),
            "runs": len(runs),
        }
        for s, runs in by.items()
        if any(runs)
    }


def contrast_section(cfg, results: list[dict], metrics: dict, summary: dict) -> list[str]:
    c = cfg.contrast
    rows = [contrast_for(results, c["method"], b, c["target"], c["reference"]) for b in c["baselines"]]
    gaps = gap_by_setting(metrics)
    summary["contrast"], summary["gap_by_setting"] = rows, gaps
    lines = [
        "## The pre-registered contrast",
        "",
        f"Per seed, ({c['method']} - baseline)[{c['target']}] - ({c['method']} - baseline)[{c['reference']}], "
        "test mean@k at the last checkpoint; 95% t interval over the seeds with all four runs. The first "
        "baseline is the primary test, the others secondary.",
        "",
        "| baseline | seeds | contrast | 95% interval | sign-flip p (exact) | simple effect at target | "
        "at reference | smallest detectable (80%) | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "mean" not in r:
            lines.append(f"| {r['baseline']} | 0 | | | | | | | {r['verdict']} |")
            continue
        ci = f"[{r['low']:+.3f}, {r['high']:+.3f}]" if r.get("low") is not None else "n/a"
        mdd = f"{r['mdd_80']:.3f}" if r.get("mdd_80") is not None else "n/a"
        flip = f"{r['sign_flip_p']:.4f}" if r.get("sign_flip_p") is not None else "n/a"
        lines.append(
            f"| {r['baseline']} | {r['n']} | {r['mean']:+.3f} | {ci} | {flip} | {r['simple_target']:+.3f} | "
            f"{r['simple_reference']:+.3f} | {mdd} | {r['verdict']} |"
        )
    lines += [
        "",
        "Step-start train-inference gap (mean |log pi_train - log mu_rollout| per token, every step of "
        "every run of the setting):",
        "",
        "| setting | mean | first step | max | runs |",
        "|---|---|---|---|---|",
    ]
    for s in [x["name"] for x in cfg.settings if x["name"] in gaps]:
        g = gaps[s]
        lines.append(f"| {s} | {g['mean']:.2e} | {g['first_step']:.2e} | {g['max']:.2e} | {g['runs']} |")
    return lines + [""]


def results_of(out, setting: str) -> list[dict]:
    """result.json of every finished run of one setting in a study directory."""
    import json
    from pathlib import Path

    paths = sorted((Path(out) / "runs" / setting).glob("*/result.json"))
    return [json.loads(p.read_text()) for p in paths]


def main(argv=None) -> int:
    """The contrast between two study directories (an extension's target cell against the main study's
    reference cell): python -m epic_slime.study.contrast --target DIR SETTING --reference DIR SETTING."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m epic_slime.study.contrast", description=main.__doc__)
    p.add_argument("--target", nargs=2, metavar=("DIR", "SETTING"), required=True)
    p.add_argument("--reference", nargs=2, metavar=("DIR", "SETTING"), required=True)
    p.add_argument("--method", default="epic")
    p.add_argument("--baseline", default="grpo")
    a = p.parse_args(argv)
    (t_dir, target), (r_dir, reference) = a.target, a.reference
    if target == reference:
        p.error(f"--target and --reference name the same setting {target!r}: give the cells distinct names")
    results = results_of(t_dir, target) + results_of(r_dir, reference)
    print(json.dumps(contrast_for(results, a.method, a.baseline, target, reference)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
