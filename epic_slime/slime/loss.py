"""slime custom loss: ``--loss-type custom_loss --custom-loss-function-path epic_slime.slime.loss.policy_loss``.

A thin layer: log-probs and entropy come from slime's ``get_log_probs_and_entropy`` (tensor-
parallel vocabulary shards, temperature, rollout top-p replay), the CP rank and group from
Megatron's ``mpu``; everything else is ``epic_slime.slime.loss_parts.adapter`` (slime-free, tested in CI).
Top-K modes (``dppo_topk_tv`` / ``dppo_topk_kl``) also need pi's log-probs of each position's set
(rollout top-k ids + the sampled token): computed here from the same logits, sliced per sample by
slime's ``get_responses``, with the normaliser over the tensor-parallel vocabulary shards
(``epic_slime.slime.loss_parts.topk.vocab_parallel_log_probs_at``: two TP all-reduces, no gradient).
slime is imported inside the function: this module is loaded in slime's training actors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from epic_slime.slime.loss_parts.adapter import loss_settings, needs_topk, slime_policy_loss_from_log_probs
from epic_slime.slime.loss_parts.cp import make_all_reduce_gather, zigzag_response_positions


def policy_loss(
    args: Any,
    batch: dict,
    logits: torch.Tensor,
    sum_of_sample_mean: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    from megatron.core import mpu
    from slime.backends.megatron_utils.loss import get_log_probs_and_entropy, get_rollout_top_p_logprob_kwargs

    _, log_probs_and_entropy = get_log_probs_and_entropy(
        logits,
        args=args,
        unconcat_tokens=batch["unconcat_tokens"],
        total_lengths=batch["total_lengths"],
        response_lengths=batch["response_lengths"],
        with_entropy=True,
        **get_rollout_top_p_logprob_kwargs(args, batch),
    )
    cp_size = mpu.get_context_parallel_world_size()
    topk_kwargs = {}
    if needs_topk(loss_settings(args).mode):
        topk_kwargs = _topk_log_probs(args, batch, logits, cp_size)
    loss, metrics = slime_policy_loss_from_log_probs(
        args,
        batch,
        log_probs_and_entropy["log_probs"],
        log_probs_and_entropy.get("entropy"),
        sum_of_sample_mean,
        cp_rank=mpu.get_context_parallel_rank(),
        cp_size=cp_size,
        gather=make_all_reduce_gather(mpu.get_context_parallel_group()) if cp_size > 1 else None,
        **topk_kwargs,
    )
    # A rank without local response tokens must still reach every parameter in backward.
    if sum(lp.numel() for lp in log_probs_and_entropy["log_probs"]) == 0:
        loss = loss + 0 * logits.sum()
    return loss, metrics


def _topk_log_probs(args: Any, batch: dict, logits: torch.Tensor, cp_size: int) -> dict[str, Any]:
    """Top-K modes: the set ids of every sample (full response) and log pi of those ids at this
    rank's tokens, from the vocabulary-sharded logits (``epic_slime.slime.loss_parts.topk``), without gradient."""
    import torch.distributed as dist
    from megatron.core import mpu
    from slime.backends.megatron_utils.loss import get_responses

    from epic_slime.slime.loss_parts.topk import topk_token_sets, vocab_parallel_log_probs_at

    if getattr(args, "allgather_cp", False):
        raise ValueError("the Top-K loss modes do not support --allgather-cp")
    response_lengths = list(batch["response_lengths"])
    set_ids, set_masks = topk_token_sets(batch, response_lengths)
    cp_rank = mpu.get_context_parallel_rank() if cp_size > 1 else 0
    local_ids = [
        ids.to(logits.device)[zigzag_response_positions(total, resp, cp_rank, cp_size).to(logits.device)]
        for ids, total, resp in zip(set_ids, batch["total_lengths"], response_lengths)
    ]
    # slime's response slicing (CP zigzag aware); the temperature is applied per chunk below,
    # so that no temperature-scaled copy of the whole [T, V / TP] logits is made.
    shards = [
        chunk
        for chunk, _ in get_responses(
            logits,
            args=args,
            unconcat_tokens=batch["unconcat_tokens"],
            total_lengths=batch["total_lengths"],
            response_lengths=response_lengths,
            apply_temperature=False,
        )
    ]
    tp_group = mpu.get_tensor_model_parallel_group()
    tp_size = mpu.get_tensor_model_parallel_world_size()

    def all_reduce(op):
        def reduce(tensor: torch.Tensor) -> torch.Tensor:
            if tp_size > 1:
                dist.all_reduce(tensor, op=op, group=tp_group)
            return tensor

        return reduce

    current_topk_log_probs = vocab_parallel_log_probs_at(
        shards,
        local_ids,
        vocab_start=mpu.get_tensor_model_parallel_rank() * logits.size(-1),
        all_reduce_max=all_reduce(dist.ReduceOp.MAX),
        all_reduce_sum=all_reduce(dist.ReduceOp.SUM),
        temperature=float(getattr(args, "rollout_temperature", 1.0)),
    )
    return {"current_topk_log_probs": current_topk_log_probs, "topk_sets": (set_ids, set_masks)}
