"""The seeds' other trust-region rules: CPPO, BandPO, ACPO and DPPO Top-K, as registered modes.

Same contract as ``modes.py``: pure functions of a validated `LossBatch` returning detached
`TokenTerms`. Math: shared docs/losses.md, "The seeds' other trust-region methods". Notation:
p_t = pi(o_t), q_t = mu(o_t) (probabilities of the sampled token), r_t = p_t / q_t.
Per-token statistics that decide a mask or a bound are computed in float64 (they are compared
against thresholds; float32 rounding would flip borderline tokens between runs and dtypes).
"""

from __future__ import annotations

import math

import torch

from .core import (
    PolicyLossInputError,
    TokenTerms,
    greater_than_one,
    in_unit_interval,
    nonnegative,
    one_of,
    positive,
    register_loss,
    safe_exp,
    sign_aware_clip,
)
from .inputs import LossBatch
from .modes import dppo_terms

BANDPO_GENERATORS = ("kl", "tv", "chi2")
ACPO_BINS = 5
# Probability floor of the "rest" bucket of the Top-K divergences (docs/losses.md).
TOPK_REST_FLOOR = 1e-12

# log q is clamped into [_LOG_Q_MIN, _LOG_Q_MAX] before solving: q stays a normal float64 and
# 1 - q > 0, so the formulas below never meet 0 * inf. The bounds reach their limits there anyway
# (q -> 0: [0, 1/q] capped at ratio_cap; q -> 1: [e^-delta, 1]).
_LOG_Q_MIN = -700.0
_LOG_Q_MAX = -1e-300
_BANDPO_HALLEY_STEPS = (
    3  # 2 reach ~1e-12 relative on the whole (q, delta) range (tests/losses/test_losses_trust_region.py)
)
_CHUNK = 1 << 18  # elements per chunk of the float64 bound computation


def _closed_unit_interval(v) -> str | None:
    return None if isinstance(v, (int, float)) and 0 <= v <= 1 else "a number in [0, 1]"


def _f64(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


# ------------------------------------------------------------------------------------------
# CPPO
# ------------------------------------------------------------------------------------------


def row_quantile(values: torch.Tensor, valid: torch.Tensor, quantile: float) -> torch.Tensor:
    """Per-row quantile of the valid entries of [B, T] ``values``, [B] (0 for an empty row).

    Linear interpolation between order statistics (numpy's default, "type 7"): with the n valid
    values sorted as v_0 <= ... <= v_{n-1} and h = quantile * (n - 1), the result is
    v_floor(h) + (h - floor(h)) (v_floor(h)+1 - v_floor(h)).
    """
    rows, width = values.shape
    if width == 0:
        return torch.zeros(rows, dtype=values.dtype, device=values.device)
    ordered = torch.sort(torch.where(valid, values, math.inf), dim=-1).values
    n = valid.sum(dim=-1)
    h = quantile * (n - 1).clamp(min=0).to(values.dtype)
    below = torch.floor(h).long().unsqueeze(-1)
    above = torch.minimum(below + 1, (n - 1).clamp(min=0).unsqueeze(-1))
    low, high = ordered.gather(-1, below).squeeze(-1), ordered.gather(-1, above).squeeze(-1)
    interpolated = low + (h - below.squeeze(-1).to(values.dtype)) * (high - low)
    return torch.where(n > 0, interpolated, 0.0)


def cppo_position_weights(batch: LossBatch, weight_min: float) -> torch.Tensor:
    """w_t = w_min + (1 - w_min) (T - t) / (T - 1), t the valid-token index, T the response's
    valid length; 1 when T = 1 (float64, [B, T])."""
    t = batch.token_count
    length = batch.response_length.unsqueeze(-1)
    span = (length - t) / (length - 1.0).clamp(min=1.0)
    return torch.where(length > 1, weight_min + (1.0 - weight_min) * span, 1.0)


@register_loss("cppo", checks={"delta": positive, "weight_min": _closed_unit_interval, "budget_delta": positive})
def cppo(batch: LossBatch, *, delta: float = 0.2, weight_min: float = 0.8, budget_delta: float = 0.02) -> TokenTerms:
    """CPPO: mask a token that moves away from mu once the weighted prefix divergence exceeds its budget.

    D_t = |p_t - q_t|, Z_t = w_t D_t; S_{t-1}, W_{t-1} = sums of Z_j, w_j over the earlier valid
    tokens; b = clamp(P90(D_1..T), delta_b, 2 delta_b) per response (P90: `row_quantile`);
    c_t = min(delta, delta + b W_{t-1} - S_{t-1}). Keep iff A_t (r_t - 1) <= 0 or Z_t <= c_t.
    S_t = A_t r_t, gradient A_t r_t d log pi_t on kept tokens only (dense default delta = 0.15).
    """
    m = _f64(batch.mask)
    log_q = _f64(batch.behavior_log_probs)
    divergence = (torch.exp(_f64(batch.log_probs)) - torch.exp(log_q)).abs() * m
    weights = cppo_position_weights(batch, weight_min) * m
    weighted = weights * divergence
    spent_before = torch.cumsum(weighted, dim=-1) - weighted
    weight_before = torch.cumsum(weights, dim=-1) - weights
    budget = row_quantile(divergence, batch.valid, 0.9).clamp(min=budget_delta, max=2.0 * budget_delta)
    threshold = torch.clamp(delta + budget.unsqueeze(-1) * weight_before - spent_before, max=delta)

    log_ratio = batch.log_ratio
    advantages = batch.advantages
    # A (r - 1) > 0, from the sign of log r (exact; r - 1 rounds to 0 for |log r| < 1e-8).
    moves_away = ((advantages > 0) & (log_ratio > 0)) | ((advantages < 0) & (log_ratio < 0))
    masked = moves_away & (weighted > threshold)
    # "Loss on kept tokens": a masked token contributes neither value nor gradient.
    value = torch.where(masked, 0.0, advantages * safe_exp(log_ratio))
    coef = value

    # The rule as a ratio band (metrics): Z_t <= c_t  <=>  |r_t - 1| <= max(c_t, 0) / (w_t q_t).
    half_width = torch.exp(torch.log(threshold.clamp(min=0.0)) - torch.log(weights.clamp(min=1e-300)) - log_q)
    like = batch.log_probs
    return TokenTerms(
        value=value,
        coef=coef,
        clipped_upper=masked & (advantages > 0),
        clipped_lower=masked & (advantages < 0),
        log_lower=torch.log((1.0 - half_width).clamp(min=0.0)).to(like.dtype),
        log_upper=torch.log1p(half_width).to(like.dtype),
        log_value=log_ratio,
    )


# ------------------------------------------------------------------------------------------
# BandPO
# ------------------------------------------------------------------------------------------


def _log1m_exp(log_x: torch.Tensor) -> torch.Tensor:
    """log(1 - e^{log_x}) for log_x < 0, accurate at both ends."""
    return torch.where(log_x > -math.log(2.0), torch.log(-torch.expm1(log_x)), torch.log1p(-torch.exp(log_x)))


def _kl_band_side(log_p: torch.Tensor, log_pbar: torch.Tensor, delta: float) -> torch.Tensor:
    """The root y < 0 of G(y) = -p y - pbar log1p(p E / pbar) - delta, E = 1 - e^y (float64).

    G(y) is the KL(mu || pi) of the two-point family {a: p, rest: pbar = 1 - p} when the mass on
    a is scaled by e^y (<= 1) and the rest by 1 + p E / pbar. G is convex and decreasing in y,
    G(0) = -delta, so the root is unique and lies in [a, b] with
      a = -(delta - pbar log pbar) / p   (G(a) >= 0: pbar log1p(pE/pbar) <= -pbar log pbar),
      b = -delta / p                     (G(b) <= 0).
    Start from the small-delta expansion y ~ -s - (1 + p) s^2 / (6 pbar), s = sqrt(2 delta pbar / p),
    clamped into [a, b]; then a fixed number of Halley steps, each clamped into [a, b] (on a convex
    decreasing function Newton-type steps approach the root monotonically once left of it, and the
    clamp keeps an overshoot inside the bracket). In place where possible: it runs on every token.
    """
    p, pbar = torch.exp(log_p), torch.exp(log_pbar)
    odds = torch.exp(log_p - log_pbar)  # p / pbar
    inv_p = torch.reciprocal(p)
    left = (pbar * log_pbar - delta).mul_(inv_p).mul_(1.0 + 1e-12)
    right = inv_p.mul_(-delta * (1.0 - 1e-12))
    s = torch.sqrt(torch.reciprocal(odds).mul_(2.0 * delta))
    y = (1.0 + p).mul_(s).mul_(s).div_(pbar).mul_(-1.0 / 6.0).sub_(s)
    y = torch.minimum(torch.maximum(y, left, out=y), right, out=y)
    for _ in range(_BANDPO_HALLEY_STEPS):
        e = torch.expm1(y).neg_()
        rest = torch.mul(p, e).add_(pbar)  # 1 - p e^y without cancellation
        g = torch.mul(odds, e).log1p_().mul_(pbar).add_(torch.mul(p, y)).add_(delta).neg_()
        d1 = torch.mul(p, e).div_(rest).neg_()
        d2 = torch.sub(1.0, e).mul_(p).mul_(pbar).div_(rest).div_(rest)
        # Halley: y -= 2 g d1 / (2 d1^2 - g d2)
        step = torch.mul(g, d1).mul_(2.0).div_(torch.mul(d1, d1).mul_(2.0).sub_(d2.mul_(g)))
        y = torch.minimum(torch.maximum(y.sub_(step), left, out=y), right, out=y)
    return y


def _band_log_bounds(log_q: torch.Tensor, delta: float, generator: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(log lo, log hi) before the cap, float64 in and out."""
    log_q = log_q.clamp(min=_LOG_Q_MIN, max=_LOG_Q_MAX)
    log_not_q = _log1m_exp(log_q)
    if generator == "kl":
        lower = _kl_band_side(log_q, log_not_q, delta)
        # The upper side is the lower side of the rest bucket: its mass 1 - q shrinks by e^{y'},
        # so the token's ratio is r = 1 + (1 - q)(1 - e^{y'}) / q.
        rest_side = _kl_band_side(log_not_q, log_q, delta)
        upper = torch.log1p(torch.exp(log_not_q - log_q) * -torch.expm1(rest_side))
        return lower, upper
    if generator == "tv":  # q |r - 1| <= delta
        half_width = torch.exp(math.log(delta) - log_q)
    else:  # chi2: q (r - 1)^2 / (1 - q) <= delta
        half_width = torch.exp(0.5 * (math.log(delta) + log_not_q - log_q))
    lower = torch.where(half_width < 1.0, torch.log1p(-half_width.clamp(max=1.0)), -math.inf)
    upper = torch.minimum(torch.log1p(half_width), -log_q)  # r <= 1 / q
    return lower, upper


def bandpo_log_bounds(
    log_q: torch.Tensor, delta: float = 0.05, generator: str = "kl", ratio_cap: float = 10.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """BandPO's per-token ratio bounds in log space, (log lo_t, log hi_t), from log q_t = log mu(o_t).

    [lo, hi] = {r in [0, 1/q]: q f(r) + (1 - q) f((1 - r q) / (1 - q)) <= delta}, hi capped at
    ``ratio_cap``. f = u - 1 - log u ("kl"), |u - 1| / 2 ("tv"), (u - 1)^2 ("chi2"). TV and chi^2
    in closed form; KL by a fixed number of safeguarded Halley steps in float64 (`_kl_band_side`),
    chunked, no host synchronisation. lo = 0 is returned as -inf (TV, chi^2) or as a very negative
    finite number (KL, q -> 0). Result in log_q's dtype and shape.
    """
    if generator not in BANDPO_GENERATORS:
        raise PolicyLossInputError(f"generator={generator!r} must be one of {BANDPO_GENERATORS}")
    flat = log_q.detach().reshape(-1)
    lower = torch.empty(flat.shape, dtype=log_q.dtype, device=log_q.device)
    upper = torch.empty_like(lower)
    log_cap = math.log(ratio_cap)
    with torch.no_grad():
        for start in range(0, flat.numel(), _CHUNK):
            piece = _f64(flat[start : start + _CHUNK])
            lo, hi = _band_log_bounds(piece, delta, generator)
            lower[start : start + _CHUNK] = lo
            upper[start : start + _CHUNK] = hi.clamp(max=log_cap)
    return lower.reshape(log_q.shape), upper.reshape(log_q.shape)


@register_loss(
    "bandpo", checks={"delta": positive, "generator": one_of(*BANDPO_GENERATORS), "ratio_cap": greater_than_one}
)
def bandpo(batch: LossBatch, *, delta: float = 0.05, generator: str = "kl", ratio_cap: float = 10.0) -> TokenTerms:
    """BandPO: PPO clip of r_t to the f-divergence band [lo_t, hi_t] of the two-point distribution at q_t."""
    log_lower, log_upper = bandpo_log_bounds(batch.behavior_log_probs, delta, generator, ratio_cap)
    return sign_aware_clip(
        batch.log_ratio, batch.advantages, upper_pos=log_upper, lower_neg=log_lower, upper_neg=math.inf
    )


# ------------------------------------------------------------------------------------------
# ACPO
# ------------------------------------------------------------------------------------------


def acpo_bin_epsilons(
    batch: LossBatch, eps_base: float, alpha: float, eps_min: float, eps_max: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(eps per bin [5], bin index per token [B, T]) with bins of q_t: [0, .2), ..., [.8, 1].

    eps_bin = clamp(eps_base + alpha * std_bin, eps_min, eps_max), std_bin the population standard
    deviation (divide by n, so a bin of one token has std 0) of r_t over the valid tokens of the
    bin, over the whole batch; an empty bin has std 0. float64, two-pass (no E[r^2] - E[r]^2
    cancellation); r_t is capped at e^350 so that squares stay finite.
    """
    m = _f64(batch.mask).reshape(-1)
    q = torch.exp(_f64(batch.behavior_log_probs))
    bins = torch.clamp(torch.floor(q * ACPO_BINS), 0, ACPO_BINS - 1).long()
    flat_bins = bins.reshape(-1)
    ratio = torch.exp(_f64(batch.log_ratio).clamp(max=350.0)).reshape(-1)
    zeros = torch.zeros(ACPO_BINS, dtype=torch.float64, device=m.device)
    counts = zeros.scatter_add(0, flat_bins, m).clamp(min=1.0)
    mean = zeros.scatter_add(0, flat_bins, ratio * m) / counts
    variance = zeros.scatter_add(0, flat_bins, torch.square(ratio - mean[flat_bins]) * m) / counts
    std = torch.sqrt(variance).clamp(max=1e30)  # alpha * inf would be NaN for alpha = 0
    return torch.clamp(eps_base + alpha * std, min=eps_min, max=eps_max), bins


@register_loss(
    "acpo",
    checks={"eps_base": nonnegative, "alpha": nonnegative, "eps_min": in_unit_interval, "eps_max": in_unit_interval},
)
def acpo(
    batch: LossBatch, *, eps_base: float = 0.2, alpha: float = 1.0, eps_min: float = 0.05, eps_max: float = 0.5
) -> TokenTerms:
    """ACPO: PPO clip [1 - eps, 1 + eps] with eps per bin of q_t from the spread of r_t in the bin."""
    if eps_min > eps_max:
        raise PolicyLossInputError(f"mode 'acpo': eps_min={eps_min!r} must be <= eps_max={eps_max!r}")
    eps, bins = acpo_bin_epsilons(batch, eps_base, alpha, eps_min, eps_max)
    eps_token = eps[bins].to(batch.log_probs.dtype)
    terms = sign_aware_clip(
        batch.log_ratio,
        batch.advantages,
        upper_pos=torch.log1p(eps_token),
        lower_neg=torch.log1p(-eps_token),
        upper_neg=math.inf,
    )
    terms.extra_metrics.update({f"acpo_eps_bin_{k}": eps[k] for k in range(ACPO_BINS)})
    return terms


# ------------------------------------------------------------------------------------------
# DPPO Top-K
# ------------------------------------------------------------------------------------------


def _require_topk(batch: LossBatch, mode: str) -> None:
    if batch.behavior_topk_log_probs is None:
        raise PolicyLossInputError(
            f"mode {mode!r} needs the behaviour policy's top-K log-probs: pass behavior_topk_log_probs="
            f"[B, T, K] (log mu of mu's top-k ids plus the sampled token) and current_topk_log_probs=[B, T, K] "
            f"(log pi of the same ids), and topk_mask=[B, T, K] for duplicate/absent columns, to "
            f"compute_policy_loss; epic_slime.losses.topk.topk_inputs_from_logits builds them from logits"
        )


def _rest_mass(probabilities: torch.Tensor) -> torch.Tensor:
    """1 - (mass of the set), floored at TOPK_REST_FLOOR; the sum over K in float64."""
    return (1.0 - probabilities.sum(-1, dtype=torch.float64)).clamp_(min=TOPK_REST_FLOOR)


def topk_total_variation(batch: LossBatch, mode: str = "dppo_topk_tv") -> torch.Tensor:
    """TV = 1/2 (sum_{i in set} |mu_i - pi_i| + |mu_rest - pi_rest|), [B, T] float64.

    Elementwise work in the compute dtype (the set's entries are -inf off topk_mask: exp gives 0)."""
    _require_topk(batch, mode)
    mu = torch.exp(batch.behavior_topk_log_probs)
    pi = torch.exp(batch.current_topk_log_probs)
    on_set = (mu - pi).abs_().sum(-1, dtype=torch.float64)
    return 0.5 * (on_set + (_rest_mass(mu) - _rest_mass(pi)).abs_())


def topk_kl(batch: LossBatch, mode: str = "dppo_topk_kl") -> torch.Tensor:
    """KL(mu || pi) = sum_{i in set} mu_i (log mu_i - log pi_i) + mu_rest log(mu_rest / pi_rest), [B, T] float64."""
    _require_topk(batch, mode)
    log_mu, log_pi = batch.behavior_topk_log_probs, batch.current_topk_log_probs
    mu = torch.exp(log_mu)
    terms = torch.where(mu > 0, mu * (log_mu - log_pi), 0.0)  # 0 log 0 = 0 (and -inf off the set)
    mu_rest, pi_rest = _rest_mass(mu), _rest_mass(torch.exp(log_pi))
    return terms.sum(-1, dtype=torch.float64) + mu_rest * (torch.log(mu_rest) - torch.log(pi_rest))


def _dppo_topk(
    batch: LossBatch, divergence: torch.Tensor, name: str, clip_low: float, clip_high: float, ratio_cap: float
) -> TokenTerms:
    """The binary DPPO rule on a Top-K divergence: mask when it exceeds eps and the sampled token
    moved in its advantage's direction (A > 0: pi_t > mu_t, A <= 0: pi_t < mu_t). Reports the
    divergence's mean over valid tokens as the metric ``topk_{name}_mean``."""
    up = batch.log_probs > batch.behavior_log_probs
    down = batch.log_probs < batch.behavior_log_probs
    inf = torch.full_like(batch.log_probs, math.inf)
    terms = dppo_terms(batch, (divergence > clip_high) & up, (divergence > clip_low) & down, ratio_cap, -inf, inf)
    count = batch.valid.sum(dtype=torch.float64).clamp(min=1.0)
    terms.extra_metrics[f"topk_{name}_mean"] = torch.where(batch.valid, divergence, 0.0).sum() / count
    return terms


_TOPK_CHECKS = {"clip_low": positive, "clip_high": positive, "ratio_cap": greater_than_one}


@register_loss("dppo_topk_tv", checks=_TOPK_CHECKS, needs_topk=True)
def dppo_topk_tv(
    batch: LossBatch, *, clip_low: float = 0.15, clip_high: float = 0.15, ratio_cap: float = 1e4
) -> TokenTerms:
    """DPPO-TV Top-K: dppo_tv's rule with the TV over mu's top-K set plus a rest bucket."""
    return _dppo_topk(batch, topk_total_variation(batch, "dppo_topk_tv"), "tv", clip_low, clip_high, ratio_cap)


@register_loss("dppo_topk_kl", checks=_TOPK_CHECKS, needs_topk=True)
def dppo_topk_kl(
    batch: LossBatch, *, clip_low: float = 0.05, clip_high: float = 0.05, ratio_cap: float = 1e4
) -> TokenTerms:
    """DPPO-KL Top-K: dppo_kl's rule with KL(mu || pi) over mu's top-K set plus a rest bucket."""
    return _dppo_topk(batch, topk_kl(batch, "dppo_topk_kl"), "kl", clip_low, clip_high, ratio_cap)
