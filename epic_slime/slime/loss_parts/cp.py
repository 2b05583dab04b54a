"""Context-parallel (CP) bookkeeping for the loss adapter, without importing slime.

slime's zigzag CP layout (slime ``cp_utils``, commit 624b824a): a sample of ``total_length``
tokens is padded to ``2 * cp_size * chunk`` with ``chunk = ceil(total_length / (2 * cp_size))``;
rank ``r`` holds token chunks ``r`` and ``2 * cp_size - 1 - r``. The logit at position ``i``
scores token ``i + 1``, so response token ``j`` (0-based) is scored by logit ``prompt - 1 + j``.
A rank's local per-sample tensors (``log_probs``, ``rollout_log_probs``, ``advantages``, ...)
are its two logit ranges clipped to ``[prompt - 1, total - 1)``, first chunk first.

Prefix-sum losses (EPIC, CTPO, GSPO) need the whole response, so the adapter all-gathers the
*detached* per-token inputs, evaluates the loss on full responses and keeps only its local
positions. Each token's loss has gradient only through its own ``log pi`` (straight-through),
so no gradient crosses ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def zigzag_response_ranges(
    total_length: int, response_length: int, cp_rank: int, cp_size: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """Response-index ranges ``[(a0, b0), (a1, b1)]`` held by ``cp_rank`` (empty ranges are (0, 0))."""
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank={cp_rank} must lie in [0, cp_size={cp_size})")
    if not 0 < response_length < total_length:
        raise ValueError(
            f"response_length={response_length} must be in (0, total_length={total_length}): "
            "a sample needs at least one prompt token and one response token"
        )
    if cp_size == 1:
        return (0, response_length), (0, 0)
    first_logit = total_length - response_length - 1  # logit scoring the first response token
    end_logit = total_length - 1
    chunk = -(-total_length // (2 * cp_size))
    ranges = []
    for index in (cp_rank, 2 * cp_size - 1 - cp_rank):
        lo = max(index * chunk, first_logit)
        hi = min((index + 1) * chunk, end_logit)
        ranges.append((lo - first_logit, hi - first_logit) if lo < hi else (0, 0))
    return ranges[0], ranges[1]


def zigzag_response_positions(total_length: int, response_length: int, cp_rank: int, cp_size: int) -> torch.Tensor:
    """Response indices of this rank's local tokens, in local order (int64, 1-D)."""
    (a0, b0), (a1, b1) = zigzag_response_ranges(total_length, response_length, cp_rank, cp_size)
    return torch.cat([torch.arange(a0, b0), torch.arange(a1, b1)])


def local_to_full(local: torch.Tensor, positions: torch.Tensor, response_length: int) -> torch.Tensor:
    """Scatter local rows into a zero tensor of ``response_length`` rows (no gradient)."""
    full = local.new_zeros((response_length, *local.shape[1:]))
    return full.index_copy(0, positions.to(local.device), local.detach())


Gather = Callable[[torch.Tensor], torch.Tensor]


def make_all_reduce_gather(group=None) -> Gather:
    """A gather over a torch.distributed group: sum of zero-padded rows, each row set by one rank.

    Exactly one rank contributes each row and the others add 0.0, so the result is bit-exact.
    """
    import torch.distributed as dist

    def gather(buffer: torch.Tensor) -> torch.Tensor:
        buffer = buffer.detach().clone()
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=group)
        return buffer

    return gather


def gather_full_responses(
    local_rows: Sequence[torch.Tensor],
    positions: Sequence[torch.Tensor],
    response_lengths: Sequence[int],
    gather: Gather | None,
) -> list[torch.Tensor]:
    """Full-response detached rows per sample from every rank's local rows.

    ``local_rows[i]``: ``[n_local_i, k]``; returns ``[response_lengths[i], k]`` per sample.
    ``gather=None`` means no CP (the local rows already are the full responses).
    One collective for the whole micro-batch.
    """
    if len(local_rows) != len(positions) or len(local_rows) != len(response_lengths):
        raise ValueError(
            f"local_rows ({len(local_rows)}), positions ({len(positions)}) and "
            f"response_lengths ({len(response_lengths)}) must have one entry per sample"
        )
    if gather is None:
        return [local_to_full(rows, pos, n) for rows, pos, n in zip(local_rows, positions, response_lengths)]
    if not local_rows:
        return []
    buffer = torch.cat(
        [local_to_full(rows, pos, n) for rows, pos, n in zip(local_rows, positions, response_lengths)], dim=0
    )
    return list(gather(buffer).split(list(response_lengths), dim=0))


def with_live_local_entries(
    full_detached: torch.Tensor, positions: torch.Tensor, live_local: torch.Tensor
) -> torch.Tensor:
    """The full-response row whose local positions carry the live (differentiable) values."""
    return full_detached.detach().index_copy(0, positions.to(live_local.device), live_local)
