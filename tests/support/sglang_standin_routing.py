"""The SGLang stand-in's routed experts (``return_routed_experts``, SGLang's ``--enable-return-
routed-experts``): per token position, the top-k experts each MoE layer of the tiny Qwen3-MoE
routed it to, recorded when the position is first computed (as SGLang records routing at
prefill / decode, not again later), answered as ``meta_info["routed_experts"]``: base64 of int32
``[len(input_ids) + len(output_ids) - 1, layers, topk]`` (every position but the last sampled
token, which was never run through the model), the form slime's ``decode_int32_meta_array`` reads.
A request that never reached the model (aborted while waiting) answers without routing."""

from __future__ import annotations

import base64

import torch


def record(batch, seq_lens: list[int], router_logits, topk: int) -> None:
    """Append the routing of every position not yet recorded, for the requests asking for it.

    ``router_logits``: the model's per-layer ``[B * P, experts]`` over the left-padded batch."""
    B, P = len(seq_lens), max(seq_lens)
    chosen = torch.stack([logits.view(B, P, -1).topk(topk, dim=-1).indices for logits in router_logits], dim=2)
    for i, req in enumerate(batch):
        if not req.want_routing:
            continue
        have = sum(chunk.shape[0] for chunk in req.routing)
        start = P - seq_lens[i]
        if have < seq_lens[i]:
            req.routing.append(chosen[i, start + have :].to(torch.int32))


def answer_field(req) -> dict:
    """``{"routed_experts": base64}`` when the request asked and all its rows were computed."""
    if not req.want_routing or not req.routing:
        return {}
    rows = torch.cat(req.routing)
    expected = len(req.input_ids) + len(req.tokens) - 1
    if rows.shape[0] < expected:
        return {}
    return {"routed_experts": base64.b64encode(rows[:expected].contiguous().numpy().tobytes()).decode("ascii")}
