"""``--custom-generate-function-path epic_slime.slime.generate.generate``: SGLang generation that
also records the behaviour policy's top-k log-probs per generated token (DPPO Top-K modes).

slime's rollout calls ``generate(args, sample, sampling_params, evaluation=...)`` for every
sample (``sglang_rollout.generate_and_rm``, also from the fully asynchronous worker). For a
training sample of a Top-K mode the request asks SGLang for ``top_logprobs_num = k``
(``--policy-loss-topk``) next to ``return_logprob``; the answer's ``meta_info.output_top_logprobs``
(per generated token, a list of ``[log-prob, token id, text]``) becomes two arrays on the Sample:

    sample.rollout_topk_ids        int32   [response_length, k]  (-1: absent entry)
    sample.rollout_topk_log_probs  float32 [response_length, k]  (0 where absent; -inf kept)

Rows of response tokens generated before this call (a resumed partial rollout) are absent
(-1). Everything else (evaluation, the other loss modes) is slime's own ``generate``.
slime is imported lazily: this module runs inside slime's RolloutManager actor.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from epic_slime.slime.loss_parts.topk import TOPK_IDS_KEY, TOPK_LOG_PROBS_KEY

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"  # SGLang Model Gateway consistent hashing (slime's router policy)


def topk_for_args(args: Any) -> int | None:
    """k when the configured loss mode needs Top-K data, else None."""
    from epic_slime.losses import LOSS_MODES

    mode = getattr(args, "policy_loss", None) or "epic"
    if mode not in LOSS_MODES or not LOSS_MODES[mode].needs_topk:
        return None
    k = getattr(args, "policy_loss_topk", None)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"--policy-loss-topk must be an int >= 1, got {k!r}")
    return k


def build_payload(
    input_ids: list[int], sampling_params: dict[str, Any], k: int, *, routed_experts: bool = False
) -> dict:
    """The SGLang ``/generate`` request: token ids in, sampled log-probs and the top-k log-probs out."""
    payload = {
        "input_ids": list(input_ids),
        "sampling_params": sampling_params,
        "return_logprob": True,
        "top_logprobs_num": int(k),
    }
    if routed_experts:
        payload["return_routed_experts"] = True
    return payload


def _log_prob(value: Any, where: str) -> float:
    # JSON has no -inf: SGLang's serialiser writes a probability of 0 as null.
    if value is None:
        return -math.inf
    value = float(value)
    if math.isnan(value) or value > 0:
        raise ValueError(f"{where}: log-prob {value} is not in [-inf, 0]")
    return value


def parse_generated_tokens(meta_info: dict) -> tuple[list[int], list[float]]:
    """Sampled token ids and their log-probs from ``meta_info.output_token_logprobs``."""
    entries = meta_info.get("output_token_logprobs")
    if entries is None:
        raise ValueError("SGLang answered without meta_info.output_token_logprobs (the request sets return_logprob)")
    ids = [int(entry[1]) for entry in entries]
    log_probs = [_log_prob(entry[0], f"output_token_logprobs[{i}]") for i, entry in enumerate(entries)]
    return ids, log_probs


def parse_top_logprobs(meta_info: dict, k: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``meta_info.output_top_logprobs`` -> (ids int32 [num_tokens, k], log-probs float32 [num_tokens, k]).

    A position with fewer than k entries (or a null entry) is padded with id -1 / log-prob 0,
    which the loss treats as absent. Raises ValueError on a missing field, a length other than
    ``num_tokens``, more than k entries, negative ids or log-probs outside [-inf, 0].
    """
    rows = meta_info.get("output_top_logprobs")
    if rows is None:
        raise ValueError("SGLang answered without meta_info.output_top_logprobs (the request sets top_logprobs_num)")
    if len(rows) != num_tokens:
        raise ValueError(f"output_top_logprobs has {len(rows)} positions for {num_tokens} generated tokens")
    ids = torch.full((num_tokens, k), -1, dtype=torch.int32)
    log_probs = torch.zeros((num_tokens, k), dtype=torch.float32)
    for t, row in enumerate(rows):
        row = [entry for entry in (row or []) if entry is not None]
        if len(row) > k:
            raise ValueError(f"output_top_logprobs[{t}] has {len(row)} entries, more than top_logprobs_num={k}")
        for j, entry in enumerate(row):
            token = int(entry[1])
            if token < 0:
                raise ValueError(f"output_top_logprobs[{t}][{j}] has token id {token}")
            ids[t, j] = token
            log_probs[t, j] = _log_prob(entry[0], f"output_top_logprobs[{t}][{j}]")
    return ids, log_probs


def append_topk(sample: Any, previous_length: int, ids: torch.Tensor, log_probs: torch.Tensor) -> None:
    """Extend the sample's Top-K arrays to its response length: absent rows for tokens this call
    did not generate (earlier partial-rollout tokens), then the new rows."""
    k = ids.shape[1]
    old_ids = getattr(sample, TOPK_IDS_KEY, None)
    old_lps = getattr(sample, TOPK_LOG_PROBS_KEY, None)
    if old_ids is None:
        old_ids = torch.full((0, k), -1, dtype=torch.int32)
        old_lps = torch.zeros((0, k), dtype=torch.float32)
    if old_ids.shape[1] != k:
        raise ValueError(f"sample already holds top-{old_ids.shape[1]} rows; this call returned top-{k}")
    missing = previous_length - old_ids.shape[0]
    if missing < 0:
        raise ValueError(f"sample holds {old_ids.shape[0]} Top-K rows for a response of {previous_length} tokens")
    setattr(sample, TOPK_IDS_KEY, torch.cat([old_ids, torch.full((missing, k), -1, dtype=torch.int32), ids]))
    setattr(sample, TOPK_LOG_PROBS_KEY, torch.cat([old_lps, torch.zeros((missing, k), dtype=torch.float32), log_probs]))


def apply_response(args: Any, sample: Any, output: dict, k: int) -> Any:
    """Record an SGLang answer on the sample: tokens, log-probs, status (slime's
    ``Sample.append_response_tokens``) and the Top-K rows."""
    meta_info = output["meta_info"]
    tokens, log_probs = parse_generated_tokens(meta_info)
    topk_ids, topk_log_probs = parse_top_logprobs(meta_info, k, len(tokens))
    previous_length = sample.response_length
    sample.append_response_tokens(
        args, tokens=tokens, log_probs=log_probs, trainable=True, meta_info=meta_info, text=output.get("text", "")
    )
    append_topk(sample, previous_length, topk_ids, topk_log_probs)
    return sample


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    from slime.rollout import sglang_rollout

    k = topk_for_args(args)
    if evaluation or k is None:
        return await sglang_rollout.generate(args, sample, sampling_params)

    from slime.utils.http_utils import post
    from slime.utils.types import Sample

    if sample.status not in (Sample.Status.PENDING, Sample.Status.ABORTED):
        raise ValueError(f"generate: sample {sample.index} has status {sample.status}, expected PENDING or ABORTED")
    if sample.multimodal_inputs and any(v is not None for v in sample.multimodal_inputs.values()):
        raise ValueError("epic_slime.slime.generate supports text prompts only (the Top-K modes)")
    params = dict(sampling_params)
    params["max_new_tokens"] -= sample.response_length  # a resumed partial rollout continues
    if params["max_new_tokens"] <= 0:
        sample.status = Sample.Status.TRUNCATED
        return sample
    if not sample.tokens:
        state = sglang_rollout.GenerateState(args)
        sample.tokens = state.tokenizer.encode(sample.prompt, add_special_tokens=False)
    payload = build_payload(
        sample.tokens, params, k, routed_experts=bool(getattr(args, "use_rollout_routing_replay", False))
    )
    headers = None
    if sample.session_id and getattr(args, "router_policy", None) == "consistent_hashing":
        headers = {ROUTING_KEY_HEADER: sample.session_id}
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    output = await post(url, payload, headers=headers)
    return apply_response(args, sample, output, k)
