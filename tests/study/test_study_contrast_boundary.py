"""Issue 46 pattern 7: the study's contrast verdict at its boundary. The verdict follows the 95% t
interval, not the mean: a mean above (below) 0 whose interval spans 0 is "not resolved". The interval
is checked against scipy's t quantile in float64, independently of the study's own."""

from __future__ import annotations

import math
import statistics

import pytest

from epic_slime.study.contrast import contrast_for

stats = pytest.importorskip("scipy.stats", reason="scipy (the [test] extra) gives the reference quantile")


def _results(contrasts: list[float]) -> list[dict]:
    """Seed s: (M - B) at the target is contrasts[s], at the reference 0 (M and B score the same)."""
    rows = []
    for seed, c in enumerate(contrasts, start=1):
        rows += [
            {"setting": "target", "method": "epic", "seed": seed, "test_at_final": 0.30 + c},
            {"setting": "target", "method": "grpo", "seed": seed, "test_at_final": 0.30},
            {"setting": "reference", "method": "epic", "seed": seed, "test_at_final": 0.25},
            {"setting": "reference", "method": "grpo", "seed": seed, "test_at_final": 0.25},
        ]
    return rows


def _interval(contrasts: list[float]) -> tuple[float, float, float]:
    n = len(contrasts)
    mean = math.fsum(contrasts) / n
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(contrasts) / math.sqrt(n)
    return mean, mean - half, mean + half


@pytest.mark.parametrize(
    "contrasts, verdict",
    [
        ([0.10, -0.02, 0.05], "not resolved (interval spans 0)"),  # mean +0.043, interval spans 0
        ([-0.10, 0.02, -0.05], "not resolved (interval spans 0)"),  # mean -0.043, interval spans 0
        ([0.10, 0.11, 0.12], "supported (interval above 0)"),
        ([-0.10, -0.11, -0.12], "contradicted (interval below 0)"),
    ],
)
def test_the_contrast_verdict_follows_the_interval_not_the_mean(contrasts, verdict):
    c = contrast_for(_results(contrasts), "epic", "grpo", "target", "reference")
    mean, low, high = _interval(contrasts)
    assert c["n"] == len(contrasts) and c["per_seed"] == pytest.approx(contrasts, abs=1e-12)
    assert (c["mean"], c["low"], c["high"]) == pytest.approx((mean, low, high), rel=1e-9)
    if verdict.startswith("not resolved"):
        assert low < 0 < high and mean != 0  # the boundary case: the mean alone would decide
    assert c["verdict"] == verdict
