"""The calc agent task's learning run on CPU (issue 44 item 4): a supervised warm start that teaches the
call format, then synchronous RL (GRPO advantages, the runtime's ``PolicyTrainer`` with its loss-mask
handling) with and without the tool, from the same warm start and the same seeds.

    python -m epic_slime.runtime.agent_train [OUT.json]

prints one JSON line per (seed, arm) and writes them, with the settings, to OUT.json. The settings
(``RUN``) and seeds (``SEEDS``) are fixed here, before any run; ``chance`` is the task's
(``task_calc.chance``).

The warm start is short on purpose: the model learns to restate the product as a call and to copy the
tool's answer, but not reliably, so RL has accuracy to gain. Its target never includes the tool's
digits (loss mask 0 there, as in RL), so it cannot learn the products themselves.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import torch

from . import task_calc
from .model import ModelConfig, build_policy
from .task import Tokenizer
from .trainer import PolicyTrainer, group_advantages

SEEDS = (1, 2, 3)


@dataclasses.dataclass(frozen=True)
class AgentRun:
    warm_steps: int = 60
    warm_batch: int = 32
    warm_lr: float = 3e-3
    rl_steps: int = 20
    prompts_per_step: int = 8
    samples_per_prompt: int = 8
    # 1e-3 in the first run (docs/agent_task/run_lr1e-3.json), which collapsed on seed 3; 3e-4 chosen
    # after it on seeds 0, 4 and 5, outside the reported seeds
    rl_lr: float = 3e-4
    update_depth: int = 2
    policy_loss: str = "epic"
    eval_prompts: int = 64
    eval_samples: int = 4
    max_turns: int = 3
    max_new_tokens: int = 24


RUN = AgentRun()


def _policy(seed: int):
    tok = Tokenizer()
    return build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=seed)


def warm_start(seed: int, run: AgentRun = RUN) -> dict:
    """The task's supervised warm start (``task_calc.supervised_warm_start``, shared with the runtime's
    ``--task-name calc``) at this run's settings."""
    return task_calc.supervised_warm_start(
        ModelConfig(), steps=run.warm_steps, batch_size=run.warm_batch, lr=run.warm_lr, seed=seed
    )


@torch.no_grad()
def evaluate(state: dict, tool: bool, seed: int, run: AgentRun = RUN) -> dict:
    """mean@k on the held-out products (k = ``eval_samples``, temperature 1), with the tool's counts."""
    model = _policy(seed).eval()
    model.load_state_dict(state)
    cfg = task_calc.AgentSampling(tool=tool, max_turns=run.max_turns, max_new_tokens=run.max_new_tokens)
    samples = task_calc.sample_with_tool(
        model,
        task_calc.eval_problems(run.eval_prompts),
        run.eval_samples,
        cfg,
        task_calc.request_generator(seed, "eval"),
    )
    return trajectory_stats(samples)


def trajectory_stats(samples: list[dict]) -> dict:
    n = len(samples)
    return {
        "accuracy": sum(s["reward"] for s in samples) / n,
        "tool_calls_per_response": sum(s["tool_calls"] for s in samples) / n,
        "tool_errors_per_response": sum(s["tool_errors"] for s in samples) / n,
        "turns_per_response": sum(s["turns"] for s in samples) / n,
        "responses": n,
    }


def reinforce(state: dict, tool: bool, seed: int, run: AgentRun = RUN) -> tuple[dict, list[dict]]:
    """``rl_steps`` synchronous steps (each on fresh prompts, sampled by the current weights)."""
    from .config import parse_config

    cfg = parse_config(["--policy-loss", run.policy_loss])
    trainer = PolicyTrainer(
        model_cfg=ModelConfig(),
        init_state=state,
        policy_loss=cfg.policy_loss,
        policy_loss_params=cfg.policy_loss_params,
        policy_loss_aggregation=cfg.policy_loss_aggregation,
        update_depth=run.update_depth,
        lr=run.rl_lr,
        weight_decay=0.0,
        clip_grad=1.0,
        kl_loss_coef=0.0,
        temperature=1.0,
        seed=seed,
    )
    sampler = _policy(seed).eval()
    sampling = task_calc.AgentSampling(tool=tool, max_turns=run.max_turns, max_new_tokens=run.max_new_tokens)
    gen = task_calc.request_generator(seed, "rollout")
    history = []
    for step in range(run.rl_steps):
        sampler.load_state_dict(trainer.get_weights())
        first = 1_000_000 + step * run.prompts_per_step  # past the warm start's problems
        problems = [task_calc.train_problem(first + j, seed) for j in range(run.prompts_per_step)]
        with torch.no_grad():
            samples = task_calc.sample_with_tool(sampler, problems, run.samples_per_prompt, sampling, gen)
        batch = []
        for g in range(run.prompts_per_step):
            group = samples[g * run.samples_per_prompt : (g + 1) * run.samples_per_prompt]
            for s, adv in zip(group, group_advantages([s["reward"] for s in group])):
                batch.append({**s, "advantage": adv})
        trainer.train_step(batch)
        history.append({"step": step, **trajectory_stats(samples)})
    return trainer.get_weights(), history


def run_seed(seed: int, run: AgentRun = RUN) -> list[dict]:
    """The warm start, then each arm (tool, no tool) from it: their held-out mean@k before and after RL."""
    t0 = time.time()
    state = warm_start(seed, run)
    rows = []
    for tool in (True, False):
        before = evaluate(state, tool, seed, run)
        after_state, history = reinforce(state, tool, seed, run)
        after = evaluate(after_state, tool, seed, run)
        rows.append(
            {
                "seed": seed,
                "arm": "tool" if tool else "no_tool",
                "warm_start": before,
                "after_rl": after,
                "rl_train_reward_first_last": [history[0]["accuracy"], history[-1]["accuracy"]],
                "seconds": round(time.time() - t0, 1),
            }
        )
    return rows


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    out = argv[0] if argv else None
    rows = []
    for seed in SEEDS:
        for row in run_seed(seed):
            rows.append(row)
            print(json.dumps(row), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump(
                {"settings": dataclasses.asdict(RUN), "seeds": list(SEEDS), "chance": task_calc.chance(), "rows": rows},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
