"""bench/epic_mismatch_budget.py (issue 47, item 5): the trace model matches both targets, the budget use
is phi(e^L_t) / c_t against a float64 reference, and the loss clips exactly where that use passes 1."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import epic_mismatch_budget as bench  # noqa: E402


def test_folded_mean_against_numerical_integration():
    from scipy import integrate, stats

    for s in (0.05, 0.3, 1.7):
        ref = integrate.quad(lambda x: abs(x) * stats.norm.pdf(x, -s * s / 2, s), -40 * s, 40 * s, points=[0])[0]
        assert bench.folded_mean(s) == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("gap,kl", [(0.001, 2e-4), (0.007, 5e-4), (0.013, 1.5e-3)])
def test_the_mixture_solves_both_targets_and_the_traces_reach_them(gap, kl):
    q, s = bench.mixture_for(gap, kl)
    assert q * bench.folded_mean(s) == pytest.approx(gap, rel=1e-9) and q * s * s / 2 == pytest.approx(kl, rel=1e-9)
    _, delta = bench.synthetic_traces(gap, kl, 4096, 512, 0.3, seed=1)  # 2M tokens
    assert float(delta.abs().mean()) == pytest.approx(gap, rel=0.05)
    # KL, heavy-tailed (at q = 0.004 about 8,000 tokens carry all of it): k3 is the steadier estimate
    assert float((torch.expm1(delta) - delta).mean()) == pytest.approx(kl, rel=0.1)
    assert float(-delta.mean()) == pytest.approx(kl, rel=0.2)
    assert float(torch.exp(delta).mean()) == pytest.approx(1.0, abs=2e-3)  # E_mu[pi / mu] = 1


def test_a_kl_below_a_gaussians_for_its_gap_is_refused():
    with pytest.raises(ValueError, match="q=.* > 1"):
        bench.mixture_for(0.013, 1e-4)
    with pytest.raises(ValueError, match="gap and kl must be > 0"):
        bench.mixture_for(0.0, 1e-4)


def test_budget_use_against_a_float64_reference_and_the_clip_at_use_one():
    # one response, hand-made: a prefix ratio that crosses the lower bound and one that crosses the upper
    log_mu = torch.tensor([[-0.2, -1.0, -0.05, -0.3, -0.7, -0.1]], dtype=torch.float64)
    for log_ratio in (
        torch.tensor([[-0.01, -0.2, -0.05, -0.3, 0.0, -0.4]], dtype=torch.float64),
        torch.tensor([[0.02, 0.1, 0.15, 0.0, 0.2, 0.3]], dtype=torch.float64),
    ):
        got = bench.budget_use(log_mu, log_ratio)
        lows, highs = [], []
        big_l = mean_mu = 0.0
        for t in range(1, 7):
            big_l += float(log_ratio[0, t - 1])
            mean_mu += float(log_mu[0, t - 1])
            gm = math.exp(mean_mu / t)
            phi = math.expm1(big_l) - big_l
            lows.append(phi / (t * bench.DELTA_LOW / gm) if big_l < 0 else 0.0)
            highs.append(phi / (t * bench.DELTA_HIGH / gm) if big_l > 0 else 0.0)
        assert got["lower_used_mean"] == pytest.approx(sum(lows) / 6, rel=1e-9)
        assert got["upper_used_mean"] == pytest.approx(sum(highs) / 6, rel=1e-9)
        assert got["lower_used_at_90pct"] == pytest.approx(lows[4], rel=1e-9)
        # the loss clips a token exactly where its use passes 1 (upper for A > 0; either side for A < 0)
        assert got["clipfrac_adv_pos"] == pytest.approx(sum(h > 1 for h in highs) / 6)
        assert got["clipfrac_adv_neg"] == pytest.approx(sum(u > 1 for u in lows + highs) / 6)
        assert max(lows + highs) > 1  # each case does cross a bound


def test_recompute_uses_no_budget_and_the_committed_output_is_this_code(tmp_path):
    log_mu, delta = bench.synthetic_traces(0.013, 1.5e-3, 2048, 4, 0.3, seed=0)
    zero = bench.budget_use(log_mu, torch.zeros_like(delta))
    assert all(v == 0 for v in zero.values())
    committed = json.loads((ROOT / "docs/study/mismatch_budget/budget.json").read_text())
    assert [(c["level"], c["gap"], c["kl"]) for c in committed["checks"]] == list(bench.LEVELS)
    assert (committed["delta_low"], committed["delta_high"]) == (5e-4, 2e-3)
    assert {r["length"] for r in committed["rows"]} == set(bench.LENGTHS)
    assert (ROOT / "docs/study/mismatch_budget/budget.md").read_text() == "\n".join(bench.table(committed)) + "\n"


def test_the_deltas_are_the_epic_method_configs():
    import yaml

    flags = yaml.safe_load((ROOT / "configs/methods/epic.yaml").read_text())["flags"]
    assert (bench.DELTA_LOW, bench.DELTA_HIGH) == (flags["epic-delta-low"], flags["epic-delta-high"])
