"""Truncated importance sampling (TIS) against the rollout engine's log-probs, composed with any
non-Top-K loss mode. One implementation for both paths (the embedded runtime's trainer and the
slime adapter).

Under TIS the loss's ratio is to pi_old (the trainer's own log-probs at the step start), and each
token's per-token loss is multiplied by the truncated weight

    w_t = clamp(pi_old_t / mu_t, clip_low, clip)          (slime's --tis-clip-low, --tis-clip; 0, 2)

which corrects for the rollout engine sampling from mu rather than pi_old (train-inference
mismatch). The weights carry no gradient.
"""

from __future__ import annotations

import torch

DEFAULT_TIS_CLIP = 2.0  # slime's --tis-clip default
DEFAULT_TIS_CLIP_LOW = 0.0  # slime's --tis-clip-low default: no lower truncation


def check_tis_clips(clip: float, clip_low: float = DEFAULT_TIS_CLIP_LOW) -> None:
    """0 <= clip_low < clip, both finite; raises ValueError naming the flag and value."""
    import math

    if not (isinstance(clip, (int, float)) and math.isfinite(clip) and clip > 0):
        raise ValueError(f"--tis-clip must be a finite number > 0, got {clip!r}")
    if not (isinstance(clip_low, (int, float)) and math.isfinite(clip_low) and 0 <= clip_low < clip):
        raise ValueError(f"--tis-clip-low must be in [0, --tis-clip = {clip}), got {clip_low!r}")


def tis_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    mask: torch.Tensor,
    clip: float = DEFAULT_TIS_CLIP,
    clip_low: float = DEFAULT_TIS_CLIP_LOW,
) -> torch.Tensor:
    """Per-token weights clamp(exp(log pi_old - log mu), clip_low, clip) on the mask, 0 off it, no
    gradient. Any shape; ``mask`` is bool (or 0/1) of the same shape. A non-finite log-prob on a
    valid token gives a NaN weight (callers check their inputs first: the slime adapter's bad-token
    rule, the runtime's finite-loss check)."""
    mask = mask.bool()
    log_ratio = (old_log_probs.detach() - rollout_log_probs.detach().to(old_log_probs.dtype)).masked_fill(~mask, 0.0)
    weights = torch.exp(log_ratio).clamp(min=clip_low, max=clip)
    return torch.where(mask, weights, 0.0)


def tis_diagnostics(weights: torch.Tensor, mask: torch.Tensor, clip: float) -> dict[str, torch.Tensor]:
    """Mean weight and the share of tokens truncated at ``clip`` over the valid tokens (the runtime's
    train/tis_weight_mean, train/tis_truncated_frac)."""
    mask = mask.bool()
    count = mask.sum().clamp(min=1)
    return {"tis_weight_mean": weights.sum() / count, "tis_truncated_frac": ((weights >= clip) & mask).sum() / count}


def tis_weighted_loss(
    per_token_loss: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, aggregation: str
) -> torch.Tensor:
    """The mode's loss with each token's per-token loss times its TIS weight, aggregated as the mode
    aggregates (the runtime's loss under --use-tis; the slime adapter weights the same per-token loss
    before slime's reducer)."""
    from .core import aggregate_loss

    return aggregate_loss(per_token_loss * weights, mask, aggregation)
