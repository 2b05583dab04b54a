"""Bad input: a clear error naming the problem, or a finite, documented result. Never a silent NaN."""

from __future__ import annotations

import math

import pytest
import torch

from epic_slime.losses import LOSS_MODES, PolicyLossInputError, compute_policy_loss

# Top-K modes need extra inputs: tests/losses/test_losses_trust_region.py covers the same properties for them.
ALL_MODES = sorted(mode for mode, spec in LOSS_MODES.items() if not spec.needs_topk)


def _batch(B=3, T=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(B, T, generator=g, dtype=dtype) - 0.1
    blp = lp + 0.05 * torch.randn(B, T, generator=g, dtype=dtype)
    blp = blp.clamp(max=-1e-3)
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=dtype)[:B]
    mask = torch.ones(B, T, dtype=torch.bool)
    return lp, blp, adv, mask


@pytest.mark.parametrize("field", ["log_probs", "behavior_log_probs"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_log_probs_on_valid_tokens_raise(field, bad):
    lp, blp, adv, mask = _batch()
    target = lp if field == "log_probs" else blp
    target[1, 3] = bad
    with pytest.raises(PolicyLossInputError, match=rf"{field} has a non-finite value .* index \(1, 3\)"):
        compute_policy_loss("epic", lp, blp, adv, mask)


def test_non_finite_advantage_raises():
    lp, blp, adv, mask = _batch()
    adv[2] = math.nan
    with pytest.raises(PolicyLossInputError, match="advantages has a non-finite"):
        compute_policy_loss("grpo", lp, blp, adv, mask)


def test_positive_log_prob_raises():
    lp, blp, adv, mask = _batch()
    blp[0, 0] = 0.5
    with pytest.raises(PolicyLossInputError, match=r"behavior_log_probs has a positive .* 0.5"):
        compute_policy_loss("epic", lp, blp, adv, mask)


def test_positive_current_log_prob_raises():
    lp, blp, adv, mask = _batch()
    lp[2, 4] = 0.7
    with pytest.raises(PolicyLossInputError, match=r"log_probs has a positive .* 0\.69999.* index \(2, 4\)"):
        compute_policy_loss("epic", lp, blp, adv, mask)


def test_the_error_names_the_valid_bad_token_not_padding_garbage():
    """The per-token checks run only when the range check failed; they too ignore padding."""
    lp, blp, adv, mask = _batch()
    mask[0, 6:] = False
    lp[0, 7] = 0.7  # padding, earlier in the batch than the bad valid token
    blp[0, 6] = 0.5
    lp[2, 4] = 0.7
    with pytest.raises(PolicyLossInputError, match=r"log_probs has a positive .* index \(2, 4\)"):
        compute_policy_loss("epic", lp, blp, adv, mask)


def test_skip_counts_no_padding_garbage_as_bad():
    lp, blp, adv, mask = _batch()
    mask[:, 5:] = False
    lp[:, 6], blp[:, 7] = 0.7, 0.5
    out = compute_policy_loss("grpo", lp, blp, adv, mask, on_bad_tokens="skip")
    assert int(out.metrics["bad_tokens"]) == 0 and not bool(out.bad.any())


# Each check (non-finite, positive) must look at valid tokens only: NaN / inf and positive values
# (a padded 0.7, which would be "probability > 1" on a valid token) on padding are ignored.
@pytest.mark.parametrize("garbage", [(math.nan, math.inf), (0.7, 0.7), (-math.inf, math.nan)])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_garbage_on_masked_tokens_is_ignored(mode, garbage):
    lp, blp, adv, mask = _batch()
    mask[:, 5:] = False
    reference = compute_policy_loss(mode, lp, blp, adv, mask)
    lp2, blp2 = lp.clone(), blp.clone()
    lp2[:, 5:], blp2[:, 5:] = garbage
    lp2.requires_grad_(True)
    out = compute_policy_loss(mode, lp2, blp2, adv, mask)
    out.loss.backward()
    assert float(out.loss.detach()) == pytest.approx(float(reference.loss), rel=1e-6, abs=1e-7)
    assert torch.isfinite(lp2.grad).all() and (lp2.grad[:, 5:] == 0).all()
    assert all(math.isfinite(float(v)) for v in out.metrics.values()), out.metrics


@pytest.mark.parametrize(
    "shapes,match",
    [
        (((3, 8), (3, 7), (3,), (3, 8)), "behavior_log_probs shape"),
        (((3, 8), (3, 8), (4,), (3, 8)), "advantages shape"),
        (((3, 8), (3, 8), (3,), (3, 9)), "mask shape"),
        (((24,), (24,), (3,), (24,)), r"log_probs must be \[B, T\]"),
    ],
)
def test_shape_mismatches_raise(shapes, match):
    lp_s, blp_s, adv_s, mask_s = shapes
    with pytest.raises(PolicyLossInputError, match=match):
        compute_policy_loss("epic", -torch.rand(lp_s), -torch.rand(blp_s), torch.randn(adv_s), torch.ones(mask_s))


@pytest.mark.parametrize("value", [-1.0, 2.0, 0.5])
def test_masks_outside_zero_one_raise(value):
    lp, blp, adv, _ = _batch()
    mask = torch.ones_like(lp)
    mask[2, 6] = value
    with pytest.raises(PolicyLossInputError, match=rf"mask must be bool or 0/1, got value {value}.*\(2, 6\)"):
        compute_policy_loss("epic", lp, blp, adv, mask)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_all_masked_row_is_excluded(mode):
    lp, blp, adv, mask = _batch()
    mask[1] = False
    out = compute_policy_loss(mode, lp, blp, adv, mask)
    only = compute_policy_loss(mode, lp[[0, 2]], blp[[0, 2]], adv[[0, 2]], mask[[0, 2]])
    assert float(out.loss) == pytest.approx(float(only.loss), rel=1e-6, abs=1e-7)
    assert float(out.metrics["empty_responses"]) == 1.0


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("shape", [(0, 8), (3, 0), (0, 0)])
def test_empty_batch_gives_zero_loss(mode, shape):
    lp = torch.zeros(shape, requires_grad=True)
    out = compute_policy_loss(mode, lp, torch.zeros(shape), torch.zeros(shape[0]), torch.zeros(shape, dtype=torch.bool))
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0
    assert all(math.isfinite(float(v)) for v in out.metrics.values())
    assert float(out.metrics["valid_tokens"]) == 0.0


def test_fully_masked_batch_gives_zero_loss_and_zero_gradient():
    lp, blp, adv, mask = _batch()
    lp.requires_grad_(True)
    out = compute_policy_loss("epic", lp, blp, adv, torch.zeros_like(mask))
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0 and float(lp.grad.abs().sum()) == 0.0


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_huge_prefix_log_ratios_stay_finite(mode, dtype):
    """|L_t| up to 1e4 (a sample from a very different policy) and advantages of 1e6."""
    B, T = 4, 64
    lp = torch.full((B, T), -0.01, dtype=dtype)
    blp = torch.full((B, T), -0.01, dtype=dtype)
    blp[0] -= 160.0  # L_t grows to +1e4 over the row: pi >> mu
    lp[1] -= 160.0  # L_t falls to -1e4: pi << mu
    blp[2, 10] = -1e4  # one token with lam = +1e4
    adv = torch.tensor([1e6, -1e6, -1e6, 1e6], dtype=dtype)
    mask = torch.ones(B, T, dtype=torch.bool)
    lp.requires_grad_(True)
    out = compute_policy_loss(mode, lp, blp, adv, mask)
    out.loss.backward()
    assert torch.isfinite(out.loss.detach()), (mode, out.loss)
    assert torch.isfinite(lp.grad).all(), mode
    for name, value in out.metrics.items():
        if name not in ("ratio_max", "ratio_mean", "ratio_p95"):  # e^{1e4} is +inf, honestly
            assert math.isfinite(float(value)), (mode, name, value)
        assert not math.isnan(float(value)), (mode, name)


def test_epic_clips_huge_prefix_ratios():
    B, T = 2, 64
    lp = torch.full((B, T), -0.01, dtype=torch.float64)
    blp = lp.clone()
    blp[0] -= 160.0
    lp[1] -= 160.0
    out = compute_policy_loss(
        "epic", lp, blp, torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(B, T, dtype=torch.bool)
    )
    assert bool(out.clipped.all())


def test_unbounded_ratio_overflow_is_counted():
    """GRPO with A < 0 has no upper clip: a ratio beyond the dtype's range is capped and counted."""
    lp = torch.full((1, 4), -0.01)
    blp = lp.clone()
    blp[0, 1] = -500.0
    out = compute_policy_loss("grpo", lp, blp, torch.tensor([-1.0]), torch.ones(1, 4, dtype=torch.bool))
    assert torch.isfinite(out.loss)
    assert float(out.metrics["value_capped_frac"]) == pytest.approx(0.25)


def test_unknown_mode_and_parameters_raise():
    lp, blp, adv, mask = _batch()
    with pytest.raises(PolicyLossInputError, match="mode='ppo2' is not a registered loss mode"):
        compute_policy_loss("ppo2", lp, blp, adv, mask)
    with pytest.raises(PolicyLossInputError, match=r"has no parameter\(s\) \['clip_low'\]"):
        compute_policy_loss("epic", lp, blp, adv, mask, clip_low=0.2)
    with pytest.raises(PolicyLossInputError, match="delta_high=0 must be a finite number > 0"):
        compute_policy_loss("epic", lp, blp, adv, mask, delta_high=0)
    with pytest.raises(PolicyLossInputError, match="dual_clip=0.5 must be a finite number > 1"):
        compute_policy_loss("grpo", lp, blp, adv, mask, dual_clip=0.5)
    with pytest.raises(PolicyLossInputError, match="aggregation='mean'"):
        compute_policy_loss("grpo", lp, blp, adv, mask, aggregation="mean")


def test_non_tensor_inputs_raise():
    lp, blp, adv, mask = _batch()
    with pytest.raises(PolicyLossInputError, match="advantages must be a torch.Tensor, got list"):
        compute_policy_loss("epic", lp, blp, [1.0, 2.0, 3.0], mask)


# ---- on_bad_tokens="skip": mask, count, abort only past max_bad_token_frac ----


def _with_bad_tokens():
    lp, blp, adv, mask = _batch(B=3, T=40)
    bad = torch.zeros_like(mask)
    lp[0, 5] = math.nan
    bad[0, 5] = True  # non-finite current log-prob
    blp[1, 7] = 0.5
    bad[1, 7] = True  # "probability > 1" behaviour log-prob
    lp[2, 39] = math.inf
    bad[2, 39] = True
    return lp, blp, adv, mask, bad


@pytest.mark.parametrize("mode", ALL_MODES)
def test_skip_masks_bad_tokens_like_a_smaller_mask(mode):
    lp, blp, adv, mask, bad = _with_bad_tokens()
    live = lp.clone().requires_grad_(True)
    out = compute_policy_loss(mode, live, blp, adv, mask, on_bad_tokens="skip", max_bad_token_frac=0.05)
    out.loss.backward()
    # reference: the same call in raise mode with the bad tokens simply not on the mask
    clean_lp = torch.where(bad, -1.0, lp).requires_grad_(True)
    ref = compute_policy_loss(mode, clean_lp, torch.where(bad, -1.0, blp), adv, mask & ~bad)
    ref.loss.backward()
    assert torch.isfinite(out.loss) and float(out.loss.detach()) == pytest.approx(
        float(ref.loss.detach()), rel=1e-6, abs=1e-7
    )
    assert torch.isfinite(live.grad).all() and (live.grad[bad] == 0).all()
    assert torch.allclose(live.grad, clean_lp.grad, rtol=1e-5, atol=1e-7)
    assert int(out.metrics["bad_tokens"]) == 3 and torch.equal(out.bad, bad)
    assert int(out.metrics["valid_tokens"]) == int(mask.sum()) - 3


def test_skip_aborts_past_the_bad_token_fraction():
    lp, blp, adv, mask, _ = _with_bad_tokens()  # 3 bad of 120 = 2.5%
    with pytest.raises(PolicyLossInputError, match=r"3 of 120 valid tokens \(2.50%\) .* max_bad_token_frac=0.01"):
        compute_policy_loss("epic", lp, blp, adv, mask, on_bad_tokens="skip", max_bad_token_frac=0.01)
    assert (
        int(
            compute_policy_loss("epic", lp, blp, adv, mask, on_bad_tokens="skip", max_bad_token_frac=0.025).metrics[
                "bad_tokens"
            ]
        )
        == 3
    )


def test_raise_stays_the_default_and_bad_settings_are_errors():
    lp, blp, adv, mask, _ = _with_bad_tokens()
    with pytest.raises(PolicyLossInputError, match="log_probs has a non-finite value"):
        compute_policy_loss("epic", lp, blp, adv, mask)
    with pytest.raises(PolicyLossInputError, match="on_bad_tokens='ignore'"):
        compute_policy_loss("epic", lp, blp, adv, mask, on_bad_tokens="ignore")
    with pytest.raises(PolicyLossInputError, match="max_bad_token_frac=2"):
        compute_policy_loss("epic", lp, blp, adv, mask, on_bad_tokens="skip", max_bad_token_frac=2)
    clean = _batch()
    assert int(compute_policy_loss("epic", *clean).metrics["bad_tokens"]) == 0
