"""The loss modes: one small pure function each, registered by name.

Each reads a validated `LossBatch` (detached [B, T] tensors) and returns `TokenTerms`: the
per-token objective value S_t (maximised) and its coefficient dS_t / dlog pi_t. The math is
``docs/losses.md`` (the project's account, written from ../shared/docs/losses.md); parameter defaults are the papers'.
"""

from __future__ import annotations

import math

import torch

from .bounds import exact_kl_lower_root, exact_kl_upper_root
from .core import (
    TokenTerms,
    greater_than_one,
    in_unit_interval,
    nonnegative,
    optional,
    positive,
    register_loss,
    reinforce_terms,
    sign_aware_clip,
)
from .inputs import LossBatch

_EPIC_CHECKS = {"delta_low": positive, "delta_high": positive}
_PPO_CHECKS = {"clip_low": in_unit_interval, "clip_high": positive, "dual_clip": optional(greater_than_one)}


def _to(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.to(like.dtype)


# ------------------------------------------------------------------------------------------
# EPIC and its ablations
# ------------------------------------------------------------------------------------------


def _epic(batch: LossBatch, delta_low: float, delta_high: float, *, geometric: bool, per_token: bool) -> TokenTerms:
    inv_t = batch.inv_token_count
    # Budgets in log space: log c-+_t = log t + log delta-+ - M_t / t   (raw-prob ablation: - M_t).
    behavior = batch.log_behavior_prefix * inv_t if geometric else batch.log_behavior_prefix
    base = torch.log(batch.token_count).sub_(behavior)
    lower = exact_kl_lower_root(base + math.log(delta_low))
    upper = exact_kl_upper_root(base.add_(math.log(delta_high)))
    x = batch.log_prefix_ratio
    if per_token:  # bounds on the log geometric prefix ratio z_t = L_t / t
        x, lower, upper = x * inv_t, lower.mul_(inv_t), upper.mul_(inv_t)
    return sign_aware_clip(x, batch.advantages, upper_pos=upper, lower_neg=lower, upper_neg=upper)


@register_loss("epic", checks=_EPIC_CHECKS)
def epic(batch: LossBatch, *, delta_low: float = 5e-4, delta_high: float = 2e-3) -> TokenTerms:
    """EPIC: z_t = L_t / t clipped to exact-KL bounds y-+(c-+_t) / t, c = t delta / mu_geo(o_1:t)."""
    return _epic(batch, delta_low, delta_high, geometric=True, per_token=True)


@register_loss("epic_raw_prob", checks=_EPIC_CHECKS, flag_prefix="epic")
def epic_raw_prob(batch: LossBatch, *, delta_low: float = 5e-4, delta_high: float = 2e-3) -> TokenTerms:
    """EPIC ablation: budget from the full prefix probability, log c = log t + log delta - M_t."""
    return _epic(batch, delta_low, delta_high, geometric=False, per_token=True)


@register_loss("epic_cumulative", checks=_EPIC_CHECKS, flag_prefix="epic")
def epic_cumulative(batch: LossBatch, *, delta_low: float = 5e-4, delta_high: float = 2e-3) -> TokenTerms:
    """EPIC ablation: geometric budgets, but L_t itself clipped to [y-(c-_t), y+(c+_t)]."""
    return _epic(batch, delta_low, delta_high, geometric=True, per_token=False)


# ------------------------------------------------------------------------------------------
# Token-ratio PPO family
# ------------------------------------------------------------------------------------------


def _ppo(log_value: torch.Tensor, advantages: torch.Tensor, log_low, log_high, dual_clip) -> TokenTerms:
    """S = min(q A, clip(q, e^lo, e^hi) A), optionally dual-clipped at c A for A < 0."""
    upper_neg = math.inf if dual_clip is None else math.log(dual_clip)
    return sign_aware_clip(log_value, advantages, upper_pos=log_high, lower_neg=log_low, upper_neg=upper_neg)


@register_loss("grpo", checks=_PPO_CHECKS)
def grpo(
    batch: LossBatch, *, clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None
) -> TokenTerms:
    """GRPO/PPO: token ratio r_t = pi_t / mu_t clipped to [1 - eps_lo, 1 + eps_hi]."""
    return _ppo(batch.log_ratio, batch.advantages, math.log1p(-clip_low), math.log1p(clip_high), dual_clip)


@register_loss("dapo", checks=_PPO_CHECKS, aggregation="token-mean")
def dapo(
    batch: LossBatch, *, clip_low: float = 0.2, clip_high: float = 0.28, dual_clip: float | None = None
) -> TokenTerms:
    """DAPO: GRPO with clip-higher (0.2 / 0.28) and token-mean aggregation."""
    return _ppo(batch.log_ratio, batch.advantages, math.log1p(-clip_low), math.log1p(clip_high), dual_clip)


@register_loss("gspo", checks={"clip_low": in_unit_interval, "clip_high": positive})
def gspo(batch: LossBatch, *, clip_low: float = 3e-4, clip_high: float = 4e-4) -> TokenTerms:
    """GSPO-token: sequence ratio exp(mean_t lam_t) for every token (straight-through), PPO clip."""
    length = batch.response_length.clamp(min=1.0).unsqueeze(-1)
    mean_log_ratio = batch.log_ratio.sum(dim=-1, keepdim=True, dtype=torch.float64) / length
    log_value = _to(mean_log_ratio, batch.log_probs).expand_as(batch.log_probs)  # same for a whole row
    return _ppo(log_value, batch.advantages, math.log1p(-clip_low), math.log1p(clip_high), None)


@register_loss("ctpo", checks={"clip_low": positive, "clip_high": positive, "power": nonnegative, "clip_cap": positive})
def ctpo(
    batch: LossBatch, *, clip_low: float = 0.025, clip_high: float = 0.05, power: float = 0.5, clip_cap: float = 0.05
) -> TokenTerms:
    """CTPO: cumulative prefix ratio L_t in [-eps_lo t^p, eps_hi t^p]; A < 0 capped at exp(eps_c t^p)."""
    scale = batch.token_count.pow(power)
    return sign_aware_clip(
        batch.log_prefix_ratio,
        batch.advantages,
        upper_pos=clip_high * scale,
        lower_neg=-clip_low * scale,
        upper_neg=clip_cap * scale,
    )


@register_loss(
    "ripo",
    checks={
        "delta_low": positive,
        "delta_high": positive,
        "ratio_floor": in_unit_interval,
        "ratio_cap": greater_than_one,
        "dual_clip": optional(greater_than_one),
    },
    aggregation="token-mean",
)
def ripo(
    batch: LossBatch,
    *,
    delta_low: float = 0.05,
    delta_high: float = 0.05,
    ratio_floor: float = 0.5,
    ratio_cap: float = 10.0,
    dual_clip: float | None = None,
) -> TokenTerms:
    """RIPO: token ratio in [max(1 - sqrt(d/mu_t), floor), min(1 + sqrt(d/mu_t), cap)]."""
    inv_sqrt_mu = torch.exp(-0.5 * batch.behavior_log_probs)  # 1 / sqrt(mu_t), no division by a tiny mu
    low = torch.clamp(1.0 - math.sqrt(delta_low) * inv_sqrt_mu, min=ratio_floor)
    high = torch.clamp(1.0 + math.sqrt(delta_high) * inv_sqrt_mu, max=ratio_cap)
    return _ppo(batch.log_ratio, batch.advantages, torch.log(low), torch.log(high), dual_clip)


# ------------------------------------------------------------------------------------------
# Masking / weighting modes (REINFORCE form: S_t = sg(w_t) log pi_t)
# ------------------------------------------------------------------------------------------


def dppo_terms(
    batch: LossBatch,
    move_too_far_up,
    move_too_far_down,
    ratio_cap: float,
    log_lower: torch.Tensor,
    log_upper: torch.Tensor,
) -> TokenTerms:
    """Mask a token whose move is too far in its advantage's direction; -A sg(min(r, C)) log pi on the rest."""
    positive_adv = batch.advantages > 0
    clipped_upper = positive_adv & move_too_far_up
    clipped_lower = ~positive_adv & move_too_far_down
    keep = ~(clipped_upper | clipped_lower)
    ratio = torch.exp(torch.clamp(batch.log_ratio, max=math.log(ratio_cap)))
    value, coef = reinforce_terms(batch.advantages * ratio, batch.log_probs, keep)
    return TokenTerms(
        value=value,
        coef=coef,
        clipped_upper=clipped_upper,
        clipped_lower=clipped_lower,
        log_lower=log_lower,
        log_upper=log_upper,
        log_value=batch.log_ratio,
    )


@register_loss("dppo_tv", checks={"clip_low": positive, "clip_high": positive, "ratio_cap": greater_than_one})
def dppo_tv(batch: LossBatch, *, clip_low: float = 0.15, clip_high: float = 0.15, ratio_cap: float = 1e4) -> TokenTerms:
    """DPPO-TV: A > 0 masked iff pi_t - mu_t > eps_hi; A <= 0 masked iff pi_t - mu_t < -eps_lo."""
    pi = torch.exp(batch.log_probs)
    mu = torch.exp(batch.behavior_log_probs)
    diff = pi - mu
    # The same rule as a ratio band: r > 1 + eps/mu_t, r < 1 - eps/mu_t (no lower bound if <= 0).
    log_upper = torch.log1p(clip_high / mu)
    log_lower = torch.log(torch.clamp(1.0 - clip_low / mu, min=0.0))
    return dppo_terms(batch, diff > clip_high, diff < -clip_low, ratio_cap, log_lower, log_upper)


@register_loss("dppo_kl", checks={"clip_low": positive, "clip_high": positive, "ratio_cap": greater_than_one})
def dppo_kl(batch: LossBatch, *, clip_low: float = 0.05, clip_high: float = 0.05, ratio_cap: float = 1e4) -> TokenTerms:
    """DPPO-KL: masked iff KL(Bern(mu_t) || Bern(pi_t)) > eps and pi_t moved in A's direction."""
    pi = torch.exp(batch.log_probs)
    mu = torch.exp(batch.behavior_log_probs)
    # 1 - p and log(1 - p) from log p without cancellation; (1 - mu) log(.) is 0 when mu = 1.
    not_mu = -torch.expm1(batch.behavior_log_probs)
    log_ratio_not = torch.log(not_mu) - torch.log(-torch.expm1(batch.log_probs))
    kl = mu * (batch.behavior_log_probs - batch.log_probs) + torch.where(not_mu > 0, not_mu * log_ratio_not, 0.0)
    inf = torch.full_like(pi, math.inf)
    return dppo_terms(batch, (kl > clip_high) & (pi > mu), (kl > clip_low) & (pi < mu), ratio_cap, -inf, inf)


@register_loss("cispo", checks={"clip_low": optional(in_unit_interval), "clip_high": positive})
def cispo(batch: LossBatch, *, clip_low: float | None = None, clip_high: float = 0.28) -> TokenTerms:
    """CISPO: -sg(clip(r, 1 - eps_lo, 1 + eps_hi)) A log pi_t; truncates the weight, never the gradient."""
    log_low = -math.inf if clip_low is None else math.log1p(-clip_low)
    log_high = math.log1p(clip_high)
    log_ratio = batch.log_ratio
    weight = torch.exp(torch.clamp(log_ratio, min=log_low, max=log_high))
    value, coef = reinforce_terms(batch.advantages * weight, batch.log_probs, torch.ones_like(batch.valid))
    like = batch.log_probs
    return TokenTerms(
        value=value,
        coef=coef,
        clipped_upper=log_ratio > log_high,
        clipped_lower=log_ratio < log_low,
        log_lower=torch.full_like(like, log_low),
        log_upper=torch.full_like(like, log_high),
        log_value=log_ratio,
    )
