"""Per-token estimators of KL(pi || ref) for the KL-to-reference term (Schulman's k1, k2, k3).

Shared by the slime adapter (`--kl-loss-type`) and the local runtime (`--use-kl-loss`).
"""

from __future__ import annotations

import torch

KL_KINDS = ("k1", "k2", "k3", "low_var_kl")


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """k1 = log(pi/ref), k2 = log(pi/ref)^2 / 2, k3 = ref/pi - 1 - log(ref/pi) >= 0 (unbiased, low
    variance); low_var_kl is k3 clamped to [-10, 10] (slime's and verl's name). Computed in float32
    at least."""
    dtype = torch.promote_types(log_probs.dtype, torch.float32)
    log_ratio = log_probs.to(dtype) - ref_log_probs.to(dtype)
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return log_ratio.square() / 2
    if kind in ("k3", "low_var_kl"):
        reverse = -log_ratio  # log ref - log pi
        kl = torch.expm1(reverse) - reverse
        return kl.clamp(-10, 10) if kind == "low_var_kl" else kl
    raise ValueError(f"kl kind {kind!r} is not one of {KL_KINDS}")
