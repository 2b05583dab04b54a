"""`compute_policy_loss`: the one entry point every framework adapter calls."""

from __future__ import annotations

import dataclasses

import torch

from . import modes as _modes  # noqa: F401  (registers the modes)
from . import trust_region as _trust_region  # noqa: F401  (registers cppo, bandpo, acpo, dppo_topk_*)
from .core import LOSS_MODES, aggregate_loss, resolve_params
from .inputs import DEFAULT_MAX_BAD_TOKEN_FRAC, prepare_batch
from .metrics import policy_loss_metrics


class _StraightThroughLoss(torch.autograd.Function):
    """per_token_loss = -(value + coef * (log pi - sg(log pi))): forward -value, backward -coef.

    One saved tensor and one multiply in backward, instead of an autograd graph through a masked
    copy of log pi."""

    @staticmethod
    def forward(ctx, log_probs, value, coef):
        ctx.save_for_backward(coef)
        ctx.input_dtype = log_probs.dtype
        return value.neg()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (coef,) = ctx.saved_tensors
        return torch.mul(grad, coef).neg_().to(ctx.input_dtype), None, None


@dataclasses.dataclass
class PolicyLossOutput:
    """loss: scalar, differentiable w.r.t. log_probs. per_token_loss: [B, T] -S_t (0 off the mask),
    differentiable; its gradient reaches only the same token's log_probs entry. clipped: [B, T]
    bool. metrics: name -> 0-d tensor (see metrics.py)."""

    loss: torch.Tensor
    per_token_loss: torch.Tensor
    clipped: torch.Tensor
    metrics: dict[str, torch.Tensor]
    mode: str
    aggregation: str
    params: dict
    bad: torch.Tensor | None = None  # on_bad_tokens="skip": [B, T] bool, valid tokens masked out as bad


def compute_policy_loss(
    mode: str,
    log_probs: torch.Tensor,
    behavior_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    aggregation: str | None = None,
    compute_metrics: bool = True,
    validate: bool = True,
    behavior_topk_log_probs: torch.Tensor | None = None,
    current_topk_log_probs: torch.Tensor | None = None,
    topk_mask: torch.Tensor | None = None,
    on_bad_tokens: str = "raise",
    max_bad_token_frac: float = DEFAULT_MAX_BAD_TOKEN_FRAC,
    **params,
) -> PolicyLossOutput:
    """The policy loss of ``mode`` (a key of LOSS_MODES) on padded [B, T] tensors.

    log_probs: current policy log pi_t of the sampled tokens (carries the gradient).
    behavior_log_probs: the behaviour policy's log mu_t of the same tokens.
    advantages: [B, T] or [B] (broadcast over tokens). mask: bool or 0/1, True on generated tokens.
    aggregation: "seq-mean-token-mean" | "token-mean" | "seq-mean-token-sum" (default: the mode's).
    params: the mode's keyword parameters (defaults: LOSS_MODES[mode].defaults).

    Top-K inputs (required by the modes with ``LOSS_MODES[mode].needs_topk``, ignored by the others):
    behavior_topk_log_probs: [B, T, K] log mu of a set of K distinct token ids per position: mu's
        top-K ids plus the sampled token (it must be in the set; usually K = k + 1 columns, the
        last being the sampled token, masked out by topk_mask where it duplicates a top-k id).
    current_topk_log_probs: [B, T, K] log pi of the same ids (may carry grad; used detached).
    topk_mask: optional [B, T, K] bool, False on columns to ignore (duplicates, absent ids).
    `epic_slime.losses.topk.topk_inputs_from_logits` builds all three from full logits.

    on_bad_tokens: "raise" (default) raises PolicyLossInputError on a NaN/inf log-prob or advantage
    or a log-prob > 1e-3 on a valid token; "skip" masks such tokens out of the loss and its
    gradient, counts them in ``metrics["bad_tokens"]`` (``out.bad`` marks them) and raises only
    when more than ``max_bad_token_frac`` of the valid tokens are bad.

    Host synchronisation: with ``validate=False`` (and on_bad_tokens="raise") the call is
    sync-free on accelerators, metrics included: every metric is a 0-d tensor on the device,
    read only when the caller (slime) reduces it. Validation needs one sync (to raise); "skip"
    needs one more (to count the bad tokens). tests/losses/test_losses_sync_free.py checks this on the
    meta device.
    """
    resolved = resolve_params(mode, params)
    spec = LOSS_MODES[mode]
    aggregation = aggregation or spec.aggregation
    batch = prepare_batch(
        log_probs,
        behavior_log_probs,
        advantages,
        mask,
        validate=validate,
        behavior_topk_log_probs=behavior_topk_log_probs,
        current_topk_log_probs=current_topk_log_probs,
        topk_mask=topk_mask,
        on_bad_tokens=on_bad_tokens,
        max_bad_token_frac=max_bad_token_frac,
    )
    with torch.no_grad():
        terms = spec.fn(batch, **resolved)
        value = terms.value.to(batch.mask.dtype) * batch.mask
        coef = terms.coef.to(batch.mask.dtype) * batch.mask

    # Straight-through link: forward -S_t, gradient -coef_t d log pi_t (0 on masked tokens, so
    # NaN padding in log_probs never reaches the loss or the gradient).
    per_token_loss = _StraightThroughLoss.apply(log_probs, value, coef)
    loss = aggregate_loss(per_token_loss, batch.mask, aggregation)

    clipped = (terms.clipped_upper | terms.clipped_lower) & batch.valid
    metrics = {}
    if compute_metrics:
        with torch.no_grad():
            metrics = policy_loss_metrics(batch, terms, clipped)
            metrics["bad_tokens"] = (
                batch.bad.sum()
                if batch.bad is not None
                else torch.zeros((), dtype=torch.int64, device=batch.mask.device)
            )
    return PolicyLossOutput(
        loss=loss,
        per_token_loss=per_token_loss,
        clipped=clipped,
        metrics=metrics,
        mode=mode,
        aggregation=aggregation,
        params=resolved,
        bad=batch.bad,
    )
