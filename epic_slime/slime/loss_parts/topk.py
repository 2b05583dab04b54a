"""Top-K inputs of the DPPO Top-K modes on slime's side, without importing slime (CI tests it).

Behaviour side (rollout): the project's generate function (``epic_slime.slime.generate``) stores,
per generated token, SGLang's top-k ids and log-probs on the Sample (``rollout_topk_ids``,
``rollout_topk_log_probs``: ``[response_length, k]``, id -1 where absent). Those have to reach the
loss as batch keys of the same names (full responses, like ``loss_masks``; see docs/cluster.md).

Trainer side (loss): the set at each response position is the k ids plus the sampled token
(``epic_slime.losses.topk.append_sampled_token``), and the trainer's log-probs of those ids come
from slime's vocabulary-sharded logits: `vocab_parallel_log_probs_at`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from epic_slime.losses import PolicyLossInputError
from epic_slime.losses.topk import append_sampled_token

TOPK_IDS_KEY = "rollout_topk_ids"
TOPK_LOG_PROBS_KEY = "rollout_topk_log_probs"

Reduce = Callable[[torch.Tensor], torch.Tensor]


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def vocab_parallel_log_probs_at(
    logit_shards: Sequence[torch.Tensor],
    ids: Sequence[torch.Tensor],
    vocab_start: int,
    all_reduce_max: Reduce = _identity,
    all_reduce_sum: Reduce = _identity,
    temperature: float = 1.0,
) -> list[torch.Tensor]:
    """log softmax(logits / temperature) at ``ids``, from this rank's vocabulary shard.

    ``logit_shards[i]``: ``[R_i, V_local]`` logits of this tensor-parallel rank's vocabulary slice
    ``[vocab_start, vocab_start + V_local)``; ``ids[i]``: ``[R_i, K]`` global token ids (negative =
    absent, gives 0). The normaliser is the logsumexp over the whole vocabulary: the row max is
    all-reduced (MAX), then the shifted exp-sums and the id logits held by this rank (0 for ids
    outside the shard) are all-reduced (SUM) in one buffer: two collectives per call. Without
    gradient (the Top-K loss uses pi's set log-probs detached). float32 at least.
    """
    if len(logit_shards) != len(ids):
        raise PolicyLossInputError(f"{len(logit_shards)} logit shards for {len(ids)} id tensors")
    if not logit_shards:
        return []
    with torch.no_grad():
        dtype = torch.float64 if logit_shards[0].dtype == torch.float64 else torch.float32
        width = int(logit_shards[0].shape[-1])
        counts = []
        for i, (shard, id_rows) in enumerate(zip(logit_shards, ids)):
            if shard.dim() != 2 or shard.shape[-1] != width or id_rows.dim() != 2 or id_rows.shape[0] != shard.shape[0]:
                raise PolicyLossInputError(
                    f"sample {i}: logits shard {tuple(shard.shape)} and ids {tuple(id_rows.shape)} must be "
                    f"[R, {width}] and [R, K]"
                )
            counts.append(int(shard.shape[0]))
        scaled = [shard.to(dtype) / temperature if temperature != 1.0 else shard.to(dtype) for shard in logit_shards]
        row_max = all_reduce_max(torch.cat([s.amax(dim=-1) for s in scaled]))
        local_ids = [id_rows.long() - vocab_start for id_rows in ids]
        buffers = []
        for s, m, local in zip(scaled, row_max.split(counts), local_ids):
            held = (local >= 0) & (local < width)
            picked = torch.where(held, s.gather(-1, local.clamp(0, width - 1)), 0.0)
            exp_sum = (s - m.unsqueeze(-1)).exp().sum(-1, keepdim=True)
            buffers.append(torch.cat([exp_sum, picked], dim=-1))
        reduced = all_reduce_sum(torch.cat(buffers, dim=0))
        log_norm = row_max + reduced[:, 0].log()
        log_probs = reduced[:, 1:] - log_norm.unsqueeze(-1)
        out = []
        for rows, id_rows in zip(log_probs.split(counts), ids):
            out.append(torch.where(id_rows >= 0, rows, 0.0))
        return out


def topk_token_sets(batch: dict, response_lengths: Sequence[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per sample the full-response set ids ``[T, k + 1]`` (k rollout top-k ids, the sampled token
    last) and their mask (False where the sampled token duplicates a top-k id, and on absent ids).

    Reads ``batch['rollout_topk_ids']`` (``[T, k]`` per sample) and the sampled tokens from
    ``batch['unconcat_tokens']``; raises PolicyLossInputError naming a missing or ill-shaped key.
    """
    missing = [key for key in (TOPK_IDS_KEY, TOPK_LOG_PROBS_KEY, "unconcat_tokens") if batch.get(key) is None]
    if missing:
        raise PolicyLossInputError(
            f"the Top-K loss modes need batch keys {missing}: per sample, the full response's SGLang top-k "
            f"ids and log-probs ([response_length, k]) recorded by epic_slime.slime.generate.generate as "
            f"Sample.{TOPK_IDS_KEY} / Sample.{TOPK_LOG_PROBS_KEY}, and slime has to forward them to the "
            "loss (slime 624b824a does not: see docs/cluster.md)"
        )
    topk_ids, topk_log_probs = list(batch[TOPK_IDS_KEY]), list(batch[TOPK_LOG_PROBS_KEY])
    tokens = list(batch["unconcat_tokens"])
    n = len(response_lengths)
    for key, values in ((TOPK_IDS_KEY, topk_ids), (TOPK_LOG_PROBS_KEY, topk_log_probs), ("unconcat_tokens", tokens)):
        if len(values) != n:
            raise PolicyLossInputError(f"batch[{key!r}] has {len(values)} samples, expected {n}")
    k = None
    sets, masks = [], []
    for i, (ids, lps, toks, length) in enumerate(zip(topk_ids, topk_log_probs, tokens, response_lengths)):
        ids, lps, toks = torch.as_tensor(ids), torch.as_tensor(lps), torch.as_tensor(toks)
        k = int(ids.shape[-1]) if k is None and ids.dim() == 2 else k
        for key, value in ((TOPK_IDS_KEY, ids), (TOPK_LOG_PROBS_KEY, lps)):
            if value.dim() != 2 or value.shape[0] != length or value.shape[1] != k or k < 1:
                raise PolicyLossInputError(
                    f"batch[{key!r}][{i}] has shape {tuple(value.shape)}, expected ({length}, {k}): one row of "
                    "k entries per response token, the same k for every sample"
                )
        if toks.dim() != 1 or toks.numel() <= length:
            raise PolicyLossInputError(
                f"batch['unconcat_tokens'][{i}] has shape {tuple(toks.shape)}; expected more than {length} tokens"
            )
        set_ids, set_mask = append_sampled_token(ids.long(), toks[-length:].long())
        sets.append(set_ids)
        masks.append(set_mask)
    return sets, masks


def behavior_set_log_probs(
    topk_log_probs: torch.Tensor, behavior_log_probs: torch.Tensor, set_mask: torch.Tensor
) -> torch.Tensor:
    """log mu of one sample's set ``[T, k + 1]``: the rollout top-k log-probs, then the sampled
    token's log mu; 0 where the set mask is False."""
    values = torch.cat([topk_log_probs.to(behavior_log_probs.dtype), behavior_log_probs.unsqueeze(-1)], dim=-1)
    return torch.where(set_mask.to(values.device), values, 0.0)


def check_topk_local_inputs(topk, local_counts: list[int], response_lengths: list[int]) -> None:
    """Shapes of ``epic_slime.slime.loss_parts.adapter.TopKLocalInputs`` against the micro-batch's local and full lengths."""
    n = len(local_counts)
    fields = (
        ("current_topk_log_probs", topk.current_log_probs),
        ("rollout_topk_log_probs", topk.behavior_topk_log_probs),
        ("topk set masks", topk.set_masks),
    )
    for name, values in fields:
        if len(values) != n:
            raise ValueError(f"{name}: {len(values)} samples, expected {n}")
    for i, (current, lps, mask) in enumerate(zip(topk.current_log_probs, topk.behavior_topk_log_probs, topk.set_masks)):
        width = int(mask.shape[-1]) if mask.dim() == 2 else -1
        if mask.dim() != 2 or mask.shape[0] != response_lengths[i]:
            raise ValueError(f"topk set mask [{i}] has shape {tuple(mask.shape)}, expected ({response_lengths[i]}, K)")
        if tuple(current.shape) != (local_counts[i], width):
            raise ValueError(
                f"current_topk_log_probs[{i}] has shape {tuple(current.shape)}, expected ({local_counts[i]}, {width})"
            )
        if tuple(lps.shape) != (response_lengths[i], width - 1):
            raise ValueError(
                f"rollout_topk_log_probs[{i}] has shape {tuple(lps.shape)}, expected ({response_lengths[i]}, {width - 1})"
            )
