"""Train-inference mismatch injected on the rollout side only: Gaussian noise on the MoE router logits.

Two inference engines that compute the same model differently (kernels, batch shapes, reduction order)
disagree most where a discrete choice amplifies a small difference: which experts a token is routed to.
`install_router_noise` makes the rollout engine's routers add N(0, sigma^2) to every router logit before
the softmax and the top-k choice, so near-ties route differently from the trainer's clean routers, as
between an inference engine and a training engine. The trainer never gets it, so the step-start gap
|log pi_train - log mu_rollout| (`train/logprob_abs_diff_step_start`) measures the mismatch; sigma is
set in a probe (`bench/mismatch_probe.py`) to the gap wanted.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F


def _noisy_router_forward(self, hidden_states):
    """The router's computation with noise on its logits (same outputs as the library's router at sigma 0:
    logits, normalised top-k weights, top-k indices)."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    logits = F.linear(hidden_states, self.weight)
    if self.router_noise_sigma > 0:
        noise = torch.randn(logits.shape, generator=self.router_noise_generator, dtype=torch.float32)
        logits = logits + (self.router_noise_sigma * noise).to(logits.dtype)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    top_value, top_index = torch.topk(probs, self.top_k, dim=-1)
    if self.norm_topk_prob:
        top_value = top_value / top_value.sum(dim=-1, keepdim=True)
    return logits, top_value.to(logits.dtype), top_index


def routers(model) -> list:
    """The model's MoE router modules (one per MoE layer)."""
    found = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    if not found:
        raise ValueError("router noise: the model has no MoE router (expected Qwen3MoeTopKRouter modules)")
    return found


def install_router_noise(model, sigma: float, generator: torch.Generator) -> int:
    """Make every router of `model` add N(0, sigma^2) noise (drawn from `generator`) to its logits.
    Returns the number of routers changed. sigma must be a finite number >= 0."""
    if not (isinstance(sigma, (int, float)) and sigma >= 0 and sigma == sigma and sigma != float("inf")):
        raise ValueError(f"rollout_router_noise must be a finite number >= 0, got {sigma!r}")
    found = routers(model)
    for r in found:
        r.router_noise_sigma = float(sigma)
        r.router_noise_generator = generator
        r.forward = types.MethodType(_noisy_router_forward, r)
    return len(found)
