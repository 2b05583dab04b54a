"""The stress ladder's mechanism metrics against a float64 reference written from their definitions:
|L_t| at 50% / 90% of each response, and the share of the gradient weight the bound removed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from epic_slime.losses import LOSS_MODES, compute_policy_loss


def _batch(seed=0, rows=6, cols=17):
    g = torch.Generator().manual_seed(seed)
    blp = -(torch.rand(rows, cols, generator=g, dtype=torch.float64) * 3 + 0.01)
    lp = (blp + 0.4 * torch.randn(rows, cols, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(rows, 1, generator=g, dtype=torch.float64).expand(rows, cols).clone()
    mask = torch.ones(rows, cols, dtype=torch.bool)
    mask[1, 9:] = False  # a shorter response
    mask[2, :] = False  # an empty one (takes no part)
    mask[3, 0] = False  # a hole before the first valid token
    mask[4, 5] = False  # a hole inside
    mask[5, 1:] = False  # one token
    adv = adv * mask
    return lp, blp, adv, mask


def _reference_prefix(lp, blp, mask, percent):
    lam = np.where(mask, (lp - blp).numpy(), 0.0)
    values = []
    for row, keep in zip(lam, mask.numpy()):
        idx = np.flatnonzero(keep)
        if idx.size == 0:
            continue
        k = max(math.ceil(percent / 100 * idx.size), 1)  # the k-th valid token
        values.append(abs(np.cumsum(row)[idx[k - 1]]))
    return float(np.mean(values))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prefix_log_ratio_at_positions_matches_reference(seed):
    lp, blp, adv, mask = _batch(seed)
    out = compute_policy_loss("epic", lp, blp, adv, mask)
    for p in (50, 90):
        assert float(out.metrics[f"abs_L_p{p}_position"]) == pytest.approx(
            _reference_prefix(lp, blp, mask, p), rel=1e-12
        )


def test_prefix_at_positions_grows_with_a_constant_drift():
    # log r = 0.1 on every token of a 40-token response: |L| = 0.1 * 20 at 50%, 0.1 * 36 at 90%
    blp = torch.full((1, 40), -1.0, dtype=torch.float64)
    lp = blp + 0.1
    out = compute_policy_loss(
        "grpo", lp, blp, torch.ones(1, 40, dtype=torch.float64), torch.ones(1, 40, dtype=torch.bool)
    )
    assert float(out.metrics["abs_L_p50_position"]) == pytest.approx(2.0)
    assert float(out.metrics["abs_L_p90_position"]) == pytest.approx(3.6)


def _reference_removed(mode, lp, blp, adv, mask):
    """Unbounded weight |A| e^X for the mode's X; what it kept is its coefficient (recomputed here
    from the mode's rule in float64 for GRPO and CISPO)."""
    m = mask.numpy()
    r = np.exp((lp - blp).numpy())
    a = adv.numpy()
    if mode == "grpo":  # clip to [0.8, 1.2] by the sign of A: the gradient is gone outside
        clipped = np.where(a >= 0, r >= 1.2, r <= 0.8)
        kept = np.where(clipped, 0.0, np.abs(a) * r)
    else:  # cispo: the weight is truncated at 1.28, the gradient kept
        kept = np.abs(a) * np.minimum(r, 1.28)
    unbounded = np.abs(a) * r
    return float(np.maximum(unbounded - kept, 0)[m].sum() / unbounded[m].sum())


@pytest.mark.parametrize("mode", ["grpo", "cispo"])
@pytest.mark.parametrize("seed", [0, 3])
def test_grad_removed_share_matches_reference(mode, seed):
    lp, blp, adv, mask = _batch(seed)
    out = compute_policy_loss(mode, lp, blp, adv, mask)
    expected = _reference_removed(mode, lp, blp, adv, mask)
    assert 0 < expected < 1
    assert float(out.metrics["grad_removed_frac"]) == pytest.approx(expected, rel=1e-9)


def test_grad_removed_share_is_zero_on_policy_and_one_when_everything_is_clipped():
    lp, blp, adv, mask = _batch(4)
    on_policy = compute_policy_loss("epic", blp, blp, adv, mask)
    assert float(on_policy.metrics["grad_removed_frac"]) == 0.0
    far = compute_policy_loss(
        "grpo", torch.full_like(blp, -1.0), torch.full_like(blp, -3.0), adv.abs() + mask, mask
    )  # r = e^2 > 1.2 with A > 0 on every valid token
    assert float(far.metrics["grad_removed_frac"]) == pytest.approx(1.0)


@pytest.mark.parametrize("mode", sorted(m for m, spec in LOSS_MODES.items() if not spec.needs_topk))
def test_every_mode_reports_the_stress_metrics_in_range(mode):
    lp, blp, adv, mask = _batch(5)
    out = compute_policy_loss(mode, lp, blp, adv, mask)
    assert 0.0 <= float(out.metrics["grad_removed_frac"]) <= 1.0
    assert float(out.metrics["abs_L_p90_position"]) >= 0.0
