"""Shared helpers for the runtime tests: a tiny, fast configuration of the embedded runtime."""

from __future__ import annotations

import json
from pathlib import Path

from epic_slime.runtime.config import parse_config

REPO = Path(__file__).resolve().parents[2]

# Small enough for CI (2 cores): 4 prompts x 4 samples per step, 8 held-out prompts x 2 samples.
TINY_FLAGS = [
    "--rollout-batch-size",
    "4",
    "--n-samples-per-prompt",
    "4",
    "--update-depth",
    "2",
    "--num-rollout-workers",
    "2",
    "--num-rollout",
    "4",
    "--eval-interval",
    "2",
    "--n-samples-per-eval-prompt",
    "2",
    "--task-eval-num-prompts",
    "8",
    "--warm-start-steps",
    "20",
    "--warm-start-batch-size",
    "16",
    "--rollout-max-response-len",
    "16",
    "--lr",
    "3e-4",
    "--no-progress",
    "--on-bad-tokens",
    "raise",
]


def tiny_config(tmp_path: Path, *extra: str, name: str = "run"):
    return parse_config(
        [
            *TINY_FLAGS,
            "--output-dir",
            str(tmp_path / name),
            "--warm-start-cache-dir",
            str(tmp_path / "warm_cache"),
            *extra,
        ]
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]


def tiny_trainer(**kw):
    """A trainer on the tiny model, 16 samples it generated (4 groups, rewards alternating so every
    advantage is non-zero) and its initial state; ``kw`` overrides the trainer's arguments."""
    import torch

    from epic_slime.runtime.model import ModelConfig, build_policy
    from epic_slime.runtime.rollout import PolicyEngine
    from epic_slime.runtime.task import TaskConfig, Tokenizer
    from epic_slime.runtime.tasks import train_problem
    from epic_slime.runtime.trainer import PolicyTrainer, group_advantages

    tok = Tokenizer()
    torch.set_num_threads(1)
    state = {
        k: v.clone()
        for k, v in build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=0)
        .state_dict()
        .items()
    }
    engine = PolicyEngine(ModelConfig(), state, 0)
    reqs = [(i, train_problem(i, 0, TaskConfig())) for i in range(4)]
    groups = engine.generate(reqs, n_samples=4, temperature=1.0, top_p=1.0, max_new_tokens=12, seed=0)
    samples = []
    for g in groups:
        # synthetic rewards so that every group has a non-zero advantage
        for j, (s, a) in enumerate(zip(g.samples, group_advantages([float(j % 2) for j in range(len(g))]))):
            samples.append({**s, "advantage": a})
    args = dict(
        model_cfg=ModelConfig(),
        init_state=state,
        policy_loss="epic",
        policy_loss_params={},
        policy_loss_aggregation=None,
        update_depth=2,
        lr=1e-3,
        weight_decay=0.0,
        clip_grad=1.0,
        kl_loss_coef=0.0,
        temperature=1.0,
        seed=0,
    )
    args.update(kw)
    return PolicyTrainer(**args), samples, state
