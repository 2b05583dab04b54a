"""Pure summaries of the study's runs: paired differences, late-stage position profiles, curves.

Inputs are plain Python data read from each run's own records (metrics.jsonl lines, the study's
result.json); nothing here runs a model.
"""

from __future__ import annotations

import math
import statistics

# scipy is imported inside the functions that need it: the run phase imports this module too, and
# the statistics are only needed when the report is written.

POSITION_BINS = 10
CLIPFRAC_BIN = "train/policy/clipfrac_position_bin_{}"

ALPHA = 0.05  # two-sided level of every interval and test in the study
POWER = 0.80  # the power a "detectable" difference is computed for


def t_quantile_975(df: int) -> float:
    """t_{0.975, df} (scipy.stats.t), the half-width factor of a two-sided 95% interval."""
    if df < 1:
        raise ValueError(f"t quantile: degrees of freedom must be >= 1, got {df}")
    from scipy import stats

    return float(stats.t.ppf(1 - ALPHA / 2, df))


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
        return {"n": 1, "mean": mean, "low": None, "high": None, "seeds": seeds, "diffs": diffs}
    half = t_quantile_975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return {"n": len(diffs), "mean": mean, "low": mean - half, "high": mean + half, "seeds": seeds, "diffs": diffs}


def paired_t_power(delta: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test at level alpha with n pairs when the true mean difference is
    delta and the sd of one pair's difference is sd (noncentral t, scipy.stats.nct)."""
    from scipy import stats

    if n < 2:
        return 0.0
    if sd <= 0:
        return 1.0 if delta != 0 else alpha
    df, nc = n - 1, abs(delta) * math.sqrt(n) / sd  # the test is symmetric in the sign of delta
    crit = stats.t.ppf(1 - alpha / 2, df)
    upper = float(stats.nct.sf(crit, df, nc))
    lower = float(stats.nct.cdf(-crit, df, nc))  # the far tail: scipy returns NaN once it underflows
    return upper + (lower if math.isfinite(lower) else 0.0)


def minimum_detectable_difference(sd: float, n: int, power: float = POWER, alpha: float = ALPHA) -> float | None:
    """The smallest true paired difference that n pairs detect with the given power (None for n < 2)."""
    from scipy import optimize

    if n < 2:
        return None
    if sd <= 0:
        return 0.0
    hi = sd
    while paired_t_power(hi, sd, n, alpha) < power:
        hi *= 2
    return float(optimize.brentq(lambda d: paired_t_power(d, sd, n, alpha) - power, 0.0, hi, xtol=1e-10))


SIGN_FLIP_MAX_PAIRS = 20  # 2^20 patterns: exact enumeration stays cheap


def sign_flip_p(diffs: list[float]) -> float:
    """Exact two-sided sign-flip (randomisation) test of mean 0 for paired differences: the fraction of the
    2^n sign patterns whose |mean| is at least the observed |mean|. The observed pattern and its mirror always
    count, so p >= 2^(1-n); sums equal up to rounding count as ties."""
    n = len(diffs)
    if not 1 <= n <= SIGN_FLIP_MAX_PAIRS:
        raise ValueError(f"sign_flip_p: needs 1 to {SIGN_FLIP_MAX_PAIRS} paired differences, got {n}")
    if any(not math.isfinite(d) for d in diffs):
        raise ValueError(f"sign_flip_p: differences must be finite, got {diffs!r}")
    observed = abs(math.fsum(diffs))
    tolerance = 1e-12 * max(1.0, math.fsum(abs(d) for d in diffs))  # sums equal up to rounding are ties
    hits = 0
    for pattern in range(1 << n):
        total = math.fsum(-d if pattern >> i & 1 else d for i, d in enumerate(diffs))
        hits += abs(total) >= observed - tolerance
    return hits / (1 << n)


def pairs_needed(delta: float, sd: float, power: float = POWER, alpha: float = ALPHA, most: int = 10_000) -> int | None:
    """The fewest pairs (seeds) that detect a true difference delta with the given power (None: > most)."""
    if sd <= 0:
        return 2
    for n in range(2, most + 1):
        if paired_t_power(delta, sd, n, alpha) >= power:
            return n
    return None


def bootstrap_mean_interval(values: list[float], seed: int = 0, resamples: int = 2000) -> tuple[float, float]:
    """95% percentile bootstrap interval of a mean (scipy.stats.bootstrap; e.g. over prompts)."""
    import numpy as np
    from scipy import stats

    res = stats.bootstrap(
        (np.asarray(values, dtype=float),),
        np.mean,
        confidence_level=1 - ALPHA,
        n_resamples=resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def interval_excludes_zero(diff: dict) -> bool:
    return diff["low"] is not None and (diff["low"] > 0 or diff["high"] < 0)


def late_stage(rows: list[dict], fraction: float = 0.25) -> list[dict]:
    """The last `fraction` of the training steps (at least one)."""
    if not rows:
        raise ValueError("late_stage: no metrics rows")
    if not 0 < fraction <= 1:
        raise ValueError(f"late_stage: fraction must be in (0, 1], got {fraction}")
    return rows[-max(1, math.ceil(len(rows) * fraction)) :]


def coefficient_of_variation(values: list[float]) -> float:
    """Population std / mean (0 when the mean is 0: nothing clipped anywhere)."""
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else 0.0


def position_profile(rows: list[dict], fraction: float = 0.25) -> dict:
    """Late-stage clip fraction per relative-position bin (mean over steps) and its CV across bins
    (the paper's Fig. 3a statistic), plus the late-stage finite-lower-bound coverage (Fig. 3c)."""
    tail = late_stage(rows, fraction)
    bins = [statistics.fmean(r[CLIPFRAC_BIN.format(i)] for r in tail) for i in range(POSITION_BINS)]
    return {
        "bins": bins,
        "cv": coefficient_of_variation(bins),
        "clipfrac": statistics.fmean(r["train/policy/clipfrac"] for r in tail),
        "finite_lower_frac": statistics.fmean(r["train/policy/finite_lower_frac"] for r in tail),
        "steps": len(tail),
    }


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
