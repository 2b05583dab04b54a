"""The task registry: a run's `--task-name` picks one of `TASKS`, and every caller asks for problems
through it (the driver, the warm start, the study, the benches), never a task module directly.

A task is a module-sized bundle: how to draw the index-th training problem of a seed, which prompts
are held out for evaluation, the modulus of its step results (None: plain integers) and its limit on
operands. Both tasks share the text format and verifier of `epic_slime.runtime.task`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import task_arith, task_chain
from .task import Problem, TaskConfig


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    max_operands: int
    modulus: int | None
    train_problem: Callable[[int, int, TaskConfig], Problem]
    eval_problems: Callable[[TaskConfig], list[Problem]]


TASKS: dict[str, Task] = {
    t.name: t for t in (
        Task(task_arith.NAME, "multi-step integer arithmetic, 2..6 operands (the embedded default)",
             task_arith.MAX_OPERANDS, task_arith.MODULUS, task_arith.train_problem, task_arith.eval_problems),
        Task(task_chain.NAME, "chains of single-digit steps modulo 10 (the study's long-response task)",
             task_chain.MAX_OPERANDS, task_chain.MODULUS, task_chain.train_problem, task_chain.eval_problems),
        # the stress ladder's long-response variant: the same problems and splits, up to 40 operands
        # (34 operands: 33 steps, 201 response tokens), so that prefix log-ratios accumulate
        Task("chain_long", "the chain task with up to 40 operands (200+ token responses; the stress ladder)",
             task_chain.LONG_MAX_OPERANDS, task_chain.MODULUS, task_chain.train_problem, task_chain.eval_problems),
    )
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"task_name must be one of {sorted(TASKS)}, got {name!r}")
    return TASKS[name]


def validate_task_config(cfg: TaskConfig) -> None:
    """The generic ranges (`TaskConfig.validate`) and the chosen task's own operand limit."""
    task = get_task(cfg.name)
    cfg.validate()
    if cfg.max_operands > task.max_operands:
        raise ValueError(f"task: need 2 <= task_min_operands ({cfg.min_operands}) <= task_max_operands "
                         f"({cfg.max_operands}) <= {task.max_operands}")


def train_problem(index: int, seed: int, cfg: TaskConfig) -> Problem:
    """The index-th training problem of a seed for the configured task."""
    return get_task(cfg.name).train_problem(index, seed, cfg)


def eval_problems(cfg: TaskConfig) -> list[Problem]:
    """The held-out prompts the runtime evaluates (`eval/heldout/*`) for the configured task."""
    return get_task(cfg.name).eval_problems(cfg)
