"""The arithmetic task (the embedded default): short multi-step integer arithmetic.

Prompt  : <bos>3+5-2=
Response: 3+5=8;8-2=6;Answer:6<eos>

Problems are a pure function of (seed, index), so a data position is a single integer and a resumed
run draws exactly the prompts it would have drawn. The held-out split is fixed by a hash of the
problem text, independent of the seed, and the train sampler never returns a held-out problem.
"""

from __future__ import annotations

import hashlib
import random
import re

from .task import Problem, TaskConfig, make_problem

NAME = "arith"
MODULUS = None
MAX_OPERANDS = 6


def _random_problem(rng: random.Random, cfg: TaskConfig) -> Problem:
    n = rng.randint(cfg.min_operands, cfg.max_operands)
    operands = [rng.randint(0, cfg.max_operand) for _ in range(n)]
    ops = [rng.choice(cfg.ops) for _ in range(n - 1)]
    return make_problem(operands, ops)


def is_heldout(prompt: str, cfg: TaskConfig) -> bool:
    h = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big")
    return (h % 10_000) < cfg.eval_fraction * 10_000


def train_problem(index: int, seed: int, cfg: TaskConfig) -> Problem:
    """The index-th training problem of a seed (rejection-samples away from the held-out split)."""
    rng = random.Random(f"train/{seed}/{index}")
    while True:
        p = _random_problem(rng, cfg)
        if not is_heldout(p.prompt, cfg):
            return p


def eval_problems(cfg: TaskConfig) -> list[Problem]:
    """The held-out split: fixed for a task config (seed-independent), distinct prompts, stratified by
    operand count in the training proportions (as far as a stratum has enough held-out problems)."""
    rng = random.Random("heldout")
    counts = list(range(cfg.min_operands, cfg.max_operands + 1))
    strata: dict[int, dict[str, Problem]] = {n: {} for n in counts}
    quota = {
        n: cfg.eval_num_prompts // len(counts) + (1 if i < cfg.eval_num_prompts % len(counts) else 0)
        for i, n in enumerate(counts)
    }
    for _ in range(400_000):
        if all(len(strata[n]) >= quota[n] for n in counts):
            break
        p = _random_problem(rng, cfg)
        n = len(re.findall(r"\d+", p.prompt))
        if is_heldout(p.prompt, cfg) and len(strata[n]) < 4 * quota[n]:
            strata[n].setdefault(p.prompt, p)
    out: list[Problem] = []
    for n in counts:  # a small stratum gives what it has; the others fill up the total
        out.extend(list(strata[n].values())[: quota[n]])
    spare = [p for n in counts for p in list(strata[n].values())[quota[n] :]]
    out.extend(spare[: cfg.eval_num_prompts - len(out)])
    if len(out) < cfg.eval_num_prompts:
        raise ValueError(
            f"task_eval_num_prompts={cfg.eval_num_prompts} exceeds the {len(out)} held-out problems this task "
            f"config has; lower it or widen the task (task_max_operand, task_max_operands)"
        )
    return out
