"""Diagnostics every mode reports, from the mode's TokenTerms, without host synchronisation.

All values are 0-d float64 tensors that stay on the device (slime reduces them). Fractions over an
empty set are 0. On accelerators every reduction has a shape fixed by the inputs' shapes: counts are
sums of 0/1 indicators, the clip fraction by position is a prefix sum read at fixed-size
searchsorted positions (`_position_metrics`), and the ratio p95 is an exact radix select with fixed-size
histograms (`kth_smallest`), so nothing reads a value back (no .item(), nonzero, bincount or
data-dependent k). tests/losses/test_losses_sync_free.py runs this module on the "meta" device, where
any of those raises. On the CPU, where reading a value costs nothing, the p95 is an exact select
bracketed from a strided sample (`_kth_smallest_host`).

Cost (bench/loss_bench.py): each [B, T] pass counts. Indicators are float 0/1 tensors (a
comparison into a float tensor and float sums vectorise on the CPU; bool outputs, bool sums and
torch.where do not); sums are stacked and converted to float64 once; the ratio statistics (mean,
max, p95) read one tensor r_t m_t (nonnegative, 0 off the mask); the statistics that do not depend
on the mode (`batch_statistics`) are computed once per batch and cached on it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import bounds  # bounds.host_checks_are_free looked up per call: tests force the accelerator branches
from .core import INT_DTYPE_OF, TokenTerms, as_float, exp_by_exp2, max_exponent, safe_exp
from .inputs import LossBatch

POSITION_BINS = 10
# A lower bound whose ratio e^{lo} underflows float32 is "no lower bound" in practice.
_LOG_TINY = math.log(torch.finfo(torch.float32).tiny)
# float32 sums of 0/1 are exact while every partial sum stays below 2^24.
_EXACT_FLOAT32_COUNT = 1 << 24


def _frac(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return numerator / denominator.clamp(min=1.0)


def _total(x: torch.Tensor) -> torch.Tensor:
    """Sum, exact for 0/1 indicators (float64 from 2^24 float32 terms on), pairwise for values.

    Left in its dtype: the sums of a call are stacked and widened to float64 once (each 0-d
    conversion is a dispatch of its own, and a call has dozens)."""
    if x.dtype == torch.float32 and x.numel() >= _EXACT_FLOAT32_COUNT:
        return x.sum(dtype=torch.float64)
    return x.sum()


def _indicator(compare, a: torch.Tensor, b, like: torch.Tensor) -> torch.Tensor:
    """compare(a, b) as a 0/1 tensor of like's dtype (NaN compares False)."""
    # torch.broadcast_shapes costs ~40 us on the CPU (3x the comparison itself): only when needed
    shape = like.shape if a.shape == like.shape else torch.broadcast_shapes(a.shape, like.shape)
    out = torch.empty(shape, dtype=like.dtype, device=like.device)
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
    """int64 counts of each value of a 1-D integer ``index`` in [0, bins), fixed size ``bins``: a
    scatter-add (CUDA's bincount reads the maximum back to size its output). The radix select's
    only; the CPU never gets here (`kth_smallest` takes `_kth_smallest_host`)."""
    index = index.to(torch.int64)
    ones = torch.ones((), dtype=torch.int64, device=index.device).expand(index.shape)
    return torch.zeros(bins, dtype=torch.int64, device=index.device).scatter_add_(0, index, ones)


def kth_smallest(values: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The k-th smallest (1-based, 0-d int64 tensor k in [1, numel]) of a float32/float64 tensor, exactly.

    Accelerators: a most-significant-digit radix select on the order-preserving integer keys: per
    16-bit digit, a histogram of fixed size 65536 (+2: below / above the prefix chosen so far), its
    cumulative sum and a searchsorted for k. 2 rounds for float32, 4 for float64; no data-dependent
    shape. The CPU (where reading a value back costs nothing): `_kth_smallest_host`."""
    if bounds.host_checks_are_free(values):
        return _kth_smallest_host(values.reshape(-1), int(k))
    key = _sortable_key(values.reshape(-1))
    width = torch.iinfo(INT_DTYPE_OF[values.dtype]).bits
    target = k.reshape(1).to(torch.int64)
    # The top digit, signed: [-2^15, 2^15) -> [0, 2^16).
    index = torch.bitwise_right_shift(key, width - _DIGIT_BITS).add_(_DIGITS // 2)
    counts = _histogram(index, _DIGITS).cumsum_(0)
    chosen = torch.searchsorted(counts, target).reshape(())
    prefix = (chosen - _DIGITS // 2).to(key.dtype)
    side = index
    for shift in range(width - 2 * _DIGIT_BITS, -1, -_DIGIT_BITS):
        # side: -1 / 0 / +1 for keys whose digits above this one are below / on / above the prefix.
        if shift == width - 2 * _DIGIT_BITS:
            side = index.sub_(prefix + _DIGITS // 2).clamp_(-1, 1)  # index still holds the top digit
        else:
            side = torch.bitwise_right_shift(key, shift + _DIGIT_BITS, out=side).sub_(prefix).clamp_(-1, 1)
        # index: 0 below, 1 + digit on the prefix, 65537 above.
        digit = (
            key.bitwise_and_(_DIGITS - 1)
            if shift == 0
            else torch.bitwise_right_shift(key, shift).bitwise_and_(_DIGITS - 1)
        )
        index = digit.add_(1).add_(side, alpha=_DIGITS + 1).clamp_(0, _DIGITS + 1)
        counts = _histogram(index, _DIGITS + 2)
        chosen = (torch.searchsorted(counts.cumsum_(0), target).reshape(()) - 1).to(key.dtype)
        prefix = torch.bitwise_left_shift(prefix, _DIGIT_BITS).bitwise_or_(chosen)
    return _float_of_key(prefix, values.dtype)


_SAMPLE_STRIDE = 64  # the bracketing sample: every 64th element
_SMALL = 4096  # below this many elements, one partition of all of them


def _kth_smallest_host(flat: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th smallest of a 1-D CPU tensor, exactly, in about 5 passes (a radix select or a full
    partition costs 3-5x that at 128k elements).

    Two order statistics of a strided sample bracket the k-th value in [lo, hi] with high
    probability (4 binomial standard deviations on each side); one counting pass finds how many
    values lie below lo, one extraction pass the few in [lo, hi], and a partition of those picks
    the k-th. When the bracket misses (a sample that is not representative, or NaNs, which
    compare false), a partition of everything gives the same exact answer. NaNs sort last."""
    x = flat.detach().numpy()
    size = x.size
    if size > _SMALL:
        sample = x[::_SAMPLE_STRIDE]
        q = k / size
        half = 4.0 * math.sqrt(sample.size * q * (1.0 - q)) + 2.0
        lo_at = max(0, math.floor(q * sample.size - half))
        hi_at = min(sample.size - 1, math.ceil(q * sample.size + half))
        edges = np.partition(sample, (lo_at, hi_at))
        # At the sample's ends the bracket is open: the k-th may lie beyond every sampled value.
        lo = -np.inf if lo_at == 0 else edges[lo_at]
        hi = np.inf if hi_at == sample.size - 1 else edges[hi_at]
        below = int(np.count_nonzero(x < lo))
        inside = x[(x >= lo) & (x <= hi)]
        at = k - 1 - below
        if 0 <= at < inside.size:
            return torch.from_numpy(np.partition(inside, at)[at : at + 1]).reshape(())
    return torch.from_numpy(np.partition(x, k - 1)[k - 1 : k].copy()).reshape(())


# ------------------------------------------------------------------------------------------------
# Statistics
# ------------------------------------------------------------------------------------------------


def batch_statistics(batch: LossBatch) -> dict[str, torch.Tensor]:
    """The mode-independent diagnostics of a batch (cached on it: computed once for every mode)."""
    return batch._cached("metrics", lambda: _batch_statistics(batch))


def _batch_statistics(batch: LossBatch) -> dict[str, torch.Tensor]:
    m = batch.mask
    n_sum = _total(m)
    rows = batch.response_length
    buffer = batch.log_prefix_ratio.abs()  # one [B, T] temporary, reused below
    sums = [
        _dot(buffer, m),
        _dot(buffer.div_(batch.token_count), m),
        _total(torch.abs(batch.log_ratio, out=buffer)),
    ]  # log_ratio is 0 off the mask
    # r_t m_t: the importance ratio on valid tokens, 0 elsewhere (below every valid ratio or tied
    # with an underflowed one, so order statistics over it count masked tokens first).
    ratio = exp_by_exp2(batch.log_ratio).mul_(m)
    sums += [_total(ratio), n_sum, (rows == 0).sum()]
    *sums, n, empty = torch.stack(sums).to(torch.float64).unbind()  # one conversion for all of them
    out = {"valid_tokens": n, "empty_responses": empty}
    out.update(
        zip(("abs_L_mean", "abs_z_mean", "logprob_abs_diff", "ratio_mean"), _frac(torch.stack(sums), n).unbind())
    )
    numel = ratio.numel()
    if numel == 0:
        out["ratio_max"] = out["ratio_p95"] = torch.zeros((), dtype=torch.float64, device=m.device)
        return out
    # Ratio max and nearest-rank 95th percentile of the valid ratios (the masked zeros come
    # first). With no valid token both are 0.
    out["ratio_max"] = ratio.max().to(torch.float64)
    out["ratio_p95"] = kth_smallest(ratio, _p95_rank(n, numel)).to(torch.float64)
    return out


def _p95_rank(n: torch.Tensor, numel: int) -> torch.Tensor:
    """1-based rank of the nearest-rank 95th percentile of n valid values among numel, the
    numel - n masked ones first: numel - n + max(ceil(0.95 n), 1), at most numel."""
    rank = (numel - n.to(torch.int64)) + torch.ceil(0.95 * n).to(torch.int64).clamp_(min=1)
    return rank.clamp_(max=numel)


def _position_metrics(batch: LossBatch, clipped: torch.Tensor) -> dict[str, torch.Tensor]:
    """Clip fraction per relative-position bin and its spread (``clipped``: 0/1 floats, 0 off the mask).

    A response's t-th valid token (of n) is in bin floor(10 (t - 1) / n), so ceil(j n / 10) of
    its tokens lie below bin j (exact in float64: j n is an integer, and j n / 10 is either an
    integer or at least 0.1 away from one). The clipped tokens below bin j are then the running
    clip count C at the last position whose valid-token count is <= ceil(j n / 10): one prefix
    sum of ``clipped`` and a [B, 11] searchsorted in the (non-decreasing) valid-token counts. No
    per-token bin and no histogram: fixed shapes, the same code on every device."""
    j = torch.arange(POSITION_BINS + 1, dtype=torch.float64, device=clipped.device)
    edges = torch.ceil(torch.outer(batch.response_length, j).div_(POSITION_BINS))  # [B, 11]
    # running[:, p] = clipped tokens before position p (running[:, 0] = 0). The positions whose
    # valid-token count is <= e number searchsorted(right) of them, so running at that index is the
    # clip count below the edge; edge 0 reads the leading 0. token_count is clamped to >= 1, but
    # the clip count before a row's first valid token is 0 anyway, so edge 1 still lands right.
    rows, positions = clipped.shape
    running = torch.empty(rows, positions + 1, dtype=clipped.dtype, device=clipped.device)
    running[:, 0] = 0.0
    torch.cumsum(clipped, dim=-1, out=running[:, 1:])
    at = torch.searchsorted(batch.token_count, edges.to(batch.token_count.dtype), right=True)
    below = torch.gather(running, 1, at).to(torch.float64)  # [B, 11]
    clipped_per_bin = (below[:, 1:] - below[:, :-1]).sum(dim=0)
    tokens_per_bin = (edges[:, 1:] - edges[:, :-1]).sum(dim=0)
    bin_frac = _frac(clipped_per_bin, tokens_per_bin)
    out = {f"clipfrac_position_bin_{i}": f for i, f in enumerate(bin_frac.unbind())}
    occupied = (tokens_per_bin > 0).to(torch.float64)
    n_occupied = occupied.sum().clamp(min=1.0)
    bin_mean = (bin_frac * occupied).sum() / n_occupied
    bin_std = torch.sqrt((torch.square(bin_frac - bin_mean) * occupied).sum() / n_occupied)
    out["clipfrac_position_cv"] = torch.where(bin_mean > 0, bin_std / bin_mean.clamp(min=1e-300), 0.0)
    return out


PREFIX_POSITIONS = (50, 90)  # |L_t| read at these percent of each response's valid tokens


def _prefix_at_positions(batch: LossBatch) -> dict[str, torch.Tensor]:
    """Mean over non-empty responses of |L_t| at the ceil(q n)-th valid token (q = 50%, 90%): how far
    the cumulative prefix log-ratio has drifted by the middle and near the end of a response.
    Fixed shapes: a searchsorted of the [B, 2] ranks in the running valid-token count."""
    m = batch.mask
    n = batch.response_length  # float64 [B]
    # scalar products, not a torch.tensor of the quantiles: that would be a host-to-device copy per call
    rank = torch.ceil(torch.stack([n * (p / 100) for p in PREFIX_POSITIONS], dim=-1)).clamp_(min=1.0)  # [B, 2], 1-based
    running = torch.cumsum(m, dim=-1)  # unclamped: 0 before the first valid token
    at = torch.searchsorted(running.contiguous(), rank.to(running.dtype), right=False)
    at = at.clamp_(max=max(m.shape[-1] - 1, 0))
    if m.shape[-1] == 0:
        zero = torch.zeros((), dtype=torch.float64, device=m.device)
        return {f"abs_L_p{p}_position": zero for p in PREFIX_POSITIONS}
    drift = torch.gather(batch.log_prefix_ratio, 1, at).abs().to(torch.float64)  # [B, 2]
    has = (n > 0).to(torch.float64)
    means = _frac(has @ drift, has.sum())
    return {f"abs_L_p{p}_position": v for p, v in zip(PREFIX_POSITIONS, means.unbind())}


def _removed_gradient_sums(batch: LossBatch, terms: TokenTerms) -> tuple[torch.Tensor, torch.Tensor]:
    """(removed, total) of the share of the gradient weight the bound removed: per valid token the
    unbounded weight |A_t| e^{X_t} of the mode's clipped quantity X_t (`log_value`; e^X capped as in
    `safe_exp`), and what the mode kept of it, max(|A_t| e^{X_t} - |coef_t|, 0). Masking and
    clipping remove all of it, CISPO's truncated weight the part above the bound. A mode without a
    clipped quantity (log_value None) reports 0."""
    m = batch.mask
    if terms.log_value is None:
        zero = torch.zeros((), dtype=m.dtype, device=m.device)
        return zero, zero
    unbounded = batch.advantages.abs().to(m.dtype) * safe_exp(terms.log_value).to(m.dtype)
    removed = (unbounded - terms.coef.abs().to(m.dtype)).clamp_(min=0.0)
    return _dot(removed, m), _dot(unbounded, m)


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
            count = has * n
            total = torch.where(has, scalar, 0.0) * n
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
    """sum(a * b) without a [B, T] temporary, exact for 0/1 terms (as `_total`)."""
    if a.dtype == torch.float32 and a.numel() >= _EXACT_FLOAT32_COUNT:
        return torch.dot(a.reshape(-1).double(), b.reshape(-1).double())
    return torch.dot(a.reshape(-1), b.reshape(-1))


def policy_loss_metrics(
    batch: LossBatch, terms: TokenTerms, clipped: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
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
        "clipfrac_upper": (_total(as_float(terms.clipped_upper & batch.valid, m.dtype)), n),
        "clipfrac_lower": (_total(as_float(terms.clipped_lower & batch.valid, m.dtype)), n),
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
    # the sums are in the compute dtype, n in float64: stack widens them all to float64 at once
    numerators, denominators = (torch.stack([f[i] for f in fractions.values()]) for i in (0, 1))
    metrics.update(zip(fractions, _frac(numerators, denominators).unbind()))
    if terms.log_value is None:
        metrics["value_capped_frac"] = torch.zeros((), dtype=torch.float64, device=m.device)

    metrics.update(_position_metrics(batch, clipped_f))
    metrics.update(_prefix_at_positions(batch))
    removed, total = (x.to(torch.float64) for x in _removed_gradient_sums(batch, terms))
    metrics["grad_removed_frac"] = torch.where(total > 0, removed / total.clamp(min=1e-300), 0.0)
    for name in ("abs_L_mean", "abs_z_mean", "logprob_abs_diff", "ratio_mean", "ratio_max", "ratio_p95"):
        metrics[name] = stats[name]
    for key, value in terms.extra_metrics.items():
        metrics[key] = value
    return metrics
