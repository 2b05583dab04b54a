"""Bootstrap intervals over prompts and seeds, checked against closed-form replicate variances
(float64, from the math of resampling with replacement), not against the implementation."""

from __future__ import annotations

import numpy as np
import pytest

from epic_slime.evaluation import EvalRecord, group_records, method_table
from epic_slime.evaluation.bootstrap import bootstrap_replicates, method_intervals, percentile_interval

B = 20000


def test_one_seed_matches_the_resampled_mean_variance():
    # the mean of P values drawn with replacement has mean mean(f) and variance var_pop(f) / P
    f = np.linspace(0.0, 1.0, 20) ** 2
    draws = bootstrap_replicates({"b": [{f"p{i}": v for i, v in enumerate(f)}]}, B, np.random.default_rng(1))["b"]
    expected_var = f.var(ddof=0) / len(f)
    assert draws.mean() == pytest.approx(f.mean(), abs=4 * np.sqrt(expected_var / B))
    assert draws.var() == pytest.approx(expected_var, rel=0.05)


def test_two_way_additive_cell_has_seed_plus_prompt_variance():
    # F[s, p] = a_s + b_p: a replicate is mean(a*) + mean(b*), two independent draws, so its variance is
    # var_pop(a) / S + var_pop(b) / P exactly
    a = np.array([0.0, 0.1, 0.3, 0.2])
    b = np.array([(7 * i % 11) / 20 for i in range(30)])
    per_seed = [{f"p{p}": a[s] + b[p] for p in range(len(b))} for s in range(len(a))]
    draws = bootstrap_replicates({"b": per_seed}, B, np.random.default_rng(2))
    expected = a.var() / len(a) + b.var() / len(b)
    assert draws["b"].var() == pytest.approx(expected, rel=0.05)
    assert draws["b"].mean() == pytest.approx(a.mean() + b.mean(), abs=4 * np.sqrt(expected / B))
    # the same seed draw for both benchmarks: the average of two copies has the seed variance unchanged
    # and half the prompt variance (independent prompt draws)
    both = bootstrap_replicates({"x": per_seed, "y": per_seed}, B, np.random.default_rng(3))
    assert both["average"].var() == pytest.approx(a.var() / len(a) + b.var() / len(b) / 2, rel=0.05)


def test_constant_cells_give_a_point_interval_and_missing_prompts_are_skipped():
    draws = bootstrap_replicates({"b": [{"p0": 0.5, "p1": 0.5}, {"p0": 0.5}]}, 500, np.random.default_rng(0))
    # a replicate whose seed draw is only seed 2 and whose prompt draw misses p0 has nothing to average:
    # NaN, skipped by the percentile
    finite = draws["b"][np.isfinite(draws["b"])]
    assert 0 < len(finite) < 500 and np.all(finite == 0.5)
    interval = percentile_interval(draws["b"])
    assert (interval.low, interval.high) == (0.5, 0.5)
    with pytest.raises(ValueError, match="different numbers of seeds"):
        bootstrap_replicates({"x": [{"p": 1.0}], "y": [{"p": 1.0}, {"p": 0.0}]}, 10, np.random.default_rng(0))


def test_method_intervals_bracket_the_cells_and_are_reproducible():
    records = []
    for seed, offset in ((1, 0), (2, 3)):
        for p in range(12):
            for s in range(4):
                records.append(EvalRecord(f"m-s{seed}", "m", seed, 0, "b", f"p{p}", s, (p + s + offset) % 3 == 0))
    runs = group_records(records)
    (row,) = method_table(runs, ["b"])
    first = method_intervals(row, runs, ["b"], replicates=3000, seed=7)
    assert first == method_intervals(row, runs, ["b"], replicates=3000, seed=7)
    mean = row.cells["b"][0]
    assert first["b"].low < mean < first["b"].high
    assert first["average"] == first["b"]  # one benchmark: the average is that benchmark


def test_percentile_interval_puts_half_the_missing_mass_in_each_tail():
    """A level-L interval leaves (1 - L) / 2 below and above: on 0..1000 (linear interpolation) the
    95% interval is [25, 975] and holds 95% of the values; 90% is [50, 950]."""
    values = np.arange(1001, dtype=float)
    i95 = percentile_interval(values, 0.95)
    assert (i95.low, i95.high) == pytest.approx((25.0, 975.0))
    inside = np.mean((values >= i95.low) & (values <= i95.high))
    assert inside == pytest.approx(0.95, abs=2e-3)
    i90 = percentile_interval(values, 0.90)
    assert (i90.low, i90.high) == pytest.approx((50.0, 950.0))
    # standard normal draws: the 95% interval is about +-1.96 (the normal quantile, an outside reference)
    draws = np.random.default_rng(0).standard_normal(200_000)
    normal = percentile_interval(draws)
    assert normal.low == pytest.approx(-1.959964, abs=0.03) and normal.high == pytest.approx(1.959964, abs=0.03)
