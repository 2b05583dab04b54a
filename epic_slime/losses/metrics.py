"""Diagnostics every mode reports, from the mode's TokenTerms, without host synchronisation.

All values are 0-d float64 tensors that stay on the device (slime reduces them). Fractions over an
empty set are 0. Every reduction has a shape fixed by the inputs' shapes: counts are sums of 0/1
indicators, the clip fraction by position is one fixed-size scatter-add, and the ratio p95 is an
exact radix select with fixed-size histograms (`kth_smallest`), so nothing reads a value back
(no .item(), nonzero, bincount or data-dependent k). tests/losses/test_losses_sync_free.py runs this
module on the "meta" device, where any of those raises.

Cost: indicators are built as float 0/1 tensors (a comparison into a float tensor and float sums
vectorise on the CPU; bool outputs, bool sums and torch.where do not), and the statistics that do
not depend on the mode (`batch_statistics`) are computed once per batch and cached on it.
"""

from __future__ import annotations

import math

import torch

from . import bounds  # bounds.host_checks_are_free looked up per call: tests force the accelerator branches
from .core import INT_DTYPE_OF, TokenTerms, as_float, max_exponent, select
from .inputs import LossBatch

POSITION_BINS = 10
# A lower bound whose ratio e^{lo} underflows float32 is "no lower bound" in practice.
_LOG_TINY = math.log(torch.finfo(torch.float32).tiny)
# float32 sums of 0/1 are exact while every partial sum stays below 2^24.
_EXACT_FLOAT32_COUNT = 1 << 24


def _frac(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return numerator / denominator.clamp(min=1.0)


def _total(x: torch.Tensor) -> torch.Tensor:
    """Sum as float64: exact for 0/1 indicators, pairwise for values."""
    if x.dtype == torch.float32 and x.numel() >= _EXACT_FLOAT32_COUNT:
        return x.sum(dtype=torch.float64)
    return x.sum().to(torch.float64)


def _indicator(compare, a: torch.Tensor, b, like: torch.Tensor) -> torch.Tensor:
    """compare(a, b) as a 0/1 tensor of like's dtype (NaN compares False)."""
    out = torch.empty(torch.broadcast_shapes(a.shape, like.shape), dtype=like.dtype, device=like.device)
    return compare(a, b, out=out)


def _broadcast_scalar(x: torch.Tensor) -> torch.Tensor | None:
    """The 0-d value of a tensor expanded from one number (a mode's constant bound), else None."""
    if x.dim() > 0 and all(s == 0 for s in x.stride()):
        return torch.as_strided(x, (), ())
    return None


# ------------------------------------------------------------------------------------------------
# Exact order statistic, sync-free
# ------------------------------------------------------------------------------------------------

_DIGIT_BITS = 16
_DIGITS = 1 << _DIGIT_BITS


def _sortable_key(x: torch.Tensor) -> torch.Tensor:
    """Integer keys (int32 for float32, int64 for float64) ordered like the float values of x
    (-inf < ... < -0.0 < +0.0 < ... < +inf; NaNs at the ends by sign): the magnitude bits of
    negative numbers are flipped."""
    int_dtype = INT_DTYPE_OF[x.dtype]
    bits = x.view(int_dtype)
    flip = torch.bitwise_right_shift(bits, torch.iinfo(int_dtype).bits - 1).bitwise_and_(torch.iinfo(int_dtype).max)
    return flip.bitwise_xor_(bits)


def _float_of_key(key: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    int_dtype = INT_DTYPE_OF[dtype]
    key = key.to(int_dtype)
    flip = torch.bitwise_right_shift(key, torch.iinfo(int_dtype).bits - 1).bitwise_and_(torch.iinfo(int_dtype).max)
    return torch.bitwise_xor(key, flip).view(dtype)


def _histogram(index: torch.Tensor, bins: int) -> torch.Tensor:
    """int64 counts of each value of a 1-D integer ``index`` in [0, bins), fixed size ``bins``.

    Accelerators: a scatter-add (CUDA's bincount reads the maximum back to size its output). The
    CPU: bincount (minlength fixes its size since index < bins; no device to wait for), because a
    CPU scatter-add into a few hot bins is a chain of dependent adds (3x slower here)."""
    if bounds.host_checks_are_free(index):
        return torch.bincount(index, minlength=bins)
    index = index.to(torch.int64)
    ones = torch.ones((), dtype=torch.int64, device=index.device).expand(index.shape)
    return torch.zeros(bins, dtype=torch.int64, device=index.device).scatter_add_(0, index, ones)


def kth_smallest(values: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The k-th smallest (1-based, 0-d int64 tensor k in [1, numel]) of a float32/float64 tensor, exactly.

    A most-significant-digit radix select on the order-preserving integer keys: per 16-bit digit,
    a histogram of fixed size 65536 (+2: below / above the prefix chosen so far), its cumulative
    sum and a searchsorted for k. 2 rounds for float32, 4 for float64; no data-dependent shape.
    On the CPU (where reading a value back costs nothing) the rounds after the first are one
    kthvalue over the keys that share the chosen top digit."""
    key = _sortable_key(values.reshape(-1))
    width = torch.iinfo(INT_DTYPE_OF[values.dtype]).bits
    target = k.reshape(1).to(torch.int64)
    # The top digit, signed: [-2^15, 2^15) -> [0, 2^16).
    index = torch.bitwise_right_shift(key, width - _DIGIT_BITS).add_(_DIGITS // 2)
    counts = _histogram(index, _DIGITS).cumsum_(0)
    chosen = torch.searchsorted(counts, target).reshape(())
    if bounds.host_checks_are_free(key):
        # The CPU may read back: select among the keys with the chosen top digit only (typically
        # a few percent of them), skipping the remaining full-size rounds.
        below = int(counts[chosen - 1]) if int(chosen) > 0 else 0
        bucket = key[index == chosen]
        return _float_of_key(torch.kthvalue(bucket, int(k) - below).values, values.dtype)
    prefix = (chosen - _DIGITS // 2).to(key.dtype)
    side = index
    for shift in range(width - 2 * _DIGIT_BITS, -1, -_DIGIT_BITS):
        # side: -1 / 0 / +1 for keys whose digits above this one are below / on / above the prefix.
        if shift == width - 2 * _DIGIT_BITS:
            side = index.sub_(prefix + _DIGITS // 2).clamp_(-1, 1)  # index still holds the top digit
        else:
            side = torch.bitwise_right_shift(key, shift + _DIGIT_BITS, out=side).sub_(prefix).clamp_(-1, 1)
        # index: 0 below, 1 + digit on the prefix, 65537 above.
        digit = key.bitwise_and_(_DIGITS - 1) if shift == 0 else torch.bitwise_right_shift(key, shift).bitwise_and_(_DIGITS - 1)
        index = digit.add_(1).add_(side, alpha=_DIGITS + 1).clamp_(0, _DIGITS + 1)
        counts = _histogram(index, _DIGITS + 2)
        chosen = (torch.searchsorted(counts.cumsum_(0), target).reshape(()) - 1).to(key.dtype)
        prefix = torch.bitwise_left_shift(prefix, _DIGIT_BITS).bitwise_or_(chosen)
    return _float_of_key(prefix, values.dtype)


# ------------------------------------------------------------------------------------------------
# Statistics
# ------------------------------------------------------------------------------------------------

def batch_statistics(batch: LossBatch) -> dict[str, torch.Tensor]:
    """The mode-independent diagnostics of a batch (cached on it: computed once for every mode)."""
    return batch._cached("metrics", lambda: _batch_statistics(batch))


def _batch_statistics(batch: LossBatch) -> dict[str, torch.Tensor]:
    m = batch.mask
    n = _total(m)
    log_ratio = batch.log_ratio  # 0 on masked tokens
    buffer = batch.log_prefix_ratio.abs().mul_(m)  # one [B, T] temporary for the four means
    sums = [buffer.sum()]
    sums.append(buffer.mul_(batch.inv_token_count).sum())
    sums.append(torch.abs(log_ratio, out=buffer).sum())
    sums.append(torch.exp(log_ratio, out=buffer).mul_(m).sum())
    means = _frac(torch.stack(sums).to(torch.float64), n).unbind()
    out = {"valid_tokens": n, "empty_responses": (batch.response_length == 0).sum().to(torch.float64)}
    out.update(zip(("abs_L_mean", "abs_z_mean", "logprob_abs_diff", "ratio_mean"), means))
    numel = log_ratio.numel()
    if numel == 0:
        out["ratio_max"] = out["ratio_p95"] = torch.zeros((), dtype=torch.float64, device=m.device)
        out["position_bins"] = torch.zeros_like(m)
        return out
    # Ratio max and nearest-rank 95th percentile of the valid log-ratios; masked ones sit at -inf,
    # first. With no valid token both are exp(-inf) = 0.
    masked_log_ratio = select(batch.keep_bits, log_ratio, -math.inf, m)
    out["ratio_max"] = torch.exp(masked_log_ratio.max().to(torch.float64))
    rank = (numel - n.to(torch.int64)) + torch.ceil(0.95 * n).to(torch.int64).clamp_(min=1)
    p95 = kth_smallest(masked_log_ratio, rank.clamp_(max=numel))
    out["ratio_p95"] = torch.exp(p95.to(torch.float64))
    # Position bins: bin = floor(10 (t - 1) / n) of a response's t-th valid token, n its length
    # (exact in float32: 10 (t - 1) / n is at least 1 / n away from the next integer).
    length = batch.response_length.to(m.dtype).clamp_(min=1.0).unsqueeze(-1)
    bins = torch.mul(batch.token_count, float(POSITION_BINS), out=buffer).sub_(float(POSITION_BINS))
    out["position_bins"] = bins.div_(length).floor_()  # [B, T], for `_position_metrics`; not a metric
    return out


def _position_metrics(batch: LossBatch, clipped: torch.Tensor, stats, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
    """Clip fraction per relative-position bin and its spread: one fixed-size histogram of
    key = bin + 10 * clipped on valid tokens, 20 on masked ones (``clipped``: 0/1 floats)."""
    m = batch.mask
    key = torch.add(stats["position_bins"], clipped, alpha=10.0, out=buffer).sub_(2 * POSITION_BINS).mul_(m)
    key = key.add_(2 * POSITION_BINS).to(torch.uint8).reshape(-1)
    counts = _histogram(key, 2 * POSITION_BINS + 1).to(torch.float64)
    clipped_per_bin = counts[POSITION_BINS:2 * POSITION_BINS]
    tokens_per_bin = counts[:POSITION_BINS] + clipped_per_bin
    bin_frac = _frac(clipped_per_bin, tokens_per_bin)
    out = {f"clipfrac_position_bin_{i}": f for i, f in enumerate(bin_frac.unbind())}
    occupied = (tokens_per_bin > 0).to(torch.float64)
    n_occupied = occupied.sum().clamp(min=1.0)
    bin_mean = (bin_frac * occupied).sum() / n_occupied
    bin_std = torch.sqrt((torch.square(bin_frac - bin_mean) * occupied).sum() / n_occupied)
    out["clipfrac_position_cv"] = torch.where(bin_mean > 0, bin_std / bin_mean.clamp(min=1e-300), 0.0)
    return out


def _all_present(bound: torch.Tensor, side: str) -> bool:
    """Every entry of the bound is present (lower: > log tiny; upper: finite): one min/max pass."""
    if bound.numel() == 0:
        return True
    low, high = (float(v) for v in torch.aminmax(bound))
    return (low > _LOG_TINY if side == "lower" else low > -math.inf) and high < math.inf  # NaN: False


def _bound_sums(batch: LossBatch, terms: TokenTerms, n: torch.Tensor) -> dict[str, tuple]:
    """(numerator, denominator) of: the fraction of valid tokens with a finite lower / upper bound,
    and the mean of those bounds (log space, on the clipped quantity); a lower bound whose e^{lo}
    underflows float32 is absent."""
    m = batch.mask
    out = {}
    for side, bound in (("lower", terms.log_lower), ("upper", terms.log_upper)):
        scalar = _broadcast_scalar(bound)
        if scalar is not None:  # a constant bound (the PPO family): no pass over the tokens
            has = (scalar > _LOG_TINY) if side == "lower" else torch.isfinite(scalar)
            has = has.to(torch.float64)
            count = has * n
            total = torch.where(has > 0, scalar.to(torch.float64), 0.0) * n
        elif bounds.host_checks_are_free(bound) and _all_present(bound, side):
            count, total = n, _dot(bound, m)  # every valid token has the bound (the CPU may ask)
        else:
            if side == "lower":
                has = _indicator(torch.gt, bound, _LOG_TINY, m).mul_(m)
                finite = torch.clamp(bound, min=_LOG_TINY)
            else:
                has = _indicator(torch.lt, bound.abs(), math.inf, m).mul_(m)
                finite = bound
            count = _total(has)
            total = _dot(torch.nan_to_num(finite, nan=0.0, posinf=0.0, neginf=0.0), has)
        out[f"finite_{side}_frac"] = (count, n)
        out[f"log_bound_{side}_mean"] = (total, count)
    return out


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum(a * b) as float64 without a [B, T] temporary (exact for 0/1 float32 below 2^24 terms)."""
    if a.dtype == torch.float32 and a.numel() >= _EXACT_FLOAT32_COUNT:
        return torch.dot(a.reshape(-1).double(), b.reshape(-1).double())
    return torch.dot(a.reshape(-1), b.reshape(-1)).to(torch.float64)


def _count(flags: torch.Tensor) -> torch.Tensor:
    """Number of True, float64 (count_nonzero reads the bools: no [B, T] float or int64 copy)."""
    return torch.count_nonzero(flags).to(torch.float64)


def policy_loss_metrics(batch: LossBatch, terms: TokenTerms, clipped: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``clipped``: (clipped_upper | clipped_lower) & valid, when the caller has it already."""
    m = batch.mask
    stats = batch_statistics(batch)
    n = stats["valid_tokens"]
    if clipped is None:
        clipped = (terms.clipped_upper | terms.clipped_lower) & batch.valid
    clipped_f = as_float(clipped, m.dtype)
    buffer = _indicator(torch.gt, batch.advantages, 0.0, m)  # advantages are 0 on masked tokens
    fractions = {  # name: (numerator, denominator), divided at once below
        "clipfrac": (_total(clipped_f), n),
        "clipfrac_upper": (_count(terms.clipped_upper & batch.valid), n),
        "clipfrac_lower": (_count(terms.clipped_lower & batch.valid), n),
        "clipfrac_pos_adv": (_dot(clipped_f, buffer), _total(buffer)),
    }
    torch.lt(batch.advantages, 0.0, out=buffer)
    fractions["clipfrac_neg_adv"] = (_dot(clipped_f, buffer), _total(buffer))
    # Counted fallback: an unclipped value beyond e^44 (float32) / e^354 (float64) was capped
    # (see core.max_exponent).
    if terms.log_value is not None:
        capped = torch.gt(terms.log_value, max_exponent(terms.log_value.dtype), out=buffer)
        fractions["value_capped_frac"] = (_dot(capped, m) - _dot(capped, clipped_f), n)
    fractions.update(_bound_sums(batch, terms, n))
    metrics = {"valid_tokens": n, "empty_responses": stats["empty_responses"]}
    numerators, denominators = (torch.stack([f[i] for f in fractions.values()]) for i in (0, 1))
    metrics.update(zip(fractions, _frac(numerators, denominators).unbind()))
    if terms.log_value is None:
        metrics["value_capped_frac"] = torch.zeros((), dtype=torch.float64, device=m.device)

    metrics.update(_position_metrics(batch, clipped_f, stats, buffer))
    for name in ("abs_L_mean", "abs_z_mean", "logprob_abs_diff", "ratio_mean", "ratio_max", "ratio_p95"):
        metrics[name] = stats[name]
    for key, value in terms.extra_metrics.items():
        metrics[key] = value
    return metrics
