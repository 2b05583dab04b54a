"""Shared machinery of the policy losses: bit-exact selects, registry, clipping, aggregation.

Every loss mode is one pure function ``fn(batch: LossBatch, **params) -> TokenTerms`` over plain
tensors. A mode never builds an autograd graph itself: it returns, per token, the detached value
of the objective S_t and the detached coefficient dS_t / dlog pi_t. `compute_policy_loss` links
the two with the straight-through identity

    S_t = value_t + coef_t * (log pi_t - sg(log pi_t)),

so that the gradient of every mode flows only through each token's own log pi_t (what EPIC, CTPO
and GSPO-token specify, and what the plain token-ratio modes have anyway: d r_t / d log pi_t = r_t).
This keeps memory to one saved tensor and lets the slime adapter rebuild full responses across
context-parallel ranks from detached pieces. The inputs a mode reads (`LossBatch`) are checked and
built in inputs.py.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from typing import Callable, Mapping

import torch

AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum")


# --------------------------------------------------------------------------------------------
# Masked selects through the bit patterns
# --------------------------------------------------------------------------------------------
# torch.where / masked_fill with a bool condition and float comparisons into bool run without
# SIMD on the CPU (about 30x an add: 0.4 ms for 128k float32 elements); an AND of the bit
# patterns with an all-ones / all-zeros mask is exactly the same select at the cost of an add,
# keeps NaN / inf on the kept elements, and is one fused elementwise kernel on accelerators.

INT_DTYPE_OF = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def select_bits(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The select mask of bool ``keep`` for float ``dtype``: all ones where keep, 0 elsewhere."""
    return keep.to(INT_DTYPE_OF[dtype]).neg_()


def as_float(flags: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool -> 0/1 floats through uint8 (the vectorised cast; bool -> float directly is ~6x slower)."""
    return flags.view(torch.uint8).to(dtype)


def _bits_of(x, like: torch.Tensor):
    """x's bit pattern as the integer type of like's dtype (a tensor view, or a Python int)."""
    if torch.is_tensor(x):
        return x.view(INT_DTYPE_OF[x.dtype])
    return _scalar_bits(float(x), like.dtype)


@functools.lru_cache(maxsize=256)
def _scalar_bits(x: float, dtype: torch.dtype) -> int:
    return int(torch.tensor(x, dtype=dtype).view(INT_DTYPE_OF[dtype]))  # a CPU scalar: no device involved


def select(bits: torch.Tensor, a, b, like: torch.Tensor) -> torch.Tensor:
    """torch.where(keep, a, b) for a select mask ``bits = select_bits(keep, dtype)``, bit-exact.

    a, b: tensors of dtype like.dtype (broadcastable) or Python floats."""
    if isinstance(b, (int, float)) and float(b) == 0.0 and math.copysign(1.0, b) > 0:  # +0.0: one AND
        return torch.bitwise_and(_bits_of(a, like), bits).view(like.dtype)
    a_bits, b_bits = _bits_of(a, like), _bits_of(b, like)
    # ((a ^ b) & bits) ^ b: a where bits are all ones, b where they are 0.
    diff = torch.bitwise_xor(_as_int_tensor(a_bits, bits), b_bits)
    diff = diff.bitwise_and_(bits) if diff.shape == bits.shape else torch.bitwise_and(diff, bits)
    return diff.bitwise_xor_(b_bits).view(like.dtype)


def _as_int_tensor(x, like_bits: torch.Tensor) -> torch.Tensor:
    return x if torch.is_tensor(x) else torch.full((), x, dtype=like_bits.dtype, device=like_bits.device)


class PolicyLossInputError(ValueError):
    """Bad input to a policy loss: the message names the field and the offending value."""


@dataclasses.dataclass
class TokenTerms:
    """What a mode returns, all detached [B, T] tensors (masked tokens are ignored by the caller).

    value: S_t, the objective (maximised); coef: dS_t / dlog pi_t.
    clipped_upper / clipped_lower: bool, the token's gradient was removed by the upper / lower rule.
    log_lower / log_upper: the bounds in log space on the token's clipped quantity (for metrics;
    +-inf where a side is unbounded).
    """

    value: torch.Tensor
    coef: torch.Tensor
    clipped_upper: torch.Tensor
    clipped_lower: torch.Tensor
    log_lower: torch.Tensor
    log_upper: torch.Tensor
    log_value: torch.Tensor | None = None  # the clipped quantity X_t (log space), when there is one
    extra_metrics: dict = dataclasses.field(default_factory=dict)


# A parameter check returns None when the value is fine, else what the value must be.
ParamCheck = Callable[[object], "str | None"]


def positive(v) -> str | None:
    return None if isinstance(v, (int, float)) and v > 0 and math.isfinite(v) else "a finite number > 0"


def nonnegative(v) -> str | None:
    return None if isinstance(v, (int, float)) and v >= 0 and math.isfinite(v) else "a finite number >= 0"


def in_unit_interval(v) -> str | None:
    return None if isinstance(v, (int, float)) and 0 < v < 1 else "a number in (0, 1)"


def optional(check: ParamCheck) -> ParamCheck:
    return lambda v: None if v is None else check(v)


def greater_than_one(v) -> str | None:
    return None if isinstance(v, (int, float)) and v > 1 and math.isfinite(v) else "a finite number > 1"


def one_of(*choices) -> ParamCheck:
    return lambda v: None if v in choices else f"one of {choices}"


@dataclasses.dataclass(frozen=True)
class LossSpec:
    name: str
    fn: Callable[..., TokenTerms]
    defaults: Mapping[str, object]
    checks: Mapping[str, ParamCheck]
    aggregation: str
    flag_prefix: str  # CLI flags are --{flag_prefix}-{param}, shared by modes of one family
    doc: str
    needs_topk: bool = False  # needs the behaviour policy's top-K log-probs (see topk.py)


LOSS_MODES: dict[str, LossSpec] = {}


def register_loss(
    name: str,
    *,
    checks: Mapping[str, ParamCheck],
    aggregation: str = "seq-mean-token-mean",
    flag_prefix: str | None = None,
    needs_topk: bool = False,
):
    """Register ``fn(batch, *, param=default, ...)``; its keyword defaults are the mode's defaults.

    ``checks`` holds one check per parameter (every keyword parameter must have one).
    ``needs_topk``: the mode reads the optional Top-K inputs of the batch (see topk.py).
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation {aggregation!r} not in {AGGREGATIONS}")

    def decorate(fn):
        if name in LOSS_MODES:
            raise ValueError(f"loss mode {name!r} registered twice")
        params = inspect.signature(fn).parameters
        defaults = {k: p.default for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
        if set(defaults) != set(checks):
            raise ValueError(f"mode {name!r}: checks {sorted(checks)} != parameters {sorted(defaults)}")
        doc = (inspect.getdoc(fn) or "").split("\n")[0]
        prefix = flag_prefix or name.replace("_", "-")
        LOSS_MODES[name] = LossSpec(name, fn, defaults, dict(checks), aggregation, prefix, doc, needs_topk)
        return fn

    return decorate


def resolve_params(mode: str, params: Mapping[str, object]) -> dict:
    """The mode's defaults overridden by ``params``; unknown names and bad values raise."""
    if mode not in LOSS_MODES:
        raise PolicyLossInputError(f"mode={mode!r} is not a registered loss mode; choose one of {sorted(LOSS_MODES)}")
    spec = LOSS_MODES[mode]
    unknown = sorted(set(params) - set(spec.defaults))
    if unknown:
        raise PolicyLossInputError(
            f"mode {mode!r} has no parameter(s) {unknown}; its parameters are {sorted(spec.defaults)}"
        )
    resolved = {**spec.defaults, **params}
    for key, value in resolved.items():
        problem = spec.checks[key](value)
        if problem is not None:
            raise PolicyLossInputError(f"mode {mode!r}: {key}={value!r} must be {problem}")
    return resolved


# --------------------------------------------------------------------------------------------
# The shared clipping helper and the straight-through link
# --------------------------------------------------------------------------------------------


def sign_aware_clip(
    log_value: torch.Tensor,
    advantages: torch.Tensor,
    *,
    upper_pos: torch.Tensor | float,
    lower_neg: torch.Tensor | float,
    upper_neg: torch.Tensor | float,
) -> TokenTerms:
    """Clip q = exp(X) by the sign of the advantage, with the gradient of exp(X) d log pi_t inside.

    A >= 0: S = A min(q, e^{upper_pos});            gradient iff X < upper_pos.
    A <  0: S = A clip(q, e^{lower_neg}, e^{upper_neg}); gradient iff lower_neg < X < upper_neg.

    PPO is upper_pos = log(1 + eps_hi), lower_neg = log(1 - eps_lo), upper_neg = +inf (or log c
    with dual-clip); EPIC is upper_pos = upper_neg = hi_t, lower_neg = lo_t. exp(X) is only formed
    where the token is not clipped (X is capped elsewhere), so a huge |X| on a clipped token
    cannot overflow into the loss or its gradient.
    """
    negative = advantages < 0
    neg_bits = select_bits(negative, log_value.dtype)
    upper = upper_pos if upper_neg is upper_pos else select(neg_bits, upper_neg, upper_pos, log_value)
    lower = select(neg_bits, lower_neg, -math.inf, log_value)  # A >= 0: no lower bound
    upper, lower = _as_tensor(upper, log_value), _as_tensor(lower, log_value)
    clipped_upper = log_value >= upper
    clipped_lower = log_value <= lower
    inside = as_float((clipped_upper | clipped_lower).logical_not_(), log_value.dtype)
    clipped_x = torch.minimum(torch.maximum(log_value, lower), upper)
    q = safe_exp(clipped_x)
    value = advantages * q
    coef = value * inside  # value is finite (capped exponent), so a multiply is a safe select
    # Report the mode's bounds whatever the token's sign (what "mean bounds" and "finite lower
    # bound fraction" describe), not the sign-selected ones used above.
    return TokenTerms(
        value=value,
        coef=coef,
        clipped_upper=clipped_upper,
        clipped_lower=clipped_lower,
        log_lower=torch.broadcast_to(_as_tensor(lower_neg, log_value), log_value.shape),
        log_upper=torch.broadcast_to(_as_tensor(upper_pos, log_value), log_value.shape),
        log_value=log_value,
    )


def _as_tensor(x, like: torch.Tensor) -> torch.Tensor:
    # torch.full fills on the device; torch.tensor(x, device=cuda) copies from pageable host
    # memory, which is a host sync (and breaks CUDA-graph capture).
    return x if torch.is_tensor(x) else torch.full((), float(x), dtype=like.dtype, device=like.device)


def safe_exp(x: torch.Tensor) -> torch.Tensor:
    """exp with the argument capped at half the dtype's overflow point (counted in metrics)."""
    return torch.exp(torch.clamp(x, max=max_exponent(x.dtype)))


def exp_by_exp2(x: torch.Tensor) -> torch.Tensor:
    """e^x as 2^(x log2 e), a new tensor. For sums and diagnostics, not the loss itself: exp2 is
    vectorised on this CPU build and exp is not (4x), and the extra rounding of the product is
    2^-24 |x| relative (float32), far below what a mass check or a diagnostic resolves."""
    return torch.mul(x, _LOG2_E).exp2_()


_LOG2_E = 1.0 / math.log(2.0)


def max_exponent(dtype: torch.dtype) -> float:
    """Largest exponent a value may carry: e^44 in float32, e^354 in float64.

    Half the overflow point, so that A * e^X summed over a batch stays finite even for
    advantages of 1e6. Only reachable by importance ratios beyond 1e19 (float32), i.e. samples
    from an unrelated policy; such tokens are counted as `value_capped_frac`."""
    return 0.5 * math.log(torch.finfo(dtype).max)


def reinforce_terms(
    weight: torch.Tensor, log_probs: torch.Tensor, keep: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """S_t = sg(weight_t) * log pi_t on kept tokens (CISPO / DPPO style): (value, coef)."""
    coef = torch.where(keep, weight, 0.0)
    return coef * log_probs, coef


# --------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------


def aggregate_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, aggregation: str) -> torch.Tensor:
    """Reduce a [B, T] per-token loss (already zero on masked tokens) to a scalar.

    seq-mean-token-mean: mean over valid tokens of each response, then over non-empty responses.
    token-mean: sum over all valid tokens / their count.
    seq-mean-token-sum: sum over each response's valid tokens, then mean over non-empty responses.
    Empty responses (no valid token) take no part; with no valid token at all the loss is 0
    (still connected to the graph, so backward works and gives zero gradients).
    """
    if aggregation not in AGGREGATIONS:
        raise PolicyLossInputError(f"aggregation={aggregation!r} is not one of {AGGREGATIONS}")
    mask = mask.to(per_token_loss.dtype)
    if aggregation == "token-mean":
        return per_token_loss.sum() / mask.sum().clamp(min=1.0)
    tokens_per_row = mask.sum(dim=-1)
    row_sums = per_token_loss.sum(dim=-1)
    if aggregation == "seq-mean-token-mean":
        row_sums = row_sums / tokens_per_row.clamp(min=1.0)
    non_empty = (tokens_per_row > 0).to(per_token_loss.dtype)
    return (row_sums * non_empty).sum() / non_empty.sum().clamp(min=1.0)
