"""Probe: the step-start train-inference gap mean |log pi_train - log mu_rollout| per token that a rollout
engine's router noise (sigma) or bfloat16 gives, on a warm start (`bench/mismatch_probe.py WEIGHTS.pt
--steps N --sigmas 0 0.1 0.3`). Sets `rollout_router_noise` in configs/study/mechanism.yaml: the design asks
for a gap of about 0.01-0.02 nats per token at the injected level."""

from __future__ import annotations

import argparse
import json

import torch

from epic_slime.runtime.model import ModelConfig, build_policy, response_log_probs
from epic_slime.runtime.rollout import PolicyEngine
from epic_slime.runtime.task import TaskConfig, Tokenizer
from epic_slime.runtime.tasks import train_problem


def gap(
    state: dict,
    model_cfg: ModelConfig,
    task: TaskConfig,
    *,
    sigma: float,
    dtype: str,
    prompts: int,
    samples: int,
    seed: int = 0,
) -> dict:
    tok = Tokenizer()
    engine = PolicyEngine(model_cfg, state, 0, dtype=dtype, seed=seed, router_noise=sigma)
    reqs = [(i, train_problem(i, seed, task)) for i in range(prompts)]
    max_new = 6 * task.max_operands + 8
    groups = engine.generate(reqs, n_samples=samples, temperature=1.0, top_p=1.0, max_new_tokens=max_new, seed=seed)
    batch = [s for g in groups for s in g.samples]
    trainer = build_policy(model_cfg, tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed)
    trainer.load_state_dict(state)
    with torch.no_grad():
        lp, mask = response_log_probs(
            trainer, [s["prompt_ids"] for s in batch], [s["response_ids"] for s in batch], 1.0, tok.pad_id
        )
    mu = torch.zeros_like(lp)
    for i, s in enumerate(batch):
        mu[i, : len(s["behavior_log_probs"])] = torch.tensor(s["behavior_log_probs"])
    diff = (lp - mu) * mask
    n = mask.sum()
    return {
        "sigma": sigma,
        "dtype": dtype,
        "gap_abs_mean": float(diff.abs().sum() / n),
        "gap_mean": float(diff.sum() / n),
        "seq_logratio_abs_mean": float(diff.sum(1).abs().mean()),
        "reward_mean": sum(s["reward"] for s in batch) / len(batch),
        "tokens": int(n),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("weights")
    p.add_argument("--steps", type=int, required=True, help="fib task steps N")
    p.add_argument("--max-positions", type=int, default=1024)
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.0, 0.1, 0.3, 1.0])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--samples", type=int, default=4)
    a = p.parse_args()
    torch.set_num_threads(1)
    state = torch.load(a.weights, map_location="cpu", weights_only=True)
    mc = ModelConfig(max_positions=a.max_positions)
    task = TaskConfig(min_operands=a.steps, max_operands=a.steps, name="fib")
    for sigma in a.sigmas:
        print(
            json.dumps(gap(state, mc, task, sigma=sigma, dtype="float32", prompts=a.prompts, samples=a.samples)),
            flush=True,
        )
    print(json.dumps(gap(state, mc, task, sigma=0.0, dtype="bfloat16", prompts=a.prompts, samples=a.samples)))


if __name__ == "__main__":
    main()
