"""R3 with tool spans (issue 44, item 2): a multi-turn trajectory built with slime 624b824a's own
``Sample.append_response_tokens`` (tool output with ``trainable=False``: no routing recorded).

- A tool span inside the response gets its rows from the next turn's prefill, which is the routing
  the engine computed those tokens with; the stream's merge keeps them.
- A trajectory that ends with a tool's output has no rows for its last tool tokens. Before the fix
  ``finish_group_routing`` refused every such sample (a shape error); now those rows are filled,
  because no trained log-prob depends on them (causal attention: row p reaches logits p and after,
  and every token they score is a tool token). A missing row that a loss token depends on is still
  refused. slime's own R3 check accepts the result.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from support.preconditions import slime_or_skip

with slime_or_skip("needs slime's source (set SLIME_PATH)"):
    from slime.observability.rollout_data_utils import validate_rollout_routed_experts_for_replay
    from slime.utils.types import Sample

from epic_slime.slime import routing  # noqa: E402

LAYERS, TOPK, EXPERTS = 3, 2, 8


def _args():
    return argparse.Namespace(
        num_layers=LAYERS, moe_router_topk=TOPK, num_experts=EXPERTS, use_rollout_routing_replay=True, moe_layer_freq=1
    )


def _rows(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, EXPERTS, (n, LAYERS, TOPK), generator=g, dtype=torch.int32)


def _turn(args, sample, n_tokens, rows, finish):
    meta = {"routed_experts": rows.reshape(-1).tolist(), "finish_reason": {"type": finish}, "weight_version": "1"}
    sample.append_response_tokens(args, tokens=[5] * n_tokens, log_probs=[-0.5] * n_tokens, meta_info=meta)


def _trajectory(end_with_tool: bool):
    """prompt 6, turn 1 (4 tokens), tool output (3), turn 2 (5 tokens) [, tool output (4)]."""
    args = _args()
    sample = Sample(index=0, tokens=list(range(6)))
    turn1 = _rows(6 + 4 - 1, seed=1)
    _turn(args, sample, 4, turn1, "stop")
    sample.append_response_tokens(args, tokens=[7, 7, 7], trainable=False)
    routing.remember_partial_routing([sample])  # what the project's generate function does between turns
    turn2 = _rows(len(sample.tokens) + 5 - 1, seed=2)  # SGLang: rows for the whole sequence
    _turn(args, sample, 5, turn2, "stop")
    if end_with_tool:
        sample.append_response_tokens(args, tokens=[7] * 4, trainable=False)
    return args, sample, turn1, turn2


def test_tool_rows_inside_the_response_come_from_the_next_turns_prefill():
    args, sample, turn1, turn2 = _trajectory(end_with_tool=False)
    routing.finish_group_routing(args, [sample])
    got = sample.rollout_routed_experts.to(torch.int32)
    assert got.shape == (len(sample.tokens) - 1, LAYERS, TOPK)
    assert torch.equal(got[: turn1.shape[0]], turn1)  # turn 1's tokens keep the routes they were sampled with
    assert torch.equal(got[turn1.shape[0] :], turn2[turn1.shape[0] :])  # tool + turn 2: the prefill's rows


def test_trailing_tool_output_gets_rows_no_trained_token_depends_on():
    args, sample, turn1, turn2 = _trajectory(end_with_tool=True)
    assert sample.rollout_routed_experts.shape[0] == len(sample.tokens) - 1 - 4  # slime records none for them
    routing.finish_group_routing(args, [sample])
    got = sample.rollout_routed_experts.to(torch.int32)
    assert got.shape == (len(sample.tokens) - 1, LAYERS, TOPK)
    assert torch.equal(got[: turn1.shape[0]], turn1)
    assert torch.equal(got[turn1.shape[0] : turn2.shape[0]], turn2[turn1.shape[0] :])
    filled = got[turn2.shape[0] :]
    assert torch.equal(filled, torch.arange(TOPK, dtype=torch.int32).expand(4, LAYERS, TOPK))
    # the filled rows start at the logit that scores the first trailing tool token: nothing trained after
    prompt = len(sample.tokens) - sample.response_length
    assert sample.loss_mask[turn2.shape[0] + 1 - prompt :] == [0] * 4
    validate_rollout_routed_experts_for_replay([got], args)  # slime's own R3 check


def test_a_missing_row_that_a_trained_token_depends_on_is_refused():
    args, sample, _, _ = _trajectory(end_with_tool=True)
    sample.loss_mask[-1] = 1  # the last token is now a model token scored by a missing row
    with pytest.raises(ValueError, match=r"rollout_routed_experts has shape \(17, 3, 2\), expected \(21, 3, 2\)"):
        routing.finish_group_routing(args, [sample])
