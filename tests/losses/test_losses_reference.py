"""Every loss mode against the independent float64 reference: values and gradients."""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from support.loss_reference import loss_and_grad
from epic_slime.losses import LOSS_MODES, compute_policy_loss

MODES = [
    "epic",
    "epic_raw_prob",
    "epic_cumulative",
    "grpo",
    "dapo",
    "gspo",
    "ctpo",
    "ripo",
    "dppo_tv",
    "dppo_kl",
    "cispo",
]


def make_batch(seed: int, noise: float, B: int = 6, T: int = 24, dtype=torch.float64, zero_adv_rows=True):
    """Variable-length responses, log-probs in (-4, 0), behaviour = current + noise (kept <= 0)."""
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4.0 - 1e-3
    blp = (lp + noise * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-4)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    if zero_adv_rows:
        adv[-1] = 0.0
    # Padding carries garbage that must not matter.
    lp = torch.where(mask, lp, torch.tensor(float("nan"), dtype=torch.float64))
    return lp.to(dtype), blp.to(dtype), adv.to(dtype), mask


def _check(mode, lp, blp, adv, mask, params, aggregation=None, rtol=1e-10, atol=1e-12):
    aggregation = aggregation or LOSS_MODES[mode].aggregation
    lp_leaf = lp.clone().requires_grad_(True)
    out = compute_policy_loss(mode, lp_leaf, blp, adv, mask, aggregation=aggregation, **params)
    out.loss.backward()
    full = {**LOSS_MODES[mode].defaults, **params}
    B, T = lp.shape
    adv_bt = adv[:, None].expand(B, T) if adv.dim() == 1 else adv
    as_list = lambda x: x.double().tolist()  # noqa: E731
    ref_loss, ref_grad = loss_and_grad(
        mode, as_list(lp), as_list(blp), as_list(adv_bt), mask.tolist(), full, aggregation
    )
    assert math.isfinite(float(out.loss.detach()))
    assert float(out.loss.detach()) == pytest.approx(ref_loss, rel=rtol, abs=atol), (mode, aggregation)
    got = lp_leaf.grad.double()
    want = torch.tensor(ref_grad, dtype=torch.float64)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("noise", [1e-3, 3e-2, 0.4])
def test_mode_matches_reference_float64(mode, noise):
    # crc32, not hash(): str hashes change per process, so a failure would not reproduce
    lp, blp, adv, mask = make_batch(seed=zlib.crc32(f"{mode}/{noise}".encode()) % 1000, noise=noise)
    _check(mode, lp, blp, adv, mask, {})


@pytest.mark.parametrize("mode", MODES)
def test_mode_matches_reference_float32(mode):
    lp, blp, adv, mask = make_batch(seed=7, noise=0.05, dtype=torch.float32)
    _check(mode, lp, blp, adv, mask, {}, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("mode", ["epic", "grpo", "ctpo"])
def test_every_aggregation(mode, aggregation):
    lp, blp, adv, mask = make_batch(seed=11, noise=0.05)
    _check(mode, lp, blp, adv, mask, {}, aggregation=aggregation)


@pytest.mark.parametrize(
    "mode,params",
    [
        ("epic", {"delta_low": 1e-2, "delta_high": 3e-2}),
        ("grpo", {"dual_clip": 3.0}),
        ("dapo", {"dual_clip": 2.0, "clip_high": 0.5}),
        ("ripo", {"dual_clip": 3.0, "delta_low": 0.2}),
        ("ctpo", {"power": 1.0, "clip_cap": 0.02}),
        ("cispo", {"clip_low": 0.1}),
        ("dppo_tv", {"ratio_cap": 1.5}),
        # asymmetric thresholds: a swap of clip_low and clip_high must show
        ("grpo", {"clip_low": 0.1, "clip_high": 0.4}),
        ("grpo", {"clip_low": 0.4, "clip_high": 0.1}),
        ("gspo", {"clip_low": 0.05, "clip_high": 0.2}),
        ("ctpo", {"clip_low": 0.01, "clip_high": 0.08, "clip_cap": 0.03}),
        ("cispo", {"clip_low": 0.3, "clip_high": 0.1}),
        ("dppo_tv", {"clip_low": 0.02, "clip_high": 0.3}),
        ("dppo_tv", {"clip_low": 0.3, "clip_high": 0.02}),
        ("dppo_kl", {"clip_low": 0.005, "clip_high": 0.2}),
        ("dppo_kl", {"clip_low": 0.2, "clip_high": 0.005}),
    ],
)
def test_non_default_parameters(mode, params):
    lp, blp, adv, mask = make_batch(seed=3, noise=0.5)
    _check(mode, lp, blp, adv, mask, params)


def test_advantage_per_token_tensor():
    lp, blp, adv, mask = make_batch(seed=5, noise=0.1)
    adv_bt = adv[:, None] * torch.linspace(-1, 1, lp.shape[1], dtype=torch.float64)[None, :]
    _check("epic", lp, blp, adv_bt, mask, {})
    _check("grpo", lp, blp, adv_bt, mask, {})


def test_epic_boundary_cases_are_all_exercised():
    """The reference agreement above only means something if every branch of EPIC's operator
    occurs: A > 0 below the cap and clipped, A < 0 below / inside / above the band, A = 0."""
    B, T = 8, 40
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.05
    # Rows drift up or down at different rates so that z_t crosses the bounds at some t.
    drift = torch.tensor([0.0, 2e-3, -2e-3, 1e-2, -1e-2, 0.2, -0.2, 0.05], dtype=torch.float64)
    blp = (lp - drift[:, None] + 1e-3 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-4)
    mask = torch.ones(B, T, dtype=torch.bool)
    adv = torch.tensor([1.0, 1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 0.0], dtype=torch.float64)
    adv_bt = adv[:, None].repeat(1, T)
    adv_bt[1::2, ::3] *= -1  # both signs inside drifting rows
    adv_bt[7] = 0.0
    out = _check("epic", lp, blp, adv_bt, mask, {})
    from epic_slime.losses.inputs import prepare_batch
    from epic_slime.losses.modes import epic

    terms = epic(prepare_batch(lp, blp, adv_bt, mask))
    pos, neg = adv_bt > 0, adv_bt < 0
    inside = ~(terms.clipped_upper | terms.clipped_lower)
    assert (pos & terms.clipped_upper).any() and (pos & inside).any()
    assert (neg & terms.clipped_upper).any() and (neg & terms.clipped_lower).any() and (neg & inside).any()
    # The lower bound never blocks a positive-advantage token.
    assert not (pos & terms.clipped_lower).any()
    assert float(out.metrics["clipfrac"]) > 0


@pytest.mark.parametrize("mode", ["grpo", "dapo", "ripo"])
def test_token_ratio_gradients_match_finite_differences(mode):
    """For the token-ratio modes the straight-through gradient is the true derivative of the loss
    (dr/dlog pi = r): check autograd against central differences of the core's own forward."""
    lp, blp, adv, mask = make_batch(seed=21, noise=0.3, B=3, T=10)
    lp = torch.where(mask, lp, 0.0)
    lp_leaf = lp.clone().requires_grad_(True)
    compute_policy_loss(mode, lp_leaf, blp, adv, mask).loss.backward()
    h = 1e-6
    checked = 0
    for b in range(lp.shape[0]):
        for t in range(int(mask[b].sum())):
            plus, minus = lp.clone(), lp.clone()
            plus[b, t] += h
            minus[b, t] -= h
            fd = (
                compute_policy_loss(mode, plus, blp, adv, mask).loss
                - compute_policy_loss(mode, minus, blp, adv, mask).loss
            ) / (2 * h)
            assert float(lp_leaf.grad[b, t]) == pytest.approx(float(fd), rel=1e-5, abs=1e-9)
            checked += 1
    assert checked >= 10


def test_zero_advantage_gives_zero_loss_and_gradient():
    lp, blp, _, mask = make_batch(seed=2, noise=0.3)
    adv = torch.zeros(lp.shape[0], dtype=torch.float64)
    for mode in MODES:
        lp_leaf = lp.clone().requires_grad_(True)
        out = compute_policy_loss(mode, lp_leaf, blp, adv, mask)
        out.loss.backward()
        assert float(out.loss.detach()) == 0.0
        assert float(lp_leaf.grad.abs().max()) == 0.0


def test_bfloat16_inputs_are_accepted_and_close_to_float32():
    lp, blp, adv, mask = make_batch(seed=9, noise=0.05, dtype=torch.float32)
    lp = torch.where(mask, lp, 0.0)
    out32 = compute_policy_loss("epic", lp, blp, adv, mask)
    lp16 = lp.to(torch.bfloat16).requires_grad_(True)
    out16 = compute_policy_loss("epic", lp16, blp.to(torch.bfloat16), adv.to(torch.bfloat16), mask)
    out16.loss.backward()
    assert out16.loss.dtype == torch.float32
    assert lp16.grad.dtype == torch.bfloat16 and torch.isfinite(lp16.grad.float()).all()
    assert float(out16.loss.detach()) == pytest.approx(float(out32.loss), rel=0.05, abs=1e-3)


# The paper defaults of every mode and its default aggregation (docs/losses.md, checked by tests/project/test_docs.py).
PAPER_DEFAULTS = {
    "epic": ({"delta_low": 5e-4, "delta_high": 2e-3}, "seq-mean-token-mean"),
    "epic_raw_prob": ({"delta_low": 5e-4, "delta_high": 2e-3}, "seq-mean-token-mean"),
    "epic_cumulative": ({"delta_low": 5e-4, "delta_high": 2e-3}, "seq-mean-token-mean"),
    "grpo": ({"clip_low": 0.2, "clip_high": 0.2, "dual_clip": None}, "seq-mean-token-mean"),
    "dapo": ({"clip_low": 0.2, "clip_high": 0.28, "dual_clip": None}, "token-mean"),
    "gspo": ({"clip_low": 3e-4, "clip_high": 4e-4}, "seq-mean-token-mean"),
    "ctpo": ({"clip_low": 0.025, "clip_high": 0.05, "power": 0.5, "clip_cap": 0.05}, "seq-mean-token-mean"),
    "ripo": ({"delta_low": 0.05, "delta_high": 0.05, "dual_clip": None}, "token-mean"),
    "dppo_tv": ({"clip_low": 0.15, "clip_high": 0.15, "ratio_cap": 1e4}, "seq-mean-token-mean"),
    "dppo_kl": ({"clip_low": 0.05, "clip_high": 0.05, "ratio_cap": 1e4}, "seq-mean-token-mean"),
    "cispo": ({"clip_low": None, "clip_high": 0.28}, "seq-mean-token-mean"),
    "cppo": ({"delta": 0.2, "weight_min": 0.8, "budget_delta": 0.02}, "seq-mean-token-mean"),
    "bandpo": ({"delta": 0.05, "generator": "kl", "ratio_cap": 10}, "seq-mean-token-mean"),
    "acpo": ({"eps_base": 0.2, "alpha": 1, "eps_min": 0.05, "eps_max": 0.5}, "seq-mean-token-mean"),
    "dppo_topk_tv": ({"clip_low": 0.15, "clip_high": 0.15, "ratio_cap": 1e4}, "seq-mean-token-mean"),
    "dppo_topk_kl": ({"clip_low": 0.05, "clip_high": 0.05, "ratio_cap": 1e4}, "seq-mean-token-mean"),
}


@pytest.mark.parametrize("mode", sorted(PAPER_DEFAULTS))
def test_paper_defaults_and_default_aggregation_are_pinned(mode):
    defaults, aggregation = PAPER_DEFAULTS[mode]
    spec = LOSS_MODES[mode]
    # only the parameters the papers fix are pinned; extra safety knobs (e.g. ripo's floor) may exist
    assert {k: spec.defaults[k] for k in defaults} == defaults
    assert spec.aggregation == aggregation
    out = compute_policy_loss(mode, *make_batch(seed=1, noise=0.01)) if not spec.needs_topk else None
    if out is not None:
        assert out.aggregation == aggregation and out.params == dict(spec.defaults)


def test_every_registered_mode_is_pinned():
    assert set(PAPER_DEFAULTS) == set(LOSS_MODES)
