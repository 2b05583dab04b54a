"""Tool tokens never enter the runtime trainer's loss on the agent task's own trajectories (issue 44
items 2 and 4): trajectories sampled by the calc task's per-turn rollout (``rollout_agent``), their
tool tokens' behaviour log-probs set to an absurd +50, trained for one step by ``PolicyTrainer``. Its
loss equals, to float32 precision, the loss computed with the tool spans CUT OUT (the model tokens'
log-probs, behaviour log-probs and mask only, re-packed), in float64; and the gradient of the masked
loss equals the gradient of the cut-out one."""

from __future__ import annotations

import math

import pytest
import torch

from epic_slime import metric_names as names
from epic_slime.losses import compute_policy_loss
from epic_slime.runtime import rollout_agent
from epic_slime.runtime.model import ModelConfig, response_log_probs
from epic_slime.runtime.rollout import PolicyEngine
from epic_slime.runtime.task_calc import train_problem
from support.runtime_helpers import tiny_trainer

MODES = ["epic", "grpo", "gspo", "epic_cumulative"]


@pytest.fixture(scope="module")
def trajectories():
    """16 finished trajectories of the untrained tiny model with the tool (most hold a call), with
    alternating advantages and +50 on every tool token's behaviour log-prob."""
    torch.set_num_threads(1)
    _, _, state = tiny_trainer()
    engine = PolicyEngine(ModelConfig(), state, 0)
    pending, finished = [(i, train_problem(i, 0)) for i in range(4)], []
    sampling = dict(n_samples=4, temperature=1.0, top_p=1.0, max_new_tokens=24, seed=0, max_turns=3)
    while pending:  # one turn per call, as the rollout workers run it
        out = rollout_agent.generate_turn(engine, pending, **sampling)
        finished += [g for g in out if not g.unfinished]
        pending = [g for g in out if g.unfinished]
    samples = []
    for i, s in enumerate(s for g in sorted(finished, key=lambda g: g.group_id) for s in g.samples):
        behavior = [lp if m else 50.0 for lp, m in zip(s["behavior_log_probs"], s["loss_mask"])]
        samples.append({**s, "behavior_log_probs": behavior, "advantage": 1.0 if i % 2 else -1.0})
    assert sum(0 in s["loss_mask"] for s in samples) >= 4, "too few trajectories hold a tool span"
    return samples, state


def _cut_out(rows: torch.Tensor, samples: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's model-token columns, re-packed to the left; (values, mask)."""
    keep = [[t for t, m in enumerate(s["loss_mask"]) if m] for s in samples]
    width = max(len(k) for k in keep)
    values = torch.zeros(len(samples), width, dtype=rows.dtype)
    mask = torch.zeros(len(samples), width, dtype=torch.bool)
    for i, k in enumerate(keep):
        values[i, : len(k)] = rows[i, k]
        mask[i, : len(k)] = True
    return values, mask


@pytest.mark.parametrize("mode", MODES)
def test_the_loss_with_tool_spans_equals_the_loss_with_the_spans_cut_out(trajectories, mode):
    samples, state = trajectories
    trainer, _, _ = tiny_trainer(policy_loss=mode, update_depth=1)
    reference_model = trainer.model  # the loss is taken before the step's update: read it first
    prompts, responses = [s["prompt_ids"] for s in samples], [s["response_ids"] for s in samples]
    lp, valid = response_log_probs(reference_model, prompts, responses, 1.0, trainer.tok.pad_id)
    lp = lp.double()
    T = lp.shape[1]
    behavior = torch.zeros(len(samples), T, dtype=torch.float64)
    loss_mask = torch.zeros(len(samples), T, dtype=torch.bool)
    for i, s in enumerate(samples):
        n = len(s["response_ids"])
        behavior[i, :n] = torch.tensor(s["behavior_log_probs"], dtype=torch.float64)
        loss_mask[i, :n] = torch.tensor(s["loss_mask"], dtype=torch.bool)
    adv = torch.tensor([s["advantage"] for s in samples], dtype=torch.float64)
    kw = dict(aggregation=trainer.aggregation, **trainer.bad_tokens, **trainer.policy_loss_params)

    lp_leaf = lp.detach().requires_grad_(True)
    masked = compute_policy_loss(mode, lp_leaf, behavior, adv, valid & loss_mask, **kw).loss
    (grad_masked,) = torch.autograd.grad(masked, lp_leaf)
    lp_cut, mask_cut = _cut_out(lp_leaf, samples)
    beh_cut, _ = _cut_out(behavior, samples)
    cut = compute_policy_loss(mode, lp_cut, beh_cut, adv, mask_cut, **kw).loss
    (grad_cut,) = torch.autograd.grad(cut, lp_leaf)

    masked, cut = float(masked.detach()), float(cut.detach())
    assert math.isfinite(cut) and masked == pytest.approx(cut, rel=1e-12, abs=1e-12)
    assert torch.allclose(grad_masked, grad_cut, rtol=1e-12, atol=1e-15)
    assert (grad_cut[~loss_mask] == 0).all()  # no gradient reaches a tool token's log-prob
    metrics = trainer.train_step(samples)  # the runtime trainer itself, in float32
    assert metrics[names.PG_LOSS] == pytest.approx(cut, rel=1e-4, abs=1e-6)
