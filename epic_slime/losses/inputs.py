"""Loss inputs: checking, casting and masking what a caller passes, into one `LossBatch`.

`prepare_batch` is the one gate between a caller's tensors and the loss modes (it is called by
`compute_policy_loss`): shapes, dtypes, masks, NaN / inf / positive log-probs on valid tokens,
the bad-token policy (``on_bad_tokens``), and the optional Top-K inputs (see topk.py for their
layout and how to build them). Modes then read only the validated, detached `LossBatch`.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .core import PolicyLossInputError, as_float, exp_by_exp2, select, select_bits


# Log-probabilities above this are not log-probabilities (bfloat16 rounding stays far below).
_MAX_LOG_PROB = 1e-3

# What a bad valid token (NaN/inf log-prob or advantage, log-prob > _MAX_LOG_PROB) does:
# "raise" a PolicyLossInputError, or "skip": mask it out of the loss, count it (`bad_tokens`), and
# raise only when more than `max_bad_token_frac` of the call's valid tokens are bad.
ON_BAD_TOKENS = ("raise", "skip")
DEFAULT_MAX_BAD_TOKEN_FRAC = 0.01

# A set whose probabilities sum beyond 1 by more than this holds a duplicate (or is not a set of
# log-probabilities). Loose for 16-bit inputs, whose log-probs carry ~0.4% relative rounding.
_MASS_TOLERANCE = {torch.float16: 0.05, torch.bfloat16: 0.05}
_DEFAULT_MASS_TOLERANCE = 1e-3
# The sampled token counts as "in the set" when one kept column's log mu is this close to its log mu.
_SAMPLED_LOG_PROB_TOLERANCE = 1e-2


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
        # Summed in the mask's dtype (exact: float32 counts to 2^24), then widened: a float64
        # accumulation of float32 is not vectorised on the CPU (10x slower).
        return self._cached("response_length", lambda: self.mask.sum(dim=-1).to(torch.float64))


# --------------------------------------------------------------------------------------------
# Validation of the [B, T] inputs
# --------------------------------------------------------------------------------------------


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _first_bad(bad: torch.Tensor) -> str:
    index = tuple(int(i) for i in torch.nonzero(bad)[0])
    return f"at index {index}"


def prepare_batch(
    log_probs,
    behavior_log_probs,
    advantages,
    mask,
    *,
    validate: bool = True,
    behavior_topk_log_probs=None,
    current_topk_log_probs=None,
    topk_mask=None,
    on_bad_tokens: str = "raise",
    max_bad_token_frac: float = DEFAULT_MAX_BAD_TOKEN_FRAC,
) -> LossBatch:
    """Check shapes, dtypes and values; return detached compute-dtype tensors zeroed off the mask.

    Raises PolicyLossInputError naming the field for: wrong types or shapes, masks outside {0, 1},
    NaN / inf log-probs or advantages on valid tokens, log-probs > 0. (Values on masked tokens are
    ignored, NaN included.) ``validate=False`` skips the value checks, which need one host sync.
    ``on_bad_tokens="skip"`` masks bad valid tokens out instead (``LossBatch.bad``), and raises only
    when more than ``max_bad_token_frac`` of the valid tokens are bad (the value checks then always run).
    The optional Top-K inputs are checked the same way (see `_prepare_topk_inputs`).
    """
    for name, value in (
        ("log_probs", log_probs),
        ("behavior_log_probs", behavior_log_probs),
        ("advantages", advantages),
        ("mask", mask),
    ):
        if not torch.is_tensor(value):
            raise PolicyLossInputError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if log_probs.dim() != 2:
        raise PolicyLossInputError(f"log_probs must be [B, T], got shape {tuple(log_probs.shape)}")
    shape = log_probs.shape
    if not log_probs.is_floating_point():
        raise PolicyLossInputError(f"log_probs must be floating point, got dtype {log_probs.dtype}")
    if behavior_log_probs.shape != shape:
        raise PolicyLossInputError(
            f"behavior_log_probs shape {tuple(behavior_log_probs.shape)} != log_probs shape {tuple(shape)}"
        )
    if not behavior_log_probs.is_floating_point():
        raise PolicyLossInputError(f"behavior_log_probs must be floating point, got dtype {behavior_log_probs.dtype}")
    if mask.shape != shape:
        raise PolicyLossInputError(f"mask shape {tuple(mask.shape)} != log_probs shape {tuple(shape)}")
    if advantages.shape == shape[:1]:
        advantages = advantages.unsqueeze(-1).expand(shape)
    elif advantages.shape != shape:
        raise PolicyLossInputError(
            f"advantages shape {tuple(advantages.shape)} must be [B, T] = {tuple(shape)} or [B] = ({shape[0]},)"
        )

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
                raise PolicyLossInputError(f"mask must be bool or 0/1, got value {bad_value} {_first_bad(outside)}")
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
            torch.maximum(lp_range[1], blp_range[1]) <= _MAX_LOG_PROB
        )
        if not bool(ok):  # find the field, value and index for the message (the same checks per token)
            for name, tensor, bad, what in _value_checks(*raw, valid):
                if bool(bad.any()):
                    raise PolicyLossInputError(
                        f"{name} has a {what} value {float(tensor[bad][0])} on a valid token {_first_bad(bad)}"
                    )
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
        (batch.behavior_topk_log_probs, batch.current_topk_log_probs, batch.topk_mask) = _prepare_topk_inputs(
            behavior_topk_log_probs,
            current_topk_log_probs,
            topk_mask,
            valid,
            dtype,
            validate=validate,
            behavior_log_probs=behavior_log_probs,
        )
    return batch


def bad_log_probs(log_probs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[same shape] bool: the valid tokens whose log-prob is no log-prob (non-finite, or > the
    bound above): the rule ``prepare_batch`` applies to its log-prob inputs, for inputs it does not
    see (the TIS weights' rollout log-probs)."""
    return (~torch.isfinite(log_probs) | (log_probs > _MAX_LOG_PROB)) & valid.bool()


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
        first = next(
            (
                f"{name} has a {what} value {float(t[b][0])} {_first_bad(b)}"
                for name, t, b, what in checks
                if bool(b.any())
            ),
            "",
        )
        raise PolicyLossInputError(
            f"{n_bad} of {n_valid} valid tokens ({n_bad / max(n_valid, 1):.2%}) are bad (non-finite or positive "
            f"log-probs, non-finite advantages), more than max_bad_token_frac={max_frac}; first: {first}"
        )
    return bad, valid & ~bad


# --------------------------------------------------------------------------------------------
# Validation of the Top-K inputs (called by prepare_batch)
# --------------------------------------------------------------------------------------------


def _prepare_topk_inputs(
    behavior_topk_log_probs,
    current_topk_log_probs,
    topk_mask,
    valid: torch.Tensor,
    dtype: torch.dtype,
    *,
    validate: bool = True,
    behavior_log_probs: torch.Tensor | None = None,
):
    """Check the Top-K inputs; return (behavior, current, mask): detached ``dtype`` tensors, -inf
    where the returned mask [B, T, K] (``topk_mask`` and the token mask ``valid``) is False.

    Raises PolicyLossInputError naming the field: one of the two log-prob tensors without the other,
    non-tensors, shapes other than [B, T, K] with [B, T] = the token mask's, a non-bool topk_mask,
    and (``validate``) NaN, +inf or positive log-probs on a used entry (-inf, a probability of 0, is
    allowed), a set whose probabilities sum
    beyond 1 (duplicate ids), and a position whose set lacks the sampled token (no used column with
    log mu within 1e-2 of ``behavior_log_probs``).
    """
    if behavior_topk_log_probs is None or current_topk_log_probs is None:
        missing = "behavior_topk_log_probs" if behavior_topk_log_probs is None else "current_topk_log_probs"
        raise PolicyLossInputError(
            f"{missing} is missing: the Top-K inputs are behavior_topk_log_probs and current_topk_log_probs "
            f"(both [B, T, K]) and optionally topk_mask; pass both log-prob tensors or none"
        )
    fields = (("behavior_topk_log_probs", behavior_topk_log_probs), ("current_topk_log_probs", current_topk_log_probs))
    for name, value in fields + (("topk_mask", topk_mask),):
        if value is not None and not torch.is_tensor(value):
            raise PolicyLossInputError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    shape = behavior_topk_log_probs.shape
    if behavior_topk_log_probs.dim() != 3 or shape[:2] != valid.shape or shape[2] < 1:
        raise PolicyLossInputError(
            f"behavior_topk_log_probs must be [B, T, K] with [B, T] = "
            f"{tuple(valid.shape)} and K >= 1, got shape {tuple(shape)}"
        )
    for name, value in fields:
        if not value.is_floating_point():
            raise PolicyLossInputError(f"{name} must be floating point, got dtype {value.dtype}")
    if current_topk_log_probs.shape != shape:
        raise PolicyLossInputError(
            f"current_topk_log_probs shape {tuple(current_topk_log_probs.shape)} != "
            f"behavior_topk_log_probs shape {tuple(shape)}"
        )
    if topk_mask is None:
        topk_mask = torch.ones(shape, dtype=torch.bool, device=valid.device)
    elif topk_mask.shape != shape or topk_mask.dtype != torch.bool:
        raise PolicyLossInputError(
            f"topk_mask must be a bool tensor of shape {tuple(shape)}, got {topk_mask.dtype} {tuple(topk_mask.shape)}"
        )
    used = topk_mask & valid.unsqueeze(-1)
    # -inf off the set: exp gives 0 there, so sums over the set need no mask.
    behavior = torch.where(used, behavior_topk_log_probs.detach().to(dtype), -math.inf)
    current = torch.where(used, current_topk_log_probs.detach().to(dtype), -math.inf)
    if validate and used.numel():
        _validate_topk_values(
            behavior,
            current,
            used,
            valid,
            behavior_topk_log_probs.dtype,
            None if behavior_log_probs is None else behavior_log_probs.detach().to(dtype),
        )
    return behavior, current, used


def _validate_topk_values(behavior, current, used, valid, input_dtype, behavior_log_probs) -> None:
    """The value checks of `_prepare_topk_inputs` on the stored tensors (-inf off the set; -inf on
    the set is a probability of 0, allowed): a handful of passes and reductions, one host sync;
    the messages are built only on failure."""
    tolerance = _MASS_TOLERANCE.get(input_dtype, _DEFAULT_MASS_TOLERANCE)
    named = (("behavior_topk_log_probs", behavior), ("current_topk_log_probs", current))
    # amax propagates NaN: one reduction catches NaN, +inf and positive log-probs.
    flags = [~(t.amax() <= _MAX_LOG_PROB) for _, t in named]
    # Probability mass of the set (float32 sums of a few hundred terms: error ~1e-6 << tolerance).
    mass = [exp_by_exp2(t).sum(-1) for _, t in named]
    flags += [(m > 1.0 + tolerance).any() for m in mass]
    nearest = None
    if behavior_log_probs is not None:
        nearest = (behavior - behavior_log_probs.unsqueeze(-1)).abs_().amin(dim=-1)  # inf off the set
        flags.append(((nearest > _SAMPLED_LOG_PROB_TOLERANCE) & valid).any())
    flags = torch.stack(flags).tolist()  # the one host sync
    if not any(flags):
        return
    for (name, tensor), flag in zip(named, flags[:2]):
        if flag:
            bad = used & ~(tensor <= _MAX_LOG_PROB)
            first = tensor[bad][0]
            what = "non-finite" if not bool(torch.isfinite(first)) else "positive"
            raise PolicyLossInputError(f"{name} has a {what} value {float(first)} on a valid token {_first_bad(bad)}")
    for (name, _), total, flag in zip(named, mass, flags[2:4]):
        if flag:
            bad = total > 1.0 + tolerance
            raise PolicyLossInputError(
                f"{name} has probabilities summing beyond 1 (duplicate ids? mask them with topk_mask): "
                f"{float(total[bad][0])} on a valid token {_first_bad(bad)}"
            )
    bad = (nearest > _SAMPLED_LOG_PROB_TOLERANCE) & valid
    raise PolicyLossInputError(
        "behavior_topk_log_probs lacks the sampled token (append it: topk.append_sampled_token); nearest "
        f"log mu gap {float(nearest[bad][0])} on a valid token {_first_bad(bad)}"
    )
