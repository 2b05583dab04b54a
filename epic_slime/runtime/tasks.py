"""The task registry: a run's `--task-name` picks one of `TASKS`, and every caller asks for problems
through it (the driver, the warm start, the study, the benches), never a task module directly.

A task is a module-sized bundle: how to draw the index-th training problem of a seed, which prompts
are held out for evaluation, the modulus of its step results (None: plain integers) and its limit on
operands. Both tasks share the text format and verifier of `epic_slime.runtime.task`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import task_arith, task_calc, task_chain, task_fib
from .task import Problem, TaskConfig


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    max_operands: int
    modulus: int | None
    train_problem: Callable[[int, int, TaskConfig], Problem]
    eval_problems: Callable[[TaskConfig], list[Problem]]
    # the study's held-out splits (None: the task has only its `eval_problems`)
    split_problems: Callable[[str, TaskConfig], list[Problem]] | None = None
    validate: Callable[[TaskConfig], None] | None = None  # the task's own config rules
    # the warm start's careless solver for this task (None: the generic one, operands read from the prompt)
    slipped_solution: Callable | None = None
    # a tool-using task (multi-turn rollouts, ``rollout_agent``) with its own supervised warm start
    agent: bool = False
    supervised_warm_start: Callable | None = None


def _calc_train_problem(index: int, seed: int, cfg: TaskConfig) -> Problem:
    return task_calc.train_problem(index, seed)


def _calc_eval_problems(cfg: TaskConfig) -> list[Problem]:
    return task_calc.eval_problems(cfg.eval_num_prompts)


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            task_arith.NAME,
            "multi-step integer arithmetic, 2..6 operands (the embedded default)",
            task_arith.MAX_OPERANDS,
            task_arith.MODULUS,
            task_arith.train_problem,
            task_arith.eval_problems,
        ),
        Task(
            task_chain.NAME,
            "chains of single-digit steps modulo 10 (the study's long-response task)",
            task_chain.MAX_OPERANDS,
            task_chain.MODULUS,
            task_chain.train_problem,
            task_chain.eval_problems,
            task_chain.split_problems,
        ),
        # the stress ladder's long-response variant: the same problems and splits, up to 40 operands
        # (34 operands: 33 steps, 201 response tokens), so that prefix log-ratios accumulate
        Task(
            "chain_long",
            "the chain task with up to 40 operands (200+ token responses; the stress ladder)",
            task_chain.LONG_MAX_OPERANDS,
            task_chain.MODULUS,
            task_chain.train_problem,
            task_chain.eval_problems,
            task_chain.split_problems,
        ),
        # the mechanism study's task: N local steps (`task_max_operands`), 6N + 3 response tokens
        Task(
            task_fib.NAME,
            "Fibonacci-like chains modulo 10 from two digits: N local steps, 6N+3 tokens",
            task_fib.MAX_STEPS,
            task_fib.MODULUS,
            task_fib.train_problem,
            task_fib.eval_problems,
            task_fib.split_problems,
            task_fib.validate,
            task_fib.slipped_solution,
        ),
        # the agent task: products of two two-digit numbers through the calc tool; the operand fields
        # do not apply (its max_operands 3 only lets their defaults stand)
        Task(
            task_calc.NAME,
            "products of two-digit numbers through the calc tool (multi-turn rollouts, tool tokens mask 0)",
            3,
            None,
            _calc_train_problem,
            _calc_eval_problems,
            agent=True,
            supervised_warm_start=task_calc.supervised_warm_start,
        ),
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
    if task.validate is not None:
        task.validate(cfg)
    if cfg.max_operands > task.max_operands:
        raise ValueError(
            f"task: need 2 <= task_min_operands ({cfg.min_operands}) <= task_max_operands "
            f"({cfg.max_operands}) <= {task.max_operands}"
        )


def train_problem(index: int, seed: int, cfg: TaskConfig) -> Problem:
    """The index-th training problem of a seed for the configured task."""
    return get_task(cfg.name).train_problem(index, seed, cfg)


def eval_problems(cfg: TaskConfig) -> list[Problem]:
    """The held-out prompts the runtime evaluates (`eval/heldout/*`) for the configured task."""
    return get_task(cfg.name).eval_problems(cfg)


def split_problems(split: str, cfg: TaskConfig) -> list[Problem]:
    """The study's validation or test prompts of the configured task."""
    task = get_task(cfg.name)
    if task.split_problems is None:
        raise ValueError(f"task {cfg.name!r} has no validation/test splits (the study needs chain, chain_long or fib)")
    return task.split_problems(split, cfg)
