"""Diagnostics every mode reports, computed in one O(B*T) pass from the mode's TokenTerms.

All values are 0-d tensors (no host synchronisation except the ratio p95, which needs the count of
valid tokens). Fractions over an empty set are 0.
"""

from __future__ import annotations

import math

import torch

from .core import LossBatch, TokenTerms, _max_log

POSITION_BINS = 10
# A lower bound whose ratio e^{lo} underflows float32 is "no lower bound" in practice.
_LOG_TINY = math.log(torch.finfo(torch.float32).tiny)


def _frac(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return numerator / denominator.clamp(min=1.0)


def policy_loss_metrics(batch: LossBatch, terms: TokenTerms) -> dict[str, torch.Tensor]:
    valid = batch.valid
    m = batch.mask
    n = batch.valid.sum().to(torch.float64)
    clipped_upper = terms.clipped_upper & valid
    clipped_lower = terms.clipped_lower & valid
    clipped = clipped_upper | clipped_lower
    positive = (batch.advantages > 0) & valid
    negative = (batch.advantages < 0) & valid
    count = lambda b: b.sum().to(torch.float64)  # noqa: E731  (int64 count: exact and cheap)
    total = lambda x: x.sum().to(torch.float64)  # noqa: E731  (pairwise float sum)

    metrics = {
        "valid_tokens": n,
        "empty_responses": count(batch.response_length == 0),
        "clipfrac": _frac(count(clipped), n),
        "clipfrac_upper": _frac(count(clipped_upper), n),
        "clipfrac_lower": _frac(count(clipped_lower), n),
        "clipfrac_pos_adv": _frac(count(clipped & positive), count(positive)),
        "clipfrac_neg_adv": _frac(count(clipped & negative), count(negative)),
    }

    # Clip fraction by relative position (t - 1) / T in 10 bins, and its spread across bins.
    # One bincount: key = bin + 10 * clipped for valid tokens, 20 for masked ones.
    length = batch.response_length.clamp(min=1.0).unsqueeze(-1)
    bins = ((batch.token_count - 1.0) / length * POSITION_BINS).long().clamp_(0, POSITION_BINS - 1)
    key = torch.where(valid, bins + POSITION_BINS * clipped.long(), 2 * POSITION_BINS)
    counts = torch.bincount(key.reshape(-1), minlength=2 * POSITION_BINS + 1).to(torch.float64)
    clipped_per_bin = counts[POSITION_BINS:2 * POSITION_BINS]
    tokens_per_bin = counts[:POSITION_BINS] + clipped_per_bin
    bin_frac = _frac(clipped_per_bin, tokens_per_bin)
    for i in range(POSITION_BINS):
        metrics[f"clipfrac_position_bin_{i}"] = bin_frac[i]
    occupied = (tokens_per_bin > 0).to(torch.float64)
    n_occupied = occupied.sum().clamp(min=1.0)
    bin_mean = (bin_frac * occupied).sum() / n_occupied
    bin_std = torch.sqrt((torch.square(bin_frac - bin_mean) * occupied).sum() / n_occupied)
    metrics["clipfrac_position_cv"] = torch.where(bin_mean > 0, bin_std / bin_mean.clamp(min=1e-300), 0.0)

    # Prefix statistics and bounds.
    log_lower = terms.log_lower
    log_upper = terms.log_upper
    finite_lower = (log_lower > _LOG_TINY) & valid
    metrics["finite_lower_frac"] = _frac(count(finite_lower), n)
    abs_prefix = batch.log_prefix_ratio.abs().mul_(m)
    metrics["abs_L_mean"] = _frac(total(abs_prefix), n)
    metrics["abs_z_mean"] = _frac(total(abs_prefix.mul_(batch.inv_token_count)), n)
    # Mean bounds in log space (on the clipped quantity X_t), each over the valid tokens that have
    # that bound; a lower bound whose e^{lo} underflows float32 counts as absent.
    finite_upper = torch.isfinite(log_upper) & valid
    metrics["finite_upper_frac"] = _frac(count(finite_upper), n)
    metrics["log_bound_lower_mean"] = _frac(total(torch.where(finite_lower, log_lower, 0.0)),
                                            count(finite_lower))
    metrics["log_bound_upper_mean"] = _frac(total(torch.where(finite_upper, log_upper, 0.0)),
                                            count(finite_upper))

    # Token-ratio statistics (r_t = pi_t / mu_t) and the train-rollout log-prob gap.
    log_ratio = batch.log_ratio
    metrics["logprob_abs_diff"] = _frac(total(log_ratio.abs()), n)
    metrics["ratio_mean"] = _frac(total(torch.exp(log_ratio).mul_(m)), n)
    masked_log_ratio = torch.where(valid, log_ratio, -math.inf)
    metrics["ratio_max"] = (torch.exp(masked_log_ratio.max().to(torch.float64)) if valid.numel()
                            else torch.zeros((), dtype=torch.float64))
    n_valid = int(n) if valid.numel() else 0
    if n_valid:
        # Nearest-rank 95th percentile of the valid log-ratios; masked ones sit at -inf, first.
        k = masked_log_ratio.numel() - n_valid + max(1, math.ceil(0.95 * n_valid))
        p95 = torch.kthvalue(masked_log_ratio.reshape(-1), k).values
        metrics["ratio_p95"] = torch.exp(p95.to(torch.float64))
    else:
        metrics["ratio_p95"] = torch.zeros((), dtype=torch.float64)
        metrics["ratio_max"] = torch.zeros((), dtype=torch.float64)

    # Counted fallback: an unclipped value beyond e^44 (float32) / e^354 (float64) was capped
    # (see core._max_log).
    if terms.log_value is not None:
        overflow = (terms.log_value > _max_log(terms.log_value.dtype)) & valid & ~clipped
        metrics["value_capped_frac"] = _frac(count(overflow), n)
    else:
        metrics["value_capped_frac"] = torch.zeros((), dtype=torch.float64)

    for key, value in terms.extra_metrics.items():
        metrics[key] = value
    return metrics
