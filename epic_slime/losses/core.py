"""Shared machinery of the policy losses: inputs, registry, clipping, aggregation.

Every loss mode is one pure function ``fn(batch: LossBatch, **params) -> TokenTerms`` over plain
tensors. A mode never builds an autograd graph itself: it returns, per token, the detached value
of the objective S_t and the detached coefficient dS_t / dlog pi_t. `compute_policy_loss` links
the two with the straight-through identity

    S_t = value_t + coef_t * (log pi_t - sg(log pi_t)),

so that the gradient of every mode flows only through each token's own log pi_t (what EPIC, CTPO
and GSPO-token specify, and what the plain token-ratio modes have anyway: d r_t / d log pi_t = r_t).
This keeps memory to one saved tensor and lets the slime adapter rebuild full responses across
context-parallel ranks from detached pieces.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from typing import Callable, Mapping

import torch

AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum")

# Log-probabilities above this are not log-probabilities (bfloat16 rounding stays far below).
_MAX_LOG_PROB = 1e-3

# What a bad valid token (NaN/inf log-prob or advantage, log-prob > _MAX_LOG_PROB) does:
# "raise" a PolicyLossInputError, or "skip": mask it out of the loss, count it (`bad_tokens`), and
# raise only when more than `max_bad_token_frac` of the call's valid tokens are bad.
ON_BAD_TOKENS = ("raise", "skip")
DEFAULT_MAX_BAD_TOKEN_FRAC = 0.01


# --------------------------------------------------------------------------------------------
# Masked selects through the bit patterns
# --------------------------------------------------------------------------------------------
# torch.where / masked_fill with a bool condition and float comparisons into bool run without
# SIMD on the CPU (about 30x an add: 0.4 ms for 128k float32 elements); an AND of the bit
# patterns with an all-ones / all-zeros mask is exactly the same select at the cost of an add,
# keeps NaN / inf on the kept elements, and is one fused elementwise kernel on accelerators.

_INT_OF = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
           torch.bfloat16: torch.int16}


def select_bits(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The select mask of bool ``keep`` for float ``dtype``: all ones where keep, 0 elsewhere."""
    return keep.to(_INT_OF[dtype]).neg_()


def as_float(flags: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool -> 0/1 floats through uint8 (the vectorised cast; bool -> float directly is ~6x slower)."""
    return flags.view(torch.uint8).to(dtype)


def _bits_of(x, like: torch.Tensor):
    """x's bit pattern as the integer type of like's dtype (a tensor view, or a Python int)."""
    if torch.is_tensor(x):
        return x.view(_INT_OF[x.dtype])
    return _scalar_bits(float(x), like.dtype)


@functools.lru_cache(maxsize=256)
def _scalar_bits(x: float, dtype: torch.dtype) -> int:
    return int(torch.tensor(x, dtype=dtype).view(_INT_OF[dtype]))  # a CPU scalar: no device involved


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
class LossBatch:
    """Validated, padded [B, T] inputs of a loss mode, plus prefix statistics computed once.

    ``log_probs``/``behavior_log_probs``/``advantages`` are detached, in the compute dtype
    (float32 for float32/bfloat16 inputs, float64 for float64), and zero on masked tokens.
    Prefix sums are accumulated in float64 (16k-token sums must not lose precision) and then
    stored in the compute dtype.
    """

    log_probs: torch.Tensor
    behavior_log_probs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor  # compute dtype, 0/1
    valid: torch.Tensor  # bool
    # Optional Top-K inputs (see epic_slime/losses/topk.py): [B, T, K], detached, compute dtype,
    # -inf where ``topk_mask`` is False; topk_mask is False on ignored columns and invalid tokens.
    behavior_topk_log_probs: torch.Tensor | None = None
    current_topk_log_probs: torch.Tensor | None = None
    topk_mask: torch.Tensor | None = None
    # on_bad_tokens="skip": [B, T] bool, the valid tokens that were bad and are masked out of `valid`
    bad: torch.Tensor | None = None
    _prefix: dict = dataclasses.field(default_factory=dict, repr=False)

    def _cached(self, name, compute):
        if name not in self._prefix:
            self._prefix[name] = compute()
        return self._prefix[name]

    @property
    def keep_bits(self) -> torch.Tensor:
        """`select_bits(valid)`: the mask for bit-exact selects on the valid tokens (see `select`)."""
        return self._cached("keep_bits", lambda: select_bits(self.valid, self.mask.dtype))

    def _prefix_sum(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=-1, dtype=torch.float64).to(self.mask.dtype)

    @property
    def log_ratio(self) -> torch.Tensor:
        """lam_t = m_t (log pi_t - log mu_t)."""
        return self._cached("log_ratio", lambda: (self.log_probs - self.behavior_log_probs) * self.mask)

    @property
    def token_count(self) -> torch.Tensor:
        """t = sum_{k<=t} m_k, clamped >= 1."""
        # Integer counts are exact in float32 up to 2^24 tokens per response: no float64 needed.
        return self._cached("token_count", lambda: torch.cumsum(self.mask, dim=-1).clamp_(min=1.0))

    @property
    def inv_token_count(self) -> torch.Tensor:
        """1 / t."""
        return self._cached("inv_token_count", lambda: torch.reciprocal(self.token_count))

    @property
    def log_prefix_ratio(self) -> torch.Tensor:
        """L_t = sum_{k<=t} lam_k."""
        return self._cached("log_prefix_ratio", lambda: self._prefix_sum(self.log_ratio))

    @property
    def log_behavior_prefix(self) -> torch.Tensor:
        """M_t = sum_{k<=t} m_k log mu_k (never exponentiated)."""
        return self._cached("log_behavior_prefix", lambda: self._prefix_sum(self.behavior_log_probs))

    @property
    def response_length(self) -> torch.Tensor:
        """Number of valid tokens per response, [B] (float64, may be 0)."""
        return self.mask.sum(dim=-1, dtype=torch.float64)


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


def register_loss(name: str, *, checks: Mapping[str, ParamCheck], aggregation: str = "seq-mean-token-mean",
                  flag_prefix: str | None = None, needs_topk: bool = False):
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
            f"mode {mode!r} has no parameter(s) {unknown}; its parameters are {sorted(spec.defaults)}")
    resolved = {**spec.defaults, **params}
    for key, value in resolved.items():
        problem = spec.checks[key](value)
        if problem is not None:
            raise PolicyLossInputError(f"mode {mode!r}: {key}={value!r} must be {problem}")
    return resolved


# --------------------------------------------------------------------------------------------
# The shared clipping helper and the straight-through link
# --------------------------------------------------------------------------------------------

def sign_aware_clip(log_value: torch.Tensor, advantages: torch.Tensor, *, upper_pos: torch.Tensor | float,
                    lower_neg: torch.Tensor | float, upper_neg: torch.Tensor | float) -> TokenTerms:
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
    q = _safe_exp(clipped_x)
    value = advantages * q
    coef = value * inside  # value is finite (capped exponent), so a multiply is a safe select
    # Report the mode's bounds whatever the token's sign (what "mean bounds" and "finite lower
    # bound fraction" describe), not the sign-selected ones used above.
    return TokenTerms(value=value, coef=coef, clipped_upper=clipped_upper, clipped_lower=clipped_lower,
                      log_lower=torch.broadcast_to(_as_tensor(lower_neg, log_value), log_value.shape),
                      log_upper=torch.broadcast_to(_as_tensor(upper_pos, log_value), log_value.shape),
                      log_value=log_value)


def _as_tensor(x, like: torch.Tensor) -> torch.Tensor:
    # torch.full fills on the device; torch.tensor(x, device=cuda) copies from pageable host
    # memory, which is a host sync (and breaks CUDA-graph capture).
    return x if torch.is_tensor(x) else torch.full((), float(x), dtype=like.dtype, device=like.device)


def _safe_exp(x: torch.Tensor) -> torch.Tensor:
    """exp with the argument capped at half the dtype's overflow point (counted in metrics)."""
    return torch.exp(torch.clamp(x, max=_max_log(x.dtype)))


def _max_log(dtype: torch.dtype) -> float:
    """Largest exponent a value may carry: e^44 in float32, e^354 in float64.

    Half the overflow point, so that A * e^X summed over a batch stays finite even for
    advantages of 1e6. Only reachable by importance ratios beyond 1e19 (float32), i.e. samples
    from an unrelated policy; such tokens are counted as `value_capped_frac`."""
    return 0.5 * math.log(torch.finfo(dtype).max)


def reinforce_terms(weight: torch.Tensor, log_probs: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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


# --------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------

def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _first_bad(bad: torch.Tensor) -> str:
    index = tuple(int(i) for i in torch.nonzero(bad)[0])
    return f"at index {index}"


def prepare_batch(log_probs, behavior_log_probs, advantages, mask, *, validate: bool = True,
                  behavior_topk_log_probs=None, current_topk_log_probs=None, topk_mask=None,
                  on_bad_tokens: str = "raise", max_bad_token_frac: float = DEFAULT_MAX_BAD_TOKEN_FRAC) -> LossBatch:
    """Check shapes, dtypes and values; return detached compute-dtype tensors zeroed off the mask.

    Raises PolicyLossInputError naming the field for: wrong types or shapes, masks outside {0, 1},
    NaN / inf log-probs or advantages on valid tokens, log-probs > 0. (Values on masked tokens are
    ignored, NaN included.) ``validate=False`` skips the value checks, which need one host sync.
    ``on_bad_tokens="skip"`` masks bad valid tokens out instead (``LossBatch.bad``), and raises only
    when more than ``max_bad_token_frac`` of the valid tokens are bad (the value checks then always run).
    The optional Top-K inputs are checked the same way (see `topk.prepare_topk_inputs`).
    """
    for name, value in (("log_probs", log_probs), ("behavior_log_probs", behavior_log_probs),
                        ("advantages", advantages), ("mask", mask)):
        if not torch.is_tensor(value):
            raise PolicyLossInputError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if log_probs.dim() != 2:
        raise PolicyLossInputError(f"log_probs must be [B, T], got shape {tuple(log_probs.shape)}")
    shape = log_probs.shape
    if not log_probs.is_floating_point():
        raise PolicyLossInputError(f"log_probs must be floating point, got dtype {log_probs.dtype}")
    if behavior_log_probs.shape != shape:
        raise PolicyLossInputError(
            f"behavior_log_probs shape {tuple(behavior_log_probs.shape)} != log_probs shape {tuple(shape)}")
    if not behavior_log_probs.is_floating_point():
        raise PolicyLossInputError(f"behavior_log_probs must be floating point, got dtype {behavior_log_probs.dtype}")
    if mask.shape != shape:
        raise PolicyLossInputError(f"mask shape {tuple(mask.shape)} != log_probs shape {tuple(shape)}")
    if advantages.shape == shape[:1]:
        advantages = advantages.unsqueeze(-1).expand(shape)
    elif advantages.shape != shape:
        raise PolicyLossInputError(
            f"advantages shape {tuple(advantages.shape)} must be [B, T] = {tuple(shape)} or [B] = ({shape[0]},)")

    if on_bad_tokens not in ON_BAD_TOKENS:
        raise PolicyLossInputError(f"on_bad_tokens={on_bad_tokens!r} is not one of {ON_BAD_TOKENS}")
    if not (isinstance(max_bad_token_frac, (int, float)) and 0 <= max_bad_token_frac <= 1):
        raise PolicyLossInputError(f"max_bad_token_frac={max_bad_token_frac!r} must be a number in [0, 1]")
    skip = on_bad_tokens == "skip"
    validate = validate or skip
    dtype = _compute_dtype(log_probs.dtype)
    if mask.dtype == torch.bool:
        valid = mask
    else:
        if validate and mask.numel():
            outside = (mask != 0) & (mask != 1)
            if bool(outside.any()):
                bad_value = float(mask[outside][0])
                raise PolicyLossInputError(
                    f"mask must be bool or 0/1, got value {bad_value} {_first_bad(outside)}")
        valid = mask != 0
    m = as_float(valid, dtype)
    keep = select_bits(valid, dtype)
    raw = [x.detach().to(dtype) for x in (log_probs, behavior_log_probs, advantages)]
    zeroed = [select(keep, x, 0.0, m) for x in raw]
    bad_tokens = None
    if validate and valid.numel():
        if skip:
            bad_tokens, valid = _mask_bad_tokens(_value_checks(*raw, valid), valid, max_bad_token_frac)
            m = as_float(valid, dtype)
            keep = select_bits(valid, dtype)
            zeroed = [select(keep, x, 0.0, m) for x in raw]
        # One pass per input over the zeroed compute-dtype copies (exact: float32 holds every
        # bfloat16 / float16 value, inf and NaN included; masked tokens are 0): min and max are
        # finite, the log-probs' max is <= _MAX_LOG_PROB. The only host sync of a validated call.
        lp_range, blp_range, adv_range = (torch.stack(torch.aminmax(x)) for x in zeroed)
        ok = torch.isfinite(torch.cat([lp_range, blp_range, adv_range])).all() & (
            torch.maximum(lp_range[1], blp_range[1]) <= _MAX_LOG_PROB)
        if not bool(ok):  # find the field, value and index for the message (the same checks per token)
            for name, tensor, bad, what in _value_checks(*raw, valid):
                if bool(bad.any()):
                    raise PolicyLossInputError(
                        f"{name} has a {what} value {float(tensor[bad][0])} on a valid token {_first_bad(bad)}")
            raise AssertionError("the range check and the per-token checks disagree")  # unreachable

    batch = LossBatch(
        log_probs=zeroed[0],
        behavior_log_probs=zeroed[1],
        advantages=zeroed[2],
        mask=m,
        valid=valid,
        bad=bad_tokens,
    )
    batch._prefix["keep_bits"] = keep
    if behavior_topk_log_probs is not None or current_topk_log_probs is not None or topk_mask is not None:
        from .topk import prepare_topk_inputs  # topk imports this module
        (batch.behavior_topk_log_probs, batch.current_topk_log_probs, batch.topk_mask) = prepare_topk_inputs(
            behavior_topk_log_probs, current_topk_log_probs, topk_mask, valid, dtype, validate=validate,
            behavior_log_probs=behavior_log_probs)
    return batch


def _value_checks(lp, blp, adv, valid):
    """(field, tensor, [B, T] bool bad-and-valid, what) for each per-token value check, on the
    compute-dtype inputs (not zeroed: padding may hold anything, hence `& valid`)."""
    return (
        ("log_probs", lp, ~torch.isfinite(lp) & valid, "non-finite"),
        ("behavior_log_probs", blp, ~torch.isfinite(blp) & valid, "non-finite"),
        ("advantages", adv, ~torch.isfinite(adv) & valid, "non-finite"),
        ("log_probs", lp, (lp > _MAX_LOG_PROB) & valid, "positive (probability > 1)"),
        ("behavior_log_probs", blp, (blp > _MAX_LOG_PROB) & valid, "positive (probability > 1)"),
    )


def _mask_bad_tokens(checks, valid: torch.Tensor, max_frac: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(bad, valid without them) for on_bad_tokens="skip"; raises when more than max_frac are bad."""
    bad = torch.zeros_like(valid)
    for _, _, is_bad, _ in checks:
        bad |= is_bad
    n_bad, n_valid = (int(x) for x in torch.stack([bad.sum(), valid.sum()]).tolist())  # one host sync
    if n_bad > max_frac * n_valid:
        first = next((f"{name} has a {what} value {float(t[b][0])} {_first_bad(b)}"
                      for name, t, b, what in checks if bool(b.any())), "")
        raise PolicyLossInputError(
            f"{n_bad} of {n_valid} valid tokens ({n_bad / max(n_valid, 1):.2%}) are bad (non-finite or positive "
            f"log-probs, non-finite advantages), more than max_bad_token_frac={max_frac}; first: {first}")
    return bad, valid & ~bad
