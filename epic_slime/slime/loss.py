"""slime custom loss: ``--loss-type custom_loss --custom-loss-function-path epic_slime.slime.loss.policy_loss``.

A thin layer: log-probs and entropy come from slime's ``get_log_probs_and_entropy`` (tensor-
parallel vocabulary shards, temperature, rollout top-p replay), the CP rank and group from
Megatron's ``mpu``; everything else is ``epic_slime.slime.adapter`` (slime-free, tested in CI).
slime is imported inside the function: this module is loaded in slime's training actors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from epic_slime.slime.adapter import slime_policy_loss_from_log_probs
from epic_slime.slime.cp import make_all_reduce_gather


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
    loss, metrics = slime_policy_loss_from_log_probs(
        args,
        batch,
        log_probs_and_entropy["log_probs"],
        log_probs_and_entropy.get("entropy"),
        sum_of_sample_mean,
        cp_rank=mpu.get_context_parallel_rank(),
        cp_size=cp_size,
        gather=make_all_reduce_gather(mpu.get_context_parallel_group()) if cp_size > 1 else None,
    )
    # A rank without local response tokens must still reach every parameter in backward.
    if sum(lp.numel() for lp in log_probs_and_entropy["log_probs"]) == 0:
        loss = loss + 0 * logits.sum()
    return loss, metrics
