"""Top-K inputs of the DPPO Top-K modes: the behaviour policy's top-K token set per position.

The Top-K modes compare mu and pi on a small set of tokens per position plus one "rest" bucket.
What a caller passes to `compute_policy_loss` (all [B, T, K], aligned with log_probs [B, T]):

* ``behavior_topk_log_probs``: log mu of K distinct token ids at each position: mu's top-k ids
  (what SGLang returns with ``top_logprobs_num=k``) **plus the sampled token**, which must be in
  the set. The simple layout is K = k + 1 columns, the last one being the sampled token.
* ``current_topk_log_probs``: log pi (the trainer's policy) of the same ids, gathered from the
  trainer's logits. It may carry a gradient; the loss only uses it detached, for the mask.
* ``topk_mask`` (optional, default all True): False on columns to ignore: the appended sampled
  token where it already is one of the top-k ids (a duplicate would count its mass twice), and
  absent ids (an engine that returned fewer than k).

`append_sampled_token` builds the ids and the mask of that layout, `behavior_topk_set` the
behaviour side from what a rollout engine records (SGLang's top log-probs), `gather_log_probs` the
log-probs of ids from logits, `topk_inputs_from_logits` all of it from full logits (the local
runtime and tests), `synthetic_topk_inputs` random but consistent inputs for benchmarks, and
`topk_inputs_around` random sets around given sampled-token log-probs (bench/loss_bench.py).
The loss checks these inputs in `inputs.prepare_batch`.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .core import PolicyLossInputError


@dataclasses.dataclass(frozen=True)
class TopKInputs:
    """The Top-K tensors of one batch: log mu and log pi of ``ids`` [B, T, K], and the column mask."""

    behavior_topk_log_probs: torch.Tensor
    current_topk_log_probs: torch.Tensor
    topk_mask: torch.Tensor
    ids: torch.Tensor | None = None

    def loss_kwargs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for `compute_policy_loss`."""
        return {
            "behavior_topk_log_probs": self.behavior_topk_log_probs,
            "current_topk_log_probs": self.current_topk_log_probs,
            "topk_mask": self.topk_mask,
        }


# --------------------------------------------------------------------------------------------
# Building the inputs
# --------------------------------------------------------------------------------------------


def append_sampled_token(topk_ids: torch.Tensor, sampled_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T, k + 1] = mu's top-k ids then the sampled id; mask False on the sampled column where
    it duplicates a top-k id, and on negative (absent) ids."""
    if topk_ids.shape[:-1] != sampled_ids.shape:
        raise PolicyLossInputError(
            f"topk_ids shape {tuple(topk_ids.shape)} must be sampled_ids shape {tuple(sampled_ids.shape)} + (k,)"
        )
    sampled = sampled_ids.unsqueeze(-1).to(topk_ids.dtype)
    ids = torch.cat([topk_ids, sampled], dim=-1)
    present = topk_ids >= 0
    duplicate = ((topk_ids == sampled) & present).any(dim=-1, keepdim=True)
    mask = torch.cat([present, ~duplicate], dim=-1)
    return ids, mask


def behavior_topk_set(
    topk_ids: torch.Tensor, topk_log_probs: torch.Tensor, sampled_ids: torch.Tensor, behavior_log_probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The behaviour side of the Top-K inputs from what a rollout engine records per generated token.

    topk_ids / topk_log_probs [B, T, k]: mu's top-k ids and their log mu (SGLang: the
    ``output_top_logprobs`` of ``return_logprob=True, top_logprobs_num=k``; a negative id marks an
    absent entry); sampled_ids / behavior_log_probs [B, T]: the sampled token and its log mu.
    Returns (ids, behavior_topk_log_probs, topk_mask), all [B, T, k + 1], the sampled token last.
    The trainer then gathers its own log-probs at ``ids`` (`gather_log_probs` from full logits).
    """
    if topk_log_probs.shape != topk_ids.shape or behavior_log_probs.shape != sampled_ids.shape:
        raise PolicyLossInputError(
            f"topk_log_probs {tuple(topk_log_probs.shape)} must match topk_ids {tuple(topk_ids.shape)}, and "
            f"behavior_log_probs {tuple(behavior_log_probs.shape)} sampled_ids {tuple(sampled_ids.shape)}"
        )
    ids, mask = append_sampled_token(topk_ids, sampled_ids)
    values = torch.cat([topk_log_probs, behavior_log_probs.to(topk_log_probs.dtype).unsqueeze(-1)], dim=-1)
    return ids, torch.where(mask, values, 0.0), mask


def gather_log_probs(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """log softmax(logits) at ``ids`` (negative ids read as 0 and, like masked columns, give 0).

    Computed in float32 at least (float64 stays float64); differentiable w.r.t. logits."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    log_probs = torch.log_softmax(logits.to(dtype), dim=-1)
    picked = log_probs.gather(-1, ids.clamp(min=0).long())
    keep = ids >= 0 if mask is None else mask & (ids >= 0)
    return torch.where(keep, picked, 0.0)


def topk_inputs_from_logits(
    logits: torch.Tensor, behavior_logits: torch.Tensor, sampled_ids: torch.Tensor, k: int
) -> TopKInputs:
    """Top-K inputs from full logits [B, T, V] of pi (``logits``) and mu (``behavior_logits``).

    The set at each position is mu's top-k ids plus the sampled id (K = k + 1 columns, the last one
    masked where it duplicates a top-k id). ``current_topk_log_probs`` keeps the graph of ``logits``.
    """
    if logits.shape != behavior_logits.shape or logits.dim() != 3:
        raise PolicyLossInputError(
            f"logits {tuple(logits.shape)} and behavior_logits {tuple(behavior_logits.shape)} must both be [B, T, V]"
        )
    vocab = logits.shape[-1]
    if not isinstance(k, int) or not 1 <= k <= vocab:
        raise PolicyLossInputError(f"k={k!r} must be an int in [1, vocabulary size {vocab}]")
    if sampled_ids.shape != logits.shape[:2]:
        raise PolicyLossInputError(
            f"sampled_ids shape {tuple(sampled_ids.shape)} != logits [B, T] {tuple(logits.shape[:2])}"
        )
    with torch.no_grad():
        top_ids = torch.topk(behavior_logits, k, dim=-1).indices
        ids, mask = append_sampled_token(top_ids, sampled_ids.long())
    behavior = gather_log_probs(behavior_logits.detach(), ids, mask)
    current = gather_log_probs(logits, ids, mask)
    return TopKInputs(behavior_topk_log_probs=behavior, current_topk_log_probs=current, topk_mask=mask, ids=ids)


def synthetic_topk_inputs(
    batch_size: int,
    seq_len: int,
    k: int,
    *,
    vocab_size: int | None = None,
    noise: float = 0.1,
    dtype: torch.dtype = torch.float32,
    device=None,
    generator: torch.Generator | None = None,
):
    """Random but consistent inputs for benchmarks and tests: (log_probs, behavior_log_probs, TopKInputs).

    mu is a random softmax over a small vocabulary (default 2k), pi = mu's logits + ``noise``
    Gaussian noise, the sampled token is drawn from mu. Memory: B * T * vocab_size floats.
    """
    vocab = vocab_size or max(2 * k, k + 1)
    shape = (batch_size, seq_len, vocab)
    behavior_logits = 2.0 * torch.randn(shape, generator=generator, dtype=torch.float32).to(device)
    logits = behavior_logits + noise * torch.randn(shape, generator=generator, dtype=torch.float32).to(device)
    probs = torch.softmax(behavior_logits, dim=-1).reshape(-1, vocab)
    if probs.shape[0]:
        sampled = torch.multinomial(probs.cpu(), 1, generator=generator).reshape(batch_size, seq_len).to(device)
    else:
        sampled = torch.zeros(batch_size, seq_len, dtype=torch.long, device=device)
    inputs = topk_inputs_from_logits(logits, behavior_logits, sampled, k)
    log_probs = gather_log_probs(logits, sampled.unsqueeze(-1)).squeeze(-1)
    behavior_log_probs = gather_log_probs(behavior_logits, sampled.unsqueeze(-1)).squeeze(-1)
    cast = lambda x: x.to(dtype)  # noqa: E731
    return (
        cast(log_probs),
        cast(behavior_log_probs),
        TopKInputs(
            cast(inputs.behavior_topk_log_probs), cast(inputs.current_topk_log_probs), inputs.topk_mask, inputs.ids
        ),
    )


def topk_inputs_around(
    log_probs: torch.Tensor,
    behavior_log_probs: torch.Tensor,
    k: int,
    *,
    noise: float = 0.1,
    set_mass: float = 0.9,
    generator: torch.Generator | None = None,
) -> TopKInputs:
    """Top-K inputs [B, T, k + 1] consistent with given sampled-token log-probs [B, T] (benchmarks).

    Column k is the sampled token (log mu = behavior_log_probs, log pi = log_probs); columns 0..k-1
    are k other tokens sharing ``set_mass`` of each policy's remaining mass with random weights
    (pi's are mu's perturbed by ``noise``). Random numbers are drawn on the CPU from ``generator``.
    """
    shape = (*log_probs.shape, k)
    dtype = torch.float64 if log_probs.dtype == torch.float64 else torch.float32
    log_weights = torch.randn(shape, generator=generator, dtype=dtype)
    current_weights = log_weights + noise * torch.randn(shape, generator=generator, dtype=dtype)
    device = log_probs.device

    def others(weights: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
        sampled = sampled.detach().to(dtype).clamp(max=0.0)
        rest = torch.log(-torch.expm1(sampled))  # log(1 - p_sampled)
        return torch.log_softmax(weights.to(device), dim=-1) + (math.log(set_mass) + rest).unsqueeze(-1)

    behavior = torch.cat(
        [others(log_weights, behavior_log_probs), behavior_log_probs.detach().to(dtype)[..., None]], -1
    )
    current = torch.cat([others(current_weights, log_probs), log_probs.detach().to(dtype)[..., None]], -1)
    return TopKInputs(behavior, current, torch.ones(behavior.shape, dtype=torch.bool, device=device))
