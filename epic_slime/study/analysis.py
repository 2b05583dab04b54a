"""Pure summaries of the study's runs: paired differences, late-stage position profiles, curves.

Inputs are plain Python data read from each run's own records (metrics.jsonl lines, the study's
result.json); nothing here runs a model.
"""

from __future__ import annotations

import math
import statistics

POSITION_BINS = 10
CLIPFRAC_BIN = "train/policy/clipfrac_position_bin_{}"

# Two-sided 95% Student-t quantiles t_{0.975, df} (df = 1..30); beyond 30 the normal 1.96 is
# within 2% of the exact value.
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
         2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
         2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)


def t_quantile_975(df: int) -> float:
    if df < 1:
        raise ValueError(f"t quantile: degrees of freedom must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def mean_sd(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None with one value)."""
    if not values:
        raise ValueError("mean_sd: no values")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def paired_difference(method: dict[int, float], baseline: dict[int, float]) -> dict:
    """Mean of (method - baseline) over the seeds both have, with a 95% t interval.

    With one shared seed the interval is undefined (None, None): one pair says nothing about spread."""
    seeds = sorted(set(method) & set(baseline))
    if not seeds:
        raise ValueError("paired_difference: no seed in common")
    diffs = [method[s] - baseline[s] for s in seeds]
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return {"n": 1, "mean": mean, "low": None, "high": None, "seeds": seeds}
    half = t_quantile_975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return {"n": len(diffs), "mean": mean, "low": mean - half, "high": mean + half, "seeds": seeds}


def interval_excludes_zero(diff: dict) -> bool:
    return diff["low"] is not None and (diff["low"] > 0 or diff["high"] < 0)


def late_stage(rows: list[dict], fraction: float = 0.25) -> list[dict]:
    """The last `fraction` of the training steps (at least one)."""
    if not rows:
        raise ValueError("late_stage: no metrics rows")
    if not 0 < fraction <= 1:
        raise ValueError(f"late_stage: fraction must be in (0, 1], got {fraction}")
    return rows[-max(1, math.ceil(len(rows) * fraction)):]


def coefficient_of_variation(values: list[float]) -> float:
    """Population std / mean (0 when the mean is 0: nothing clipped anywhere)."""
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else 0.0


def position_profile(rows: list[dict], fraction: float = 0.25) -> dict:
    """Late-stage clip fraction per relative-position bin (mean over steps) and its CV across bins
    (the paper's Fig. 3a statistic), plus the late-stage finite-lower-bound coverage (Fig. 3c)."""
    tail = late_stage(rows, fraction)
    bins = [statistics.fmean(r[CLIPFRAC_BIN.format(i)] for r in tail) for i in range(POSITION_BINS)]
    return {"bins": bins, "cv": coefficient_of_variation(bins),
            "clipfrac": statistics.fmean(r["train/policy/clipfrac"] for r in tail),
            "finite_lower_frac": statistics.fmean(r["train/policy/finite_lower_frac"] for r in tail),
            "steps": len(tail)}


def curve(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric over training (rows without the key are skipped)."""
    pts = [(r["step"], float(r[key])) for r in rows if key in r and r[key] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def mean_curve(runs: list[list[dict]], key: str) -> tuple[list[int], list[float]]:
    """Step-wise mean of one metric over runs (seeds), on the steps every run has."""
    per_run = [dict(zip(*curve(rows, key))) for rows in runs]
    steps = sorted(set.intersection(*(set(c) for c in per_run))) if per_run else []
    return steps, [statistics.fmean(c[s] for c in per_run) for s in steps]


def select_checkpoint(evals: list[tuple[int, float]]) -> tuple[int, float]:
    """(version, score) with the best validation score; ties go to the earliest version."""
    if not evals:
        raise ValueError("select_checkpoint: no evaluations")
    best = max(score for _, score in evals)
    return min(v for v, score in evals if score == best), best
