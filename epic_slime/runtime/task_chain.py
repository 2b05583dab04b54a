"""The chain task: long chains of intermediate results (reasoning-like responses for the loss).

Arithmetic modulo 10, left to right, one step per operator:

Prompt  : <bos>3+5-2+7-9+4+1-6+8=
Response: 3+5=8;8-2=6;6+7=3;3-9=4;4+4=8;8+1=9;9-6=3;3+8=1;Answer:1<eos>

Same tokenizer and verifier as the arithmetic task (`epic_slime.runtime.task`), but
`task_min_operands`..`task_max_operands` single-digit operands, so that every step `a op b = c;`
carries a fresh, uncertain result (c) next to exact copies (a, op, b): the policy's uncertainty is
spread over the whole response instead of sitting at one answer token. Modulo 10 keeps every number
one digit, so a tiny model can learn the steps. The study (`epic_slime.study`) chooses it by name.

Splits (by a fixed hash of the prompt, seed-independent): 5% validation (checkpoint selection,
what the runtime evaluates as `heldout`), 5% test (reported, never used to select), 90% train.
"""

from __future__ import annotations

import hashlib
import random

from .task import Problem, TaskConfig, make_problem

NAME = "chain"
MODULUS = 10
MAX_OPERANDS = 14
LONG_MAX_OPERANDS = 40  # the `chain_long` task (tasks.TASKS): same problems, longer chains
SPLITS = ("train", "validation", "test")
_VALIDATION_SHARE = 0.05
_TEST_SHARE = 0.05


def make_chain_problem(operands: list[int], ops: list[str]) -> Problem:
    """Left-to-right evaluation modulo 10 (operands 0..9), one `a op b = c;` step per operator."""
    if any(not 0 <= x <= 9 for x in operands) or any(o not in "+-" for o in ops) or len(ops) != len(operands) - 1:
        raise ValueError(f"chain problem: operands must be digits and ops '+'/'-', one fewer op; got {operands}, {ops}")
    return make_problem(operands, ops, modulus=MODULUS)


def _random_problem(rng: random.Random, cfg: TaskConfig) -> Problem:
    n = rng.randint(cfg.min_operands, cfg.max_operands)
    operands = [rng.randint(0, 9) for _ in range(n)]
    ops = [rng.choice("+-") for _ in range(n - 1)]
    return make_chain_problem(operands, ops)


def split_of(prompt: str) -> str:
    """The split a prompt belongs to (a pure function of the text)."""
    h = int.from_bytes(hashlib.sha256(f"chain-split/{prompt}".encode()).digest()[:8], "big") % 10_000
    if h < _VALIDATION_SHARE * 10_000:
        return "validation"
    if h < (_VALIDATION_SHARE + _TEST_SHARE) * 10_000:
        return "test"
    return "train"


def train_problem(index: int, seed: int, cfg: TaskConfig) -> Problem:
    """The index-th training problem of a seed (never a validation or test prompt)."""
    rng = random.Random(f"chain-train/{seed}/{index}")
    while True:
        p = _random_problem(rng, cfg)
        if split_of(p.prompt) == "train":
            return p


def split_problems(split: str, cfg: TaskConfig) -> list[Problem]:
    """`cfg.eval_num_prompts` distinct prompts of the validation or test split (fixed, seed-independent)."""
    if split not in ("validation", "test"):
        raise ValueError(f"split must be 'validation' or 'test', got {split!r}")
    rng = random.Random(f"chain-{split}")
    out: dict[str, Problem] = {}
    for _ in range(200_000):
        if len(out) >= cfg.eval_num_prompts:
            break
        p = _random_problem(rng, cfg)
        if split_of(p.prompt) == split:
            out.setdefault(p.prompt, p)
    if len(out) < cfg.eval_num_prompts:
        raise ValueError(
            f"task_eval_num_prompts={cfg.eval_num_prompts}: the {split} split of this task config "
            f"has only {len(out)} distinct prompts found"
        )
    return list(out.values())


def eval_problems(cfg: TaskConfig) -> list[Problem]:
    """What the runtime evaluates as `heldout`: the validation split (the test split is the study's)."""
    return split_problems("validation", cfg)
