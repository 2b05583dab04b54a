"""CPPO, BandPO, ACPO and DPPO Top-K against independent references written from docs/losses.md.

References: tests/support/loss_reference.py (plain Python / mpmath, token by token), brute-force scans of
the divergence constraint, mpmath root finding, and divergences computed directly from full
distributions on a small vocabulary.
"""

from __future__ import annotations

import argparse
import math
import zlib

import mpmath as mp
import numpy as np
import pytest
import torch

from support.loss_reference import loss_and_grad, percentile_linear
from epic_slime.losses import LOSS_MODES, PolicyLossInputError, compute_policy_loss
from epic_slime.losses.inputs import prepare_batch
from epic_slime.losses.flags import _parse_value, add_policy_loss_arguments, policy_loss_config_from_args
from epic_slime.losses.topk import (
    TopKInputs,
    append_sampled_token,
    behavior_topk_set,
    gather_log_probs,
    synthetic_topk_inputs,
    topk_inputs_around,
    topk_inputs_from_logits,
)
from epic_slime.losses.trust_region import (
    acpo,
    acpo_bin_epsilons,
    bandpo,
    bandpo_log_bounds,
    cppo,
    cppo_position_weights,
    dppo_topk_kl,
    dppo_topk_tv,
    row_quantile,
    topk_kl,
    topk_total_variation,
)

NEW_MODES = ["cppo", "bandpo", "acpo", "dppo_topk_tv", "dppo_topk_kl"]
TOPK_MODES = ["dppo_topk_tv", "dppo_topk_kl"]
NAN = float("nan")


# ------------------------------------------------------------------------------------------------
# Batches and the reference check
# ------------------------------------------------------------------------------------------------


def make_batch(
    seed: int, noise: float, B: int = 5, T: int = 16, dtype=torch.float64, vocab: int = 8, k: int = 3, noise_rows=None
):
    """Full softmax policies over a small vocabulary: mu = softmax(behaviour logits), pi = mu's
    logits + noise; tokens sampled from mu; variable lengths (row 0 full, one row of length 1);
    NaN garbage on padding, Top-K inputs included. ``noise_rows`` scales the noise per row."""
    g = torch.Generator().manual_seed(seed)
    behavior_logits = 2.0 * torch.randn(B, T, vocab, generator=g, dtype=torch.float64)
    scale = noise if noise_rows is None else noise * torch.tensor(noise_rows, dtype=torch.float64)[:, None, None]
    logits = behavior_logits + scale * torch.randn(B, T, vocab, generator=g, dtype=torch.float64)
    sampled = torch.multinomial(torch.softmax(behavior_logits, -1).reshape(-1, vocab), 1, generator=g).reshape(B, T)
    lp = gather_log_probs(logits, sampled[..., None]).squeeze(-1)
    blp = gather_log_probs(behavior_logits, sampled[..., None]).squeeze(-1)
    topk = topk_inputs_from_logits(logits, behavior_logits, sampled, k)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    lengths[-1] = 1
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lp = torch.where(mask, lp, NAN)
    behavior_topk = torch.where(mask[..., None], topk.behavior_topk_log_probs, NAN)
    return (
        lp.to(dtype),
        blp.to(dtype),
        adv.to(dtype),
        mask,
        TopKInputs(behavior_topk.to(dtype), topk.current_topk_log_probs.to(dtype), topk.topk_mask),
    )


def _extras(topk: TopKInputs) -> dict:
    return {
        "behavior_topk": topk.behavior_topk_log_probs.double().tolist(),
        "current_topk": topk.current_topk_log_probs.double().tolist(),
        "topk_mask": topk.topk_mask.tolist(),
    }


def check(mode, lp, blp, adv, mask, topk, params, aggregation=None, rtol=1e-10, atol=1e-12):
    """Loss and gradient of the core against the reference; returns the output."""
    aggregation = aggregation or LOSS_MODES[mode].aggregation
    lp_leaf = lp.clone().requires_grad_(True)
    out = compute_policy_loss(mode, lp_leaf, blp, adv, mask, aggregation=aggregation, **topk.loss_kwargs(), **params)
    out.loss.backward()
    full = {**LOSS_MODES[mode].defaults, **params}
    B, T = lp.shape
    adv_bt = adv[:, None].expand(B, T) if adv.dim() == 1 else adv
    as_list = lambda x: x.double().tolist()  # noqa: E731
    ref_loss, ref_grad = loss_and_grad(
        mode, as_list(lp), as_list(blp), as_list(adv_bt), mask.tolist(), full, aggregation, _extras(topk)
    )
    assert float(out.loss.detach()) == pytest.approx(ref_loss, rel=rtol, abs=atol), (mode, params, aggregation)
    torch.testing.assert_close(lp_leaf.grad.double(), torch.tensor(ref_grad, dtype=torch.float64), rtol=rtol, atol=atol)
    return out


def terms_of(fn, lp, blp, adv, mask, topk, **params):
    adv_bt = adv[:, None].expand_as(lp) if adv.dim() == 1 else adv
    batch = prepare_batch(lp, blp, adv_bt, mask, **topk.loss_kwargs())
    return batch, fn(batch, **params), adv_bt


CASES = [
    ("cppo", {}),
    ("cppo", {"delta": 0.15, "weight_min": 0.5, "budget_delta": 0.05}),
    ("bandpo", {}),
    ("bandpo", {"generator": "tv"}),
    ("bandpo", {"generator": "chi2", "delta": 0.2}),
    ("acpo", {}),
    ("acpo", {"eps_base": 0.1, "alpha": 0.3, "eps_min": 0.1, "eps_max": 0.3}),
    ("dppo_topk_tv", {}),
    ("dppo_topk_kl", {}),
    ("dppo_topk_kl", {"clip_low": 0.2, "ratio_cap": 1.5}),
]


@pytest.mark.parametrize("mode,params", CASES)
@pytest.mark.parametrize("noise", [0.05, 0.6])
def test_mode_matches_reference_float64(mode, params, noise):
    # crc32, not hash(): str hashes change per process, so a failure would not reproduce
    lp, blp, adv, mask, topk = make_batch(seed=zlib.crc32(f"{mode}/{noise}".encode()) % 1000, noise=noise)
    check(mode, lp, blp, adv, mask, topk, params)


@pytest.mark.parametrize("mode", NEW_MODES)
def test_mode_matches_reference_float32(mode):
    lp, blp, adv, mask, topk = make_batch(seed=7, noise=0.3, dtype=torch.float32)
    check(mode, lp, blp, adv, mask, topk, {}, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("mode", ["cppo", "acpo", "dppo_topk_tv"])
def test_every_aggregation(mode, aggregation):
    lp, blp, adv, mask, topk = make_batch(seed=11, noise=0.4)
    check(mode, lp, blp, adv, mask, topk, {}, aggregation=aggregation)


def test_per_token_advantages():
    lp, blp, adv, mask, topk = make_batch(seed=5, noise=0.5)
    adv_bt = adv[:, None] * torch.linspace(-1, 1, lp.shape[1], dtype=torch.float64)[None, :]
    for mode in NEW_MODES:
        check(mode, lp, blp, adv_bt, mask, topk, {})


# ------------------------------------------------------------------------------------------------
# Every keep / mask branch occurs (so that agreement with the reference means something)
# ------------------------------------------------------------------------------------------------


def _signs(B, T):
    adv = torch.ones(B, T, dtype=torch.float64)
    adv[:, 1::2] = -1.0
    adv[1::2] *= -1.0
    return adv


def test_cppo_branches():
    # Rows with very different noise so that the P90 budget is below, inside and above [db, 2 db].
    lp, blp, adv, mask, topk = make_batch(seed=1, noise=1.0, B=6, T=40, noise_rows=[1.0, 0.005, 0.05, 0.1, 2.0, 1.0])
    adv = _signs(*lp.shape)
    check("cppo", lp, blp, adv, mask, topk, {})
    batch, terms, _ = terms_of(cppo, lp, blp, adv, mask, topk)
    valid = batch.valid
    lam = batch.log_ratio
    away = ((adv > 0) & (lam > 0)) | ((adv < 0) & (lam < 0))
    masked = (terms.clipped_upper | terms.clipped_lower) & valid
    assert (valid & ~away & ~masked).any()  # kept: moves back toward mu
    assert (valid & away & ~masked).any()  # kept: moves away, within the threshold
    assert (terms.clipped_upper & valid).any() and (terms.clipped_lower & valid).any()
    assert not (masked & ~away).any()
    # "Loss on kept tokens": masked tokens carry neither value nor gradient; kept ones A r.
    assert torch.equal(terms.coef[masked], torch.zeros_like(terms.coef[masked]))
    assert torch.equal(terms.value[masked], torch.zeros_like(terms.value[masked]))
    kept = valid & ~masked
    torch.testing.assert_close(terms.value[kept], (adv * torch.exp(lam))[kept])
    d = (torch.exp(batch.log_probs) - torch.exp(batch.behavior_log_probs)).abs()
    p90 = row_quantile(d, valid, 0.9)
    assert (p90 < 0.02).any() and ((p90 > 0.02) & (p90 < 0.04)).any() and (p90 > 0.04).any()


def test_cppo_row_quantile_and_position_weights():
    g = torch.Generator().manual_seed(0)
    values = torch.rand(6, 11, generator=g, dtype=torch.float64)
    lengths = torch.tensor([11, 1, 2, 5, 0, 10])
    valid = torch.arange(11)[None] < lengths[:, None]
    got = row_quantile(values, valid, 0.9)
    for b, n in enumerate(lengths.tolist()):
        want = np.percentile(values[b, :n].numpy(), 90) if n else 0.0
        assert float(got[b]) == pytest.approx(want, rel=1e-14)
        if n:
            assert percentile_linear(values[b, :n].tolist(), 0.9) == pytest.approx(want, rel=1e-14)
    assert row_quantile(values[:, :0], valid[:, :0], 0.9).shape == (6,)
    batch = prepare_batch(-values, -values, torch.zeros(6), valid)
    w = cppo_position_weights(batch, 0.8)
    assert float(w[0, 0]) == 1.0 and float(w[0, 10]) == pytest.approx(0.8) and float(w[0, 5]) == pytest.approx(0.9)
    assert float(w[1, 0]) == 1.0  # T = 1
    assert float(w[2, 0]) == 1.0 and float(w[2, 1]) == pytest.approx(0.8)


@pytest.mark.parametrize("generator", ["kl", "tv", "chi2"])
def test_bandpo_branches(generator):
    lp, blp, adv, mask, topk = make_batch(seed=2, noise=1.5, B=4, T=24)
    adv = _signs(*lp.shape)
    check("bandpo", lp, blp, adv, mask, topk, {"generator": generator})
    batch, terms, _ = terms_of(bandpo, lp, blp, adv, mask, topk, generator=generator)
    pos, neg = (adv > 0) & batch.valid, (adv < 0) & batch.valid
    inside = ~(terms.clipped_upper | terms.clipped_lower)
    assert (pos & terms.clipped_upper).any() and (pos & inside).any()
    assert (neg & terms.clipped_lower).any() and (neg & inside).any()
    # PPO semantics: a negative-advantage token above hi keeps its gradient.
    above = neg & (batch.log_ratio >= terms.log_upper)
    assert above.any() and not (above & terms.clipped_upper).any()
    assert not (pos & terms.clipped_lower).any()


def test_bandpo_bound_regimes():
    """lo = 0 (TV, chi^2 when q is small), hi = 1/q (q near 1), hi capped at 10 (q small)."""
    log_q = torch.log(torch.tensor([0.001, 0.04, 0.5, 0.97, 0.9999], dtype=torch.float64))
    lo, hi = bandpo_log_bounds(log_q, 0.05, "tv")
    assert torch.isinf(lo[:2]).all() and (lo[:2] < 0).all() and torch.isfinite(lo[2:]).all()
    assert float(hi[0]) == pytest.approx(math.log(10.0)) and float(hi[1]) == pytest.approx(math.log(2.25))
    torch.testing.assert_close(hi[3:], -log_q[3:])  # 1 + delta / q > 1 / q
    lo, hi = bandpo_log_bounds(log_q, 0.05, "chi2", ratio_cap=3.0)
    assert torch.isinf(lo[:1]).all() and float(hi[0]) == pytest.approx(math.log(3.0))
    lo, hi = bandpo_log_bounds(log_q, 0.05, "kl")
    assert torch.isfinite(lo).all() and (lo < 0).all() and (hi > 0).all() and (hi < -log_q + 1e-15).all()
    assert float(hi[0]) == pytest.approx(math.log(10.0))


def test_acpo_branches_and_bin_statistics():
    lp, blp, adv, mask, topk = make_batch(seed=3, noise=0.8, B=6, T=40, noise_rows=[1, 1, 1, 1, 0.01, 0.01])
    adv = _signs(*lp.shape)
    params = {"eps_base": 0.1, "alpha": 0.5, "eps_min": 0.16, "eps_max": 0.3}
    out = check("acpo", lp, blp, adv, mask, topk, params)
    batch, terms, _ = terms_of(acpo, lp, blp, adv, mask, topk, **params)
    eps, bins = acpo_bin_epsilons(batch, **params)
    # Population std per bin against numpy over the valid tokens.
    q = np.exp(blp.numpy())
    r = np.exp((lp - blp).numpy())
    m = mask.numpy()
    want_bins = np.minimum(np.floor(q * 5), 4).astype(int)
    for k in range(5):
        in_bin = m & (want_bins == k)
        std = r[in_bin].std(ddof=0) if in_bin.any() else 0.0
        assert float(eps[k]) == pytest.approx(min(max(0.1 + 0.5 * std, 0.16), 0.3), rel=1e-12)
        assert float(out.metrics[f"acpo_eps_bin_{k}"]) == pytest.approx(float(eps[k]))
    assert (eps == 0.16).any() and (eps == 0.3).any() and ((eps > 0.16) & (eps < 0.3)).any(), eps
    pos, neg = (adv > 0) & batch.valid, (adv < 0) & batch.valid
    inside = ~(terms.clipped_upper | terms.clipped_lower)
    assert (pos & terms.clipped_upper).any() and (pos & inside).any()
    assert (neg & terms.clipped_lower).any() and (neg & inside).any()
    with pytest.raises(PolicyLossInputError, match="eps_min=0.3 must be <= eps_max=0.2"):
        compute_policy_loss("acpo", lp, blp, adv, mask, eps_min=0.3, eps_max=0.2)


@pytest.mark.parametrize("fn,mode", [(dppo_topk_tv, "dppo_topk_tv"), (dppo_topk_kl, "dppo_topk_kl")])
def test_dppo_topk_branches(fn, mode):
    lp, blp, adv, mask, topk = make_batch(seed=4, noise=1.2, B=4, T=30)
    adv = _signs(*lp.shape)
    check(mode, lp, blp, adv, mask, topk, {})
    batch, terms, _ = terms_of(fn, lp, blp, adv, mask, topk)
    valid = batch.valid
    masked = (terms.clipped_upper | terms.clipped_lower) & valid
    up = batch.log_probs > batch.behavior_log_probs
    assert (terms.clipped_upper & valid).any() and (terms.clipped_lower & valid).any()
    assert (valid & ~masked & (((adv > 0) & ~up) | ((adv < 0) & up))).any()  # kept: wrong direction
    divergence = (topk_total_variation if mode.endswith("tv") else topk_kl)(batch)
    threshold = LOSS_MODES[mode].defaults["clip_high"]
    assert (valid & ~masked & (divergence <= threshold)).any()  # kept: small divergence
    assert (valid & ~masked & (divergence > threshold)).any()  # kept despite a large one
    assert not (terms.clipped_upper & ~up).any()
    name = f"topk_{mode[-2:]}_mean"
    assert float(terms.extra_metrics[name]) == pytest.approx(float(divergence[valid].mean()), rel=1e-12)
    assert name in compute_policy_loss(mode, lp, blp, adv, mask, **topk.loss_kwargs()).metrics


# ------------------------------------------------------------------------------------------------
# BandPO's bounds: closed forms against a scan, the KL band against mpmath
# ------------------------------------------------------------------------------------------------


def _two_point_divergence(generator, q, r):
    u = (1.0 - r * q) / (1.0 - q)
    if generator == "tv":
        f = lambda x: np.abs(x - 1.0) / 2.0  # noqa: E731
    elif generator == "chi2":
        f = lambda x: (x - 1.0) ** 2  # noqa: E731
    else:
        f = lambda x: np.where(x > 0, x - 1.0 - np.log(np.maximum(x, 1e-300)), np.inf)  # noqa: E731
    return q * f(r) + (1.0 - q) * f(u)


@pytest.mark.parametrize("generator", ["tv", "chi2", "kl"])
def test_bandpo_bounds_against_a_scan_of_the_constraint(generator):
    """The band is {r in [0, 1/q]: D_f <= delta}: scan r on a grid of 200001 points and compare
    its smallest and largest feasible r with the bounds (to the grid's spacing)."""
    qs = [0.01, 0.03, 0.1, 0.3, 0.5, 0.8, 0.95, 0.99]
    for delta in (0.01, 0.05, 0.3):
        log_q = torch.log(torch.tensor(qs, dtype=torch.float64))
        lo, hi = bandpo_log_bounds(log_q, delta, generator, ratio_cap=1e9)
        for i, q in enumerate(qs):
            r = np.linspace(0.0, 1.0 / q, 200001)
            feasible = r[_two_point_divergence(generator, q, r) <= delta]
            step = r[1] - r[0]
            assert math.exp(float(lo[i])) == pytest.approx(feasible.min(), abs=step * 1.01), (q, delta)
            assert math.exp(float(hi[i])) == pytest.approx(feasible.max(), abs=step * 1.01), (q, delta)


def _mp_band(log_q, delta):
    """KL band [lo, hi] at q = e^{log_q} (exactly; 1 - q matters near q = 1) by mpmath.findroot (Anderson, bracketed): lower side in y = log r, upper side
    in v = log of the rest bucket's ratio u, r = (1 - (1 - q) e^v) / q; KL = -q log r - (1 - q) log u."""
    q, delta = mp.exp(mp.mpf(log_q)), mp.mpf(delta)
    kl = lambda r, u: -q * mp.log(r) - (1 - q) * mp.log(u) - delta  # noqa: E731
    lower = lambda y: kl(mp.exp(y), (1 - q * mp.exp(y)) / (1 - q))  # noqa: E731
    upper = lambda v: kl((1 - (1 - q) * mp.exp(v)) / q, mp.exp(v))  # noqa: E731
    y = mp.findroot(lower, (-2 * (1 + delta / q), mp.mpf(0)), solver="anderson")
    v = mp.findroot(upper, (-2 * (1 + delta / (1 - q)), mp.mpf(0)), solver="anderson")
    return mp.exp(y), (1 - (1 - q) * mp.exp(v)) / q


def test_bandpo_kl_band_against_mpmath():
    """The issue's target, 1e-6 relative in float32 (1e-11 in float64), against mpmath; q from 1e-20
    to 1 - 1e-12, delta from 1e-8 to 10. The bounds are returned in log space, y = log r, and a
    relative error on r = e^y is an absolute one on y: float32's rounding of y alone is |y| 6e-8.
    So: float64: relative on r wherever r > e^-80, else relative on y (y reaches -1e18);
    float32: relative on y everywhere, and relative on r wherever |y| <= 8 (r in [3e-4, 3e3]:
    every hi, capped at 10 in use, and every lo that is not practically 0).
    Also 1e-8 relative on the half-widths 1 - lo, hi - 1 in float64."""
    mp.mp.dps = 40
    g = torch.Generator().manual_seed(0)
    n = 300
    log_q = torch.cat(
        [
            -torch.rand(n // 2, generator=g, dtype=torch.float64) * 46,
            -torch.exp(-torch.rand(n // 2, generator=g, dtype=torch.float64) * 27.6),
        ]
    )
    deltas = torch.exp(torch.rand(n, generator=g, dtype=torch.float64) * 21.0 - 18.4)
    worst = {"float64": 0.0, "float32": 0.0, "float32_log": 0.0, "half_width": 0.0}
    for dtype, name in ((torch.float64, "float64"), (torch.float32, "float32")):
        lq = log_q.to(dtype)
        for i in range(n):  # delta is a scalar parameter: one call per point (vectorisation: next test)
            lo, hi = bandpo_log_bounds(lq[i : i + 1], float(deltas[i]), "kl", ratio_cap=1e300)
            ref_lo, ref_hi = _mp_band(float(lq[i]), float(deltas[i]))
            for got_log, ref in ((lo, ref_lo), (hi, ref_hi)):
                got_log = mp.mpf(float(got_log))
                log_err = float(abs(got_log - mp.log(ref)) / abs(mp.log(ref)))
                ratio_err = float(abs(mp.exp(got_log) - ref) / ref)
                if dtype == torch.float64:
                    worst[name] = max(worst[name], ratio_err if ref > mp.exp(-80) else log_err)
                else:
                    worst["float32_log"] = max(worst["float32_log"], log_err)
                    if abs(mp.log(ref)) <= 8:
                        worst[name] = max(worst[name], ratio_err)
                if dtype == torch.float64:
                    width = abs(mp.expm1(got_log) - (ref - 1)) / abs(ref - 1)
                    worst["half_width"] = max(worst["half_width"], float(width))
    print("BandPO KL band, worst relative error against mpmath:", worst)
    assert worst["float64"] < 1e-11, worst
    assert worst["float32"] < 1e-6 and worst["float32_log"] < 1e-6, worst
    assert worst["half_width"] < 1e-8, worst


def test_bandpo_kl_band_is_vectorised_and_handles_the_limits():
    g = torch.Generator().manual_seed(1)
    log_q = -torch.rand(3000, generator=g, dtype=torch.float64) * 30
    lo, hi = bandpo_log_bounds(log_q, 0.05, "kl", ratio_cap=1e300)
    for i in range(0, 3000, 300):  # the same numbers as one element at a time
        one_lo, one_hi = bandpo_log_bounds(log_q[i : i + 1], 0.05, "kl", ratio_cap=1e300)
        assert float(one_lo) == float(lo[i]) and float(one_hi) == float(hi[i])
    # q -> 1: [e^{-delta}, 1]; q -> 0: [0, 1/q] (before the cap); q = 1 and q = 0 exactly stay finite.
    edge = torch.tensor([0.0, -1e-15, -60.0, -800.0, -math.inf], dtype=torch.float64)
    lo, hi = bandpo_log_bounds(edge, 0.05, "kl", ratio_cap=1e300)
    assert float(lo[0]) == pytest.approx(-0.05, rel=1e-12) and float(lo[1]) == pytest.approx(-0.05, rel=1e-9)
    assert 0 <= float(hi[0]) < 1e-200 and float(hi[1]) == pytest.approx(1e-15, rel=1e-6)
    assert math.exp(float(lo[2])) == 0.0 and float(hi[2]) < 60.0  # hi <= 1/q
    assert float(hi[2]) == pytest.approx(float(mp.log(_mp_band(-60.0, 0.05)[1])), rel=1e-12)
    assert not torch.isnan(lo).any() and not torch.isnan(hi).any()
    assert math.exp(float(lo[3])) == 0.0 and math.exp(float(lo[4])) == 0.0
    lo32, hi32 = bandpo_log_bounds(edge.float(), 0.05, "kl")
    assert lo32.dtype == torch.float32 and float(hi32[3]) == pytest.approx(math.log(10.0))


# ------------------------------------------------------------------------------------------------
# Top-K divergences against direct computation on full distributions
# ------------------------------------------------------------------------------------------------


def _full_batch(seed, vocab, B=3, T=5, noise=0.7):
    g = torch.Generator().manual_seed(seed)
    behavior_logits = torch.randn(B, T, vocab, generator=g, dtype=torch.float64) * 1.5
    logits = behavior_logits + noise * torch.randn(B, T, vocab, generator=g, dtype=torch.float64)
    sampled = torch.randint(0, vocab, (B, T), generator=g)
    return logits, behavior_logits, sampled


@pytest.mark.parametrize("k", [1, 3, 6])
def test_topk_divergences_against_direct_computation(k):
    vocab = 6
    logits, behavior_logits, sampled = _full_batch(seed=k, vocab=vocab)
    topk = topk_inputs_from_logits(logits, behavior_logits, sampled, k)
    lp = gather_log_probs(logits, sampled[..., None]).squeeze(-1)
    blp = gather_log_probs(behavior_logits, sampled[..., None]).squeeze(-1)
    batch = prepare_batch(lp, blp, torch.ones(3), torch.ones(3, 5, dtype=torch.bool), **topk.loss_kwargs())
    tv, kl = topk_total_variation(batch), topk_kl(batch)
    mu = torch.softmax(behavior_logits, -1).numpy()
    pi = torch.softmax(logits, -1).numpy()
    for b in range(3):
        for t in range(5):
            in_set = set(np.argsort(-mu[b, t])[:k].tolist()) | {int(sampled[b, t])}
            rest = [v for v in range(vocab) if v not in in_set]
            mu_set, pi_set = mu[b, t, sorted(in_set)], pi[b, t, sorted(in_set)]
            mu_rest, pi_rest = max(mu[b, t, rest].sum(), 1e-12), max(pi[b, t, rest].sum(), 1e-12)
            want_tv = 0.5 * (np.abs(mu_set - pi_set).sum() + abs(mu_rest - pi_rest))
            want_kl = (mu_set * np.log(mu_set / pi_set)).sum() + mu_rest * np.log(mu_rest / pi_rest)
            assert float(tv[b, t]) == pytest.approx(want_tv, rel=1e-10, abs=1e-12)
            assert float(kl[b, t]) == pytest.approx(want_kl, rel=1e-9, abs=1e-11)
            # Coarse-graining never increases a divergence; with the full vocabulary it is exact.
            exact_tv = 0.5 * np.abs(mu[b, t] - pi[b, t]).sum()
            exact_kl = (mu[b, t] * np.log(mu[b, t] / pi[b, t])).sum()
            assert float(tv[b, t]) <= exact_tv + 1e-12 and float(kl[b, t]) <= exact_kl + 1e-12
            if k == vocab:
                assert float(tv[b, t]) == pytest.approx(exact_tv, rel=1e-10)
                assert float(kl[b, t]) == pytest.approx(exact_kl, rel=1e-9)


@pytest.mark.parametrize("topk_mode,binary_mode", [("dppo_topk_tv", "dppo_tv"), ("dppo_topk_kl", "dppo_kl")])
def test_topk_with_only_the_sampled_token_is_the_binary_rule(topk_mode, binary_mode):
    """A set holding only the sampled token makes the Top-K divergence the binary one."""
    lp, blp, adv, mask, _ = make_batch(seed=9, noise=1.0, B=4, T=20)
    only_sampled = TopKInputs(
        blp.unsqueeze(-1), torch.where(mask, lp, 0.0).unsqueeze(-1), torch.ones(*lp.shape, 1, dtype=torch.bool)
    )
    got = compute_policy_loss(topk_mode, lp, blp, adv, mask, **only_sampled.loss_kwargs())
    want = compute_policy_loss(binary_mode, lp, blp, adv, mask)
    assert torch.equal(got.clipped, want.clipped) and got.clipped.any()
    assert float(got.loss) == pytest.approx(float(want.loss), rel=1e-12)


# ------------------------------------------------------------------------------------------------
# Top-K inputs: building, gradients, errors
# ------------------------------------------------------------------------------------------------


def test_append_sampled_token_masks_duplicates_and_absent_ids():
    topk_ids = torch.tensor([[[4, 2, 7], [1, 0, -1]]])
    sampled = torch.tensor([[2, 5]])
    ids, mask = append_sampled_token(topk_ids, sampled)
    assert ids.tolist() == [[[4, 2, 7, 2], [1, 0, -1, 5]]]
    assert mask.tolist() == [[[True, True, True, False], [True, True, False, True]]]


def test_current_topk_log_probs_never_carry_the_gradient():
    """The loss gradient reaches the trainer's logits only through log pi of the sampled tokens."""
    logits, behavior_logits, sampled = _full_batch(seed=3, vocab=7, B=2, T=6, noise=1.5)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    grads = []
    for detach in (False, True):
        leaf = logits.clone().requires_grad_(True)
        topk = topk_inputs_from_logits(leaf, behavior_logits, sampled, 2)
        assert topk.current_topk_log_probs.requires_grad
        kwargs = topk.loss_kwargs()
        if detach:
            kwargs["current_topk_log_probs"] = kwargs["current_topk_log_probs"].detach()
        lp = gather_log_probs(leaf, sampled[..., None]).squeeze(-1)
        blp = gather_log_probs(behavior_logits, sampled[..., None]).squeeze(-1)
        out = compute_policy_loss("dppo_topk_kl", lp, blp, adv, torch.ones(2, 6, dtype=torch.bool), **kwargs)
        out.loss.backward()
        grads.append(leaf.grad)
    assert torch.equal(grads[0], grads[1]) and grads[0].abs().sum() > 0


@pytest.mark.parametrize("mode", TOPK_MODES)
def test_topk_mode_without_its_inputs_says_what_to_pass(mode):
    lp, blp, adv, mask, _ = make_batch(seed=0, noise=0.1)
    with pytest.raises(
        PolicyLossInputError,
        match=rf"mode '{mode}' needs .* behavior_topk_log_probs=\[B, T, K\] "
        r".*current_topk_log_probs=\[B, T, K\].*topk_inputs_from_logits",
    ):
        compute_policy_loss(mode, lp, blp, adv, mask)


def test_topk_input_errors_name_the_field():
    lp, blp, adv, mask, topk = make_batch(seed=0, noise=0.1, B=3, T=6)
    behavior, current, used = topk.behavior_topk_log_probs, topk.current_topk_log_probs, topk.topk_mask
    call = lambda **kw: compute_policy_loss("dppo_topk_tv", lp, blp, adv, mask, **kw)  # noqa: E731
    with pytest.raises(PolicyLossInputError, match="current_topk_log_probs is missing"):
        call(behavior_topk_log_probs=behavior)
    with pytest.raises(PolicyLossInputError, match="behavior_topk_log_probs is missing"):
        call(current_topk_log_probs=current, topk_mask=used)
    with pytest.raises(
        PolicyLossInputError, match=r"behavior_topk_log_probs must be \[B, T, K\] with \[B, T\] = \(3, 6\)"
    ):
        call(behavior_topk_log_probs=behavior[:, :5], current_topk_log_probs=current[:, :5])
    with pytest.raises(PolicyLossInputError, match="current_topk_log_probs shape"):
        call(behavior_topk_log_probs=behavior, current_topk_log_probs=current[..., :2])
    with pytest.raises(PolicyLossInputError, match="topk_mask must be a bool tensor"):
        call(behavior_topk_log_probs=behavior, current_topk_log_probs=current, topk_mask=used.float())
    with pytest.raises(PolicyLossInputError, match="current_topk_log_probs must be a torch.Tensor, got list"):
        call(behavior_topk_log_probs=behavior, current_topk_log_probs=current.tolist())
    bad = current.clone()
    bad[0, 2, 1] = NAN
    with pytest.raises(PolicyLossInputError, match=r"current_topk_log_probs has a non-finite value nan .*\(0, 2, 1\)"):
        call(behavior_topk_log_probs=behavior, current_topk_log_probs=bad, topk_mask=used)
    bad = behavior.clone()
    bad[1, 0, 0] = 0.5
    with pytest.raises(PolicyLossInputError, match=r"behavior_topk_log_probs has a positive value 0.5 .*\(1, 0, 0\)"):
        call(behavior_topk_log_probs=bad, current_topk_log_probs=current, topk_mask=used)
    # A duplicate id counted twice: the set's probabilities sum beyond 1.
    dup = behavior.clone()
    dup[2, 0, 1] = dup[2, 0, 0] = math.log(0.6)
    with pytest.raises(
        PolicyLossInputError, match=r"behavior_topk_log_probs has probabilities summing beyond 1.*\(2, 0\)"
    ):
        call(behavior_topk_log_probs=dup, current_topk_log_probs=current, topk_mask=used)
    # The sampled token dropped from the set.
    missing = used.clone()
    near = (behavior - blp.unsqueeze(-1)).abs() < 1e-2
    missing[0, 1] &= ~near[0, 1]
    with pytest.raises(PolicyLossInputError, match=r"behavior_topk_log_probs lacks the sampled token .*\(0, 1\)"):
        call(behavior_topk_log_probs=behavior, current_topk_log_probs=current, topk_mask=missing)
    # A probability of 0 in the set (log = -inf) is allowed: KL(mu || pi) is +inf where pi_i = 0 < mu_i.
    zero_b, zero_c = behavior.clone(), current.clone()
    other = [k for k in range(behavior.shape[-1]) if used[0, 3, k] and abs(float(behavior[0, 3, k] - blp[0, 3])) > 0.1]
    zero_b[0, 3, other[0]], zero_c[0, 3, other[-1]] = -math.inf, -math.inf
    out = call(behavior_topk_log_probs=zero_b, current_topk_log_probs=zero_c, topk_mask=used)
    batch = prepare_batch(
        lp,
        blp,
        adv[:, None].expand_as(lp),
        mask,
        behavior_topk_log_probs=zero_b,
        current_topk_log_probs=zero_c,
        topk_mask=used,
    )
    kl = topk_kl(batch)
    assert torch.isfinite(out.loss) and torch.isfinite(topk_total_variation(batch)[mask]).all()
    assert math.isinf(float(kl[0, 3])) and torch.isfinite(kl[mask & (torch.arange(6) != 3)]).all()
    # ... unless validation is off (no host sync), and garbage on unused columns never matters.
    call(behavior_topk_log_probs=behavior, current_topk_log_probs=current, topk_mask=missing, validate=False)
    garbage = torch.where(used, current, NAN)
    a = call(behavior_topk_log_probs=behavior, current_topk_log_probs=garbage, topk_mask=used)
    b = call(behavior_topk_log_probs=behavior, current_topk_log_probs=current, topk_mask=used)
    assert float(a.loss) == float(b.loss)


# ------------------------------------------------------------------------------------------------
# The generic properties of tests/losses/test_losses_inputs.py and test_losses_metrics.py, for Top-K modes
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", TOPK_MODES)
def test_topk_garbage_on_masked_tokens_all_masked_rows_and_metric_names(mode):
    lp, blp, adv, mask, topk = make_batch(seed=6, noise=0.8, B=4, T=12, dtype=torch.float32)
    lp = torch.where(mask, lp, 0.0)
    mask[:, 9:] = False
    mask[1] = False
    reference = compute_policy_loss(mode, lp, blp, adv, mask, **topk.loss_kwargs())
    lp2, blp2 = lp.clone(), blp.clone()
    lp2[:, 9:], blp2[:, 9:], lp2[1] = NAN, math.inf, NAN
    behavior = topk.behavior_topk_log_probs.clone()
    behavior[:, 9:] = NAN
    lp2.requires_grad_(True)
    out = compute_policy_loss(
        mode,
        lp2,
        blp2,
        adv,
        mask,
        behavior_topk_log_probs=behavior,
        current_topk_log_probs=topk.current_topk_log_probs,
        topk_mask=topk.topk_mask,
    )
    out.loss.backward()
    assert float(out.loss.detach()) == pytest.approx(float(reference.loss), rel=1e-6, abs=1e-7)
    assert torch.isfinite(lp2.grad).all() and (lp2.grad[:, 9:] == 0).all() and (lp2.grad[1] == 0).all()
    keep = [0, 2, 3]
    only = compute_policy_loss(
        mode,
        lp[keep],
        blp[keep],
        adv[keep],
        mask[keep],
        **TopKInputs(
            *(x[keep] for x in (topk.behavior_topk_log_probs, topk.current_topk_log_probs, topk.topk_mask))
        ).loss_kwargs(),
    )
    assert float(out.loss.detach()) == pytest.approx(float(only.loss), rel=1e-6, abs=1e-7)
    assert float(out.metrics["empty_responses"]) == 1.0
    assert all(math.isfinite(float(v)) for v in out.metrics.values())
    expected = set(compute_policy_loss("dppo_tv", lp, blp, adv, mask).metrics)
    assert expected <= set(out.metrics)


@pytest.mark.parametrize("mode", TOPK_MODES)
@pytest.mark.parametrize("shape", [(0, 8), (3, 0), (0, 0)])
def test_topk_empty_batch_gives_zero_loss(mode, shape):
    lp = torch.zeros(shape, requires_grad=True)
    topk = torch.zeros(*shape, 2)
    out = compute_policy_loss(
        mode,
        lp,
        torch.zeros(shape),
        torch.zeros(shape[0]),
        torch.zeros(shape, dtype=torch.bool),
        behavior_topk_log_probs=topk,
        current_topk_log_probs=topk,
    )
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0 and float(out.metrics["valid_tokens"]) == 0.0


@pytest.mark.parametrize("mode", TOPK_MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_topk_huge_ratios_stay_finite(mode, dtype):
    B, T = 4, 64
    lp = torch.full((B, T), -0.01, dtype=dtype)
    blp = torch.full((B, T), -0.01, dtype=dtype)
    blp[0] -= 160.0
    lp[1] -= 160.0
    blp[2, 10] = -1e4
    set_behavior = torch.stack([blp, torch.full_like(blp, -5.0)], -1)
    set_current = torch.stack([lp, torch.full_like(lp, -5.0)], -1)
    adv = torch.tensor([1e6, -1e6, -1e6, 1e6], dtype=dtype)
    lp.requires_grad_(True)
    out = compute_policy_loss(
        mode,
        lp,
        blp,
        adv,
        torch.ones(B, T, dtype=torch.bool),
        behavior_topk_log_probs=set_behavior,
        current_topk_log_probs=set_current,
    )
    out.loss.backward()
    assert torch.isfinite(out.loss.detach()) and torch.isfinite(lp.grad).all()
    assert not any(math.isnan(float(v)) for v in out.metrics.values())


def test_synthetic_topk_inputs_for_benchmarks():
    g = torch.Generator().manual_seed(0)
    lp, blp, topk = synthetic_topk_inputs(3, 50, 4, generator=g)
    assert lp.shape == (3, 50) and topk.behavior_topk_log_probs.shape == (3, 50, 5)
    assert topk.topk_mask[..., :4].all() and lp.dtype == torch.float32
    adv = torch.tensor([1.0, -1.0, 0.5])
    for mode in TOPK_MODES:  # passes the full validation (sampled token in the set, masses <= 1)
        out = compute_policy_loss(mode, lp, blp, adv, torch.ones(3, 50, dtype=torch.bool), **topk.loss_kwargs())
        assert torch.isfinite(out.loss)


# ------------------------------------------------------------------------------------------------
# Gradients, flags
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("generator", ["kl", "tv", "chi2"])
def test_bandpo_gradient_matches_finite_differences(generator):
    """BandPO's bounds depend on mu only: the straight-through gradient is the true derivative."""
    lp, blp, adv, mask, _ = make_batch(seed=21, noise=0.8, B=3, T=8)
    lp = torch.where(mask, lp, 0.0)
    leaf = lp.clone().requires_grad_(True)
    compute_policy_loss("bandpo", leaf, blp, adv, mask, generator=generator).loss.backward()
    h = 1e-6
    for b, t in zip(*torch.nonzero(mask, as_tuple=True)):
        plus, minus = lp.clone(), lp.clone()
        plus[b, t] += h
        minus[b, t] -= h
        fd = (
            compute_policy_loss("bandpo", plus, blp, adv, mask, generator=generator).loss
            - compute_policy_loss("bandpo", minus, blp, adv, mask, generator=generator).loss
        ) / (2 * h)
        assert float(leaf.grad[b, t]) == pytest.approx(float(fd), rel=1e-5, abs=1e-9)


def _parse(argv):
    parser = add_policy_loss_arguments(argparse.ArgumentParser())
    return policy_loss_config_from_args(parser.parse_args(argv))


def test_flags_for_the_new_modes():
    assert _parse_value("kl") == "kl" and _parse_value("chi2") == "chi2" and _parse_value("0.05") == 0.05
    assert _parse(["--policy-loss", "bandpo"]) == ("bandpo", {}, "seq-mean-token-mean")
    assert _parse(["--policy-loss", "bandpo", "--bandpo-generator", "tv", "--bandpo-delta", "0.1"]) == (
        "bandpo",
        {"generator": "tv", "delta": 0.1},
        "seq-mean-token-mean",
    )
    assert _parse(["--policy-loss", "cppo", "--cppo-delta", "0.15", "--cppo-weight-min", "1"]) == (
        "cppo",
        {"delta": 0.15, "weight_min": 1},
        "seq-mean-token-mean",
    )
    assert _parse(["--policy-loss", "acpo", "--acpo-eps-max", "0.4", "--acpo-alpha", "0"])[1] == {
        "eps_max": 0.4,
        "alpha": 0,
    }
    assert _parse(["--policy-loss", "dppo_topk_kl", "--dppo-topk-kl-clip-high", "0.1"])[1] == {"clip_high": 0.1}
    with pytest.raises(PolicyLossInputError, match=r"generator='js' must be one of \('kl', 'tv', 'chi2'\)"):
        _parse(["--policy-loss", "bandpo", "--bandpo-generator", "js"])
    with pytest.raises(PolicyLossInputError, match="--dppo-topk-tv-clip-low=0.1 applies to the 'dppo-topk-tv' modes"):
        _parse(["--policy-loss", "dppo_topk_kl", "--dppo-topk-tv-clip-low", "0.1"])
    help_text = add_policy_loss_arguments(argparse.ArgumentParser()).format_help()
    assert "--bandpo-generator" in help_text and "(default kl)" in help_text
    # Every new mode is selectable with its own defaults; the Top-K modes say they need Top-K inputs.
    for mode in NEW_MODES:
        assert _parse(["--policy-loss", mode])[0] == mode
        assert LOSS_MODES[mode].needs_topk == (mode in TOPK_MODES)


def test_topk_inputs_around_given_log_probs():
    """The bench's helper: sets around arbitrary sampled-token log-probs pass the full validation."""
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 30, generator=g) * 5
    blp = (lp + 0.2 * torch.randn(4, 30, generator=g)).clamp(max=0.0)
    topk = topk_inputs_around(lp, blp, 7, generator=g)
    assert topk.behavior_topk_log_probs.shape == (4, 30, 8)
    assert torch.equal(topk.behavior_topk_log_probs[..., -1], blp)
    mass = topk.behavior_topk_log_probs.exp().sum(-1)
    torch.testing.assert_close(mass, blp.exp() + 0.9 * (1 - blp.exp()))
    for mode in TOPK_MODES:
        out = compute_policy_loss(
            mode, lp, blp, torch.randn(4), torch.ones(4, 30, dtype=torch.bool), **topk.loss_kwargs()
        )
        assert torch.isfinite(out.loss)


def test_recorded_topk_gives_the_same_inputs_as_full_logits():
    """What a rollout engine records (top-k ids and log mu, sampled id and log mu) plus the trainer's
    logits gives the same Top-K inputs, and the same loss, as the full behaviour logits."""
    logits, behavior_logits, sampled = _full_batch(seed=8, vocab=9, B=3, T=7, noise=1.0)
    direct = topk_inputs_from_logits(logits, behavior_logits, sampled, 4)
    behavior_lp = torch.log_softmax(behavior_logits, -1)
    recorded = torch.topk(behavior_lp, 4, dim=-1)
    blp = behavior_lp.gather(-1, sampled[..., None]).squeeze(-1)
    ids, behavior, mask = behavior_topk_set(recorded.indices, recorded.values, sampled, blp)
    assert torch.equal(ids, direct.ids) and torch.equal(mask, direct.topk_mask)
    torch.testing.assert_close(behavior, direct.behavior_topk_log_probs)
    current = gather_log_probs(logits, ids, mask)
    lp = gather_log_probs(logits, sampled[..., None]).squeeze(-1)
    adv, valid = torch.tensor([1.0, -1.0, 0.3], dtype=torch.float64), torch.ones(3, 7, dtype=torch.bool)
    a = compute_policy_loss(
        "dppo_topk_kl",
        lp,
        blp,
        adv,
        valid,
        behavior_topk_log_probs=behavior,
        current_topk_log_probs=current,
        topk_mask=mask,
    )
    b = compute_policy_loss("dppo_topk_kl", lp, blp, adv, valid, **direct.loss_kwargs())
    assert float(a.loss) == pytest.approx(float(b.loss), rel=1e-12)


@pytest.mark.parametrize("mode", NEW_MODES)
def test_bfloat16_inputs_are_accepted_and_close_to_float32(mode):
    lp, blp, adv, mask, topk = make_batch(seed=12, noise=0.05, dtype=torch.float32)
    lp = torch.where(mask, lp, 0.0)
    blp16 = blp.to(torch.bfloat16)
    kwargs = topk.loss_kwargs()
    if mode in TOPK_MODES:  # keep the sampled column consistent with the rounded log mu
        kwargs["behavior_topk_log_probs"] = torch.where(
            (kwargs["behavior_topk_log_probs"] - blp[..., None]).abs() < 1e-6,
            blp16.float()[..., None],
            kwargs["behavior_topk_log_probs"],
        )
    out32 = compute_policy_loss(mode, lp, blp16.float(), adv, mask, **kwargs)
    lp16 = lp.to(torch.bfloat16).requires_grad_(True)
    out16 = compute_policy_loss(
        mode,
        lp16,
        blp16,
        adv.to(torch.bfloat16),
        mask,
        **{k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in kwargs.items()},
    )
    out16.loss.backward()
    assert out16.loss.dtype == torch.float32 and torch.isfinite(lp16.grad.float()).all()
    assert float(out16.loss.detach()) == pytest.approx(float(out32.loss), rel=0.05, abs=2e-3)
