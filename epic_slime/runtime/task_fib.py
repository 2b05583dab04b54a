"""The Fibonacci chain task: a long response made of local steps the model can learn.

Prompt  : <bos>3+7=
Response: 3+7=0;7+0=7;0+7=7;7+7=4;...;Answer:4<eos>

Each step `a op b = c;` takes its two operands from the step before (a copy 4 and 2 tokens back) and
its result modulo 10 from them: nothing is fetched from a far position of the prompt (the chain task's
k-th operand lookup, which a 2-layer model did not learn at 33 steps). `op` is the prompt's operator
for every step ('+': Fibonacci mod 10; '-': c = a - b mod 10). The number of steps N is the task's
`task_max_operands` (and `task_min_operands` must equal it: the prompt does not say N), so every
response is 6N + 3 tokens: N = 8 gives 51, N = 100 gives 603, N = 300 gives 1803.

There are 200 prompts (10 x 10 starting digits, 2 operators); split by a fixed hash of the prompt:
20% validation, 20% test, 60% train (so each held-out split has about 40 prompts). The answer is
uniform over the 10 digits for either operator, since (a, b) -> (b, a op b) is a bijection of pairs
modulo 10: chance is 0.10, which the study computes rather than assumes.
"""

from __future__ import annotations

import hashlib
import random
import re

from .task import ANSWER, Problem, TaskConfig

NAME = "fib"
MODULUS = 10
MAX_STEPS = 400
_VALIDATION_SHARE = 0.2
_TEST_SHARE = 0.2


def make_fib_problem(a: int, op: str, b: int, steps: int, slip=None) -> Problem:
    """The N-step chain from digits a, b. slip(result) -> result rewrites each step's result (the
    warm start's careless solver); the wrong value is carried on by the following steps."""
    if not (0 <= a <= 9 and 0 <= b <= 9) or op not in "+-" or len(op) != 1 or steps < 1:
        raise ValueError(f"fib problem: digits a, b, op '+' or '-', steps >= 1; got {a}, {op!r}, {b}, {steps}")
    x, y, parts = a, b, []
    for _ in range(steps):
        c = (x + y) % MODULUS if op == "+" else (x - y) % MODULUS
        if slip is not None:
            c = slip(c) % MODULUS
        parts.append(f"{x}{op}{y}={c};")
        x, y = y, c
    return Problem(prompt=f"{a}{op}{b}=", solution="".join(parts) + f"{ANSWER}{y}", answer=y)


def steps_of(cfg: TaskConfig) -> int:
    return cfg.max_operands


def validate(cfg: TaskConfig) -> None:
    if cfg.min_operands != cfg.max_operands:
        raise ValueError(
            f"task fib: task_min_operands ({cfg.min_operands}) must equal task_max_operands "
            f"({cfg.max_operands}), the number of steps (the prompt does not state it)"
        )
    if any(o not in "+-" for o in cfg.ops):
        raise ValueError(f"task fib: task_ops must be a subset of '+-', got {cfg.ops!r}")


def split_of(prompt: str) -> str:
    h = int.from_bytes(hashlib.sha256(f"fib-split/{prompt}".encode()).digest()[:8], "big") % 10_000
    if h < _VALIDATION_SHARE * 10_000:
        return "validation"
    if h < (_VALIDATION_SHARE + _TEST_SHARE) * 10_000:
        return "test"
    return "train"


def _starts(cfg: TaskConfig, split: str) -> list[tuple[int, str, int]]:
    return [(a, op, b) for op in cfg.ops for a in range(10) for b in range(10) if split_of(f"{a}{op}{b}=") == split]


def train_problem(index: int, seed: int, cfg: TaskConfig) -> Problem:
    """The index-th training problem of a seed (a train-split start, drawn uniformly)."""
    rng = random.Random(f"fib-train/{seed}/{index}")
    a, op, b = rng.choice(_starts(cfg, "train"))
    return make_fib_problem(a, op, b, steps_of(cfg))


def split_problems(split: str, cfg: TaskConfig) -> list[Problem]:
    """`cfg.eval_num_prompts` distinct prompts of the validation or test split (fixed order)."""
    if split not in ("validation", "test"):
        raise ValueError(f"split must be 'validation' or 'test', got {split!r}")
    starts = _starts(cfg, split)
    random.Random(f"fib-{split}").shuffle(starts)
    if len(starts) < cfg.eval_num_prompts:
        raise ValueError(
            f"task_eval_num_prompts={cfg.eval_num_prompts}: the fib task's {split} split has only "
            f"{len(starts)} prompts (ops {cfg.ops!r})"
        )
    return [make_fib_problem(a, op, b, steps_of(cfg)) for a, op, b in starts[: cfg.eval_num_prompts]]


def eval_problems(cfg: TaskConfig) -> list[Problem]:
    return split_problems("validation", cfg)


def slipped_solution(problem: Problem, rng: random.Random, step_noise: float) -> str:
    """The warm start's target: each step's result wrong with probability step_noise (off by 1..9 mod 10)."""
    m = re.fullmatch(r"(\d)([+-])(\d)=", problem.prompt)
    if m is None:
        raise ValueError(f"fib: not a fib prompt: {problem.prompt!r}")

    def slip(c: int) -> int:
        return c if rng.random() >= step_noise else c + rng.randint(1, MODULUS - 1)

    steps = problem.solution.count(";")
    return make_fib_problem(int(m[1]), m[2], int(m[3]), steps, slip=slip).solution
