"""The synthetic tasks' shared text format: vocabulary, tokenizer, problems, and the exact verifier.

Prompt  : <bos> 3+5-2=
Response: 3+5=8;8-2=6;Answer:6<eos>

The tokenizer is character level plus two specials (`Answer:` is one token so that the verifier
and the model agree on where the answer starts). The tasks themselves (which problems, which are
held out) are `task_arith` and `task_chain`, chosen by name through the registry `tasks.TASKS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
ANSWER = "Answer:"
_CHARS = list("0123456789+-*=;")
VOCAB: list[str] = [PAD, BOS, EOS, *_CHARS, ANSWER]


class Tokenizer:
    """Character tokenizer for the synthetic task (vocabulary of 19 tokens)."""

    def __init__(self) -> None:
        self.vocab = list(VOCAB)
        self.token_to_id = {t: i for i, t in enumerate(self.vocab)}
        self.pad_id = self.token_to_id[PAD]
        self.bos_id = self.token_to_id[BOS]
        self.eos_id = self.token_to_id[EOS]
        self.answer_id = self.token_to_id[ANSWER]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            if text.startswith(ANSWER, i):
                ids.append(self.answer_id)
                i += len(ANSWER)
                continue
            ch = text[i]
            if ch not in self.token_to_id:
                raise ValueError(f"tokenizer: character {ch!r} at position {i} of {text!r} is not in the vocabulary")
            ids.append(self.token_to_id[ch])
            i += 1
        return ids

    def decode(self, ids: list[int], stop_at_eos: bool = True) -> str:
        out = []
        for i in ids:
            if stop_at_eos and i == self.eos_id:
                break
            if i in (self.pad_id, self.bos_id):
                continue
            out.append(self.vocab[i] if 0 <= i < len(self.vocab) else "?")
        return "".join(out)


@dataclass(frozen=True)
class TaskConfig:
    min_operands: int = 2
    max_operands: int = 3
    max_operand: int = 9  # operands are drawn from 0..max_operand
    ops: str = "+-"  # any of "+-*"
    eval_num_prompts: int = 64  # size of the held-out split actually evaluated
    eval_fraction: float = 0.1  # share of all problems reserved for held-out evaluation
    name: str = "arith"  # a key of `epic_slime.runtime.tasks.TASKS`

    def validate(self) -> None:
        """The ranges every task shares; `tasks.validate_task_config` adds the task's own limits."""
        if not 2 <= self.min_operands <= self.max_operands:
            raise ValueError(
                f"task: need 2 <= task_min_operands ({self.min_operands}) <= task_max_operands ({self.max_operands})"
            )
        if not 1 <= self.max_operand <= 99:
            raise ValueError(f"task_max_operand must be in [1, 99], got {self.max_operand}")
        if not self.ops or any(o not in "+-*" for o in self.ops):
            raise ValueError(f"task_ops must be a non-empty string of '+', '-', '*', got {self.ops!r}")
        if not 1 <= self.eval_num_prompts <= 4096:
            raise ValueError(f"task_eval_num_prompts must be in [1, 4096], got {self.eval_num_prompts}")
        if not 0.0 < self.eval_fraction < 0.5:
            raise ValueError(f"task_eval_fraction must be in (0, 0.5), got {self.eval_fraction}")


@dataclass(frozen=True)
class Problem:
    prompt: str  # e.g. "3+5-2="
    solution: str  # e.g. "3+5=8;8-2=6;Answer:6"
    answer: int


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def make_problem(operands: list[int], ops: list[str], modulus: int | None = None, slip=None) -> Problem:
    """Left-to-right evaluation, one step per operator (no precedence: the steps say the order);
    with ``modulus`` every step's result is reduced modulo it (the study's chain task).
    ``slip(result) -> result`` rewrites each step's result (the warm start's careless solver); the next
    step carries the rewritten value on, and `answer` is then what that solution ends with."""
    steps, acc = [], operands[0]
    for op, b in zip(ops, operands[1:]):
        new = _apply(acc, op, b) if modulus is None else _apply(acc, op, b) % modulus
        if slip is not None:
            new = slip(new)
        steps.append(f"{acc}{op}{b}={new};")
        acc = new
    prompt = str(operands[0]) + "".join(f"{op}{b}" for op, b in zip(ops, operands[1:])) + "="
    return Problem(prompt=prompt, solution="".join(steps) + f"{ANSWER}{acc}", answer=acc)


_ANSWER_RE = re.compile(r"Answer:(-?\d+)$")


def parse_answer(response_text: str) -> int | None:
    """Integer after the final `Answer:` when it ends the response, else None."""
    m = _ANSWER_RE.search(response_text)
    return int(m.group(1)) if m else None


def answer_reward(response_ids: list[int], label: int, tokenizer: Tokenizer) -> float:
    """Exact verifier: 1.0 iff the response ends with <eos> right after `Answer:<label>`.

    A truncated response (no <eos>) scores 0 even if its last digits happen to match: the answer
    line was never finished."""
    if tokenizer.eos_id not in response_ids:
        return 0.0
    answer = parse_answer(tokenizer.decode(response_ids, stop_at_eos=True))
    return 1.0 if answer is not None and answer == int(label) else 0.0
