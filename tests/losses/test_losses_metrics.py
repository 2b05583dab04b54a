"""Diagnostics against direct numpy computations on the same batch."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from epic_slime.losses import LOSS_MODES, PolicyLossInputError, compute_policy_loss
from epic_slime.losses.flags import add_policy_loss_arguments, policy_loss_config_from_args


def _batch(seed=0, B=5, T=30):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    blp = (lp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-4)
    lengths = torch.tensor([30, 17, 9, 24, 3])[:B]
    mask = torch.arange(T)[None] < lengths[:, None]
    adv = torch.tensor([1.0, -1.0, 0.7, -0.2, 0.0], dtype=torch.float64)[:B]
    return lp, blp, adv, mask


def test_grpo_clip_fractions_and_ratio_statistics():
    lp, blp, adv, mask = _batch()
    out = compute_policy_loss("grpo", lp, blp, adv, mask)
    m = mask.numpy()
    r = np.exp((lp - blp).numpy())
    a = np.broadcast_to(adv.numpy()[:, None], r.shape)
    upper = (a >= 0) & (r >= 1.2) & m
    lower = (a < 0) & (r <= 0.8) & m
    n = m.sum()
    got = {k: float(v) for k, v in out.metrics.items()}
    assert got["valid_tokens"] == n
    assert got["clipfrac_upper"] == pytest.approx(upper.sum() / n)
    assert got["clipfrac_lower"] == pytest.approx(lower.sum() / n)
    assert got["clipfrac"] == pytest.approx((upper | lower).sum() / n)
    assert got["clipfrac_pos_adv"] == pytest.approx(((upper | lower) & (a > 0) & m).sum() / ((a > 0) & m).sum())
    assert got["clipfrac_neg_adv"] == pytest.approx(((upper | lower) & (a < 0) & m).sum() / ((a < 0) & m).sum())
    valid_r = r[m]
    assert got["ratio_mean"] == pytest.approx(valid_r.mean())
    assert got["ratio_max"] == pytest.approx(valid_r.max())
    assert got["ratio_p95"] == pytest.approx(np.percentile(valid_r, 95, method="inverted_cdf"))
    assert got["logprob_abs_diff"] == pytest.approx(np.abs(np.log(valid_r)).mean())
    assert got["finite_lower_frac"] == 1.0 and got["finite_upper_frac"] == 1.0
    assert got["log_bound_upper_mean"] == pytest.approx(np.log(1.2))
    assert got["log_bound_lower_mean"] == pytest.approx(np.log(0.8))
    assert float(out.clipped.sum()) == (upper | lower).sum()


def test_position_bins_and_their_spread():
    lp, blp, adv, mask = _batch(seed=1)
    out = compute_policy_loss("epic", lp, blp, adv, mask)
    clipped = out.clipped.numpy()
    m = mask.numpy()
    tokens = np.zeros(10)
    hits = np.zeros(10)
    for b in range(m.shape[0]):
        length = m[b].sum()
        for t in range(length):
            k = min(int(10 * t / length), 9)
            tokens[k] += 1
            hits[k] += clipped[b, t]
    frac = np.where(tokens > 0, hits / np.maximum(tokens, 1), 0)
    for k in range(10):
        assert float(out.metrics[f"clipfrac_position_bin_{k}"]) == pytest.approx(frac[k])
    occupied = frac[tokens > 0]
    assert float(out.metrics["clipfrac_position_cv"]) == pytest.approx(occupied.std() / occupied.mean())
    # Prefix statistics.
    lam = np.where(m, (lp - blp).numpy(), 0)
    L = np.cumsum(lam, 1)
    t = np.maximum(np.cumsum(m, 1), 1)
    assert float(out.metrics["abs_L_mean"]) == pytest.approx(np.abs(L)[m].mean())
    assert float(out.metrics["abs_z_mean"]) == pytest.approx(np.abs(L / t)[m].mean())
    assert 0 < float(out.metrics["clipfrac"]) < 1


# Top-K modes need extra inputs: tests/losses/test_losses_trust_region.py checks their metric names.
@pytest.mark.parametrize("mode", sorted(m for m, spec in LOSS_MODES.items() if not spec.needs_topk))
def test_every_mode_reports_the_same_metric_names(mode):
    lp, blp, adv, mask = _batch()
    names = set(compute_policy_loss(mode, lp, blp, adv, mask).metrics)
    expected = {
        "clipfrac",
        "clipfrac_upper",
        "clipfrac_lower",
        "clipfrac_pos_adv",
        "clipfrac_neg_adv",
        "clipfrac_position_cv",
        "finite_lower_frac",
        "finite_upper_frac",
        "abs_z_mean",
        "abs_L_mean",
        "log_bound_lower_mean",
        "log_bound_upper_mean",
        "ratio_mean",
        "ratio_p95",
        "ratio_max",
        "logprob_abs_diff",
        "value_capped_frac",
        "valid_tokens",
        "empty_responses",
        *(f"clipfrac_position_bin_{k}" for k in range(10)),
    }
    assert expected <= names


def test_metrics_can_be_skipped():
    lp, blp, adv, mask = _batch()
    assert compute_policy_loss("epic", lp, blp, adv, mask, compute_metrics=False).metrics == {}


def _parse(argv):
    parser = add_policy_loss_arguments(argparse.ArgumentParser())
    return policy_loss_config_from_args(parser.parse_args(argv))


def test_flags_defaults_and_overrides():
    assert _parse([]) == ("epic", {}, "seq-mean-token-mean")
    assert _parse(["--policy-loss", "dapo"]) == ("dapo", {}, "token-mean")
    assert _parse(["--policy-loss", "grpo", "--grpo-dual-clip", "3", "--grpo-clip-high", "0.28"]) == (
        "grpo",
        {"dual_clip": 3, "clip_high": 0.28},
        "seq-mean-token-mean",
    )
    assert _parse(
        ["--policy-loss", "epic_cumulative", "--epic-delta-low", "1e-3", "--policy-loss-aggregation", "token-mean"]
    ) == ("epic_cumulative", {"delta_low": 1e-3}, "token-mean")


def test_flags_reject_mismatched_family_and_bad_values():
    with pytest.raises(PolicyLossInputError, match="--epic-delta-low=0.001 applies to the 'epic' modes"):
        _parse(["--policy-loss", "grpo", "--epic-delta-low", "1e-3"])
    with pytest.raises(PolicyLossInputError, match="clip_low=1.5 must be a number in"):
        _parse(["--policy-loss", "grpo", "--grpo-clip-low", "1.5"])
    with pytest.raises(SystemExit):
        _parse(["--policy-loss", "nope"])


def test_kl_penalty_estimators_against_direct_formulas():
    from epic_slime.losses.kl import kl_penalty

    g = torch.Generator().manual_seed(4)
    lp = -torch.rand(50, generator=g, dtype=torch.float64) * 3
    ref = -torch.rand(50, generator=g, dtype=torch.float64) * 3
    d = (lp - ref).numpy()
    np.testing.assert_allclose(kl_penalty(lp, ref, "k1").numpy(), d)
    np.testing.assert_allclose(kl_penalty(lp, ref, "k2").numpy(), d**2 / 2)
    np.testing.assert_allclose(kl_penalty(lp, ref, "k3").numpy(), np.exp(-d) - 1 + d, rtol=1e-12)
    assert float(kl_penalty(torch.tensor([0.0]), torch.tensor([20.0]), "low_var_kl")) == 10.0
    assert kl_penalty(lp.float(), ref.float(), "k3").dtype == torch.float32
    with pytest.raises(ValueError, match="k4"):
        kl_penalty(lp, ref, "k4")
