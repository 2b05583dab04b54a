"""bench/fib_step_errors.py's per-step check: one slip is one arithmetic error (the later steps are judged
from the values the response carried), a wrong operand is a copy error, a broken step ends the check."""

import importlib.util
from pathlib import Path

from epic_slime.runtime.task_fib import make_fib_problem

_spec = importlib.util.spec_from_file_location(
    "fib_step_errors", Path(__file__).resolve().parents[2] / "bench" / "fib_step_errors.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_a_right_chain_has_no_error_and_every_step_checked():
    p = make_fib_problem(3, "+", 7, 8)
    v = bench.check_chain(p.prompt, p.solution, 8)
    assert (v["steps"], v["copy"], v["arith"], v["format"]) == (8, 0, 0, 0)


def test_one_slip_carried_on_is_one_arithmetic_error_at_its_step():
    slips = iter([False, False, True] + [False] * 10)
    p = make_fib_problem(4, "-", 9, 8, slip=lambda c: c + 1 if next(slips) else c)  # step 2's result off by 1
    v = bench.check_chain("4-9=", p.solution, 8)
    assert v["arith"] == 1 and v["arith_at"] == [2] and v["copy"] == 0 and v["steps"] == 8


def test_a_wrong_operand_is_a_copy_error_and_a_broken_step_ends_the_check():
    v = bench.check_chain("3+7=", "3+7=0;7+1=8;1+8=9;", 3)
    assert v["copy"] == 1 and v["arith"] == 0 and v["steps"] == 3  # 7+1 should have been 7+0
    v = bench.check_chain("3+7=", "3+7=0;7+0=7;Answer:7", 8)
    assert v["steps"] == 2 and v["format"] == 1


def test_a_warm_start_slip_is_always_a_wrong_result():
    """step_noise = 1: every step of the warm start's target slips, and a slip is off by 1..9 mod 10,
    never by 0 (a 'slip' equal to the right result would be a right step counted as noise)."""
    import random

    from epic_slime.runtime.task_fib import slipped_solution

    rng = random.Random(0)
    steps_seen = 0
    for a in range(10):
        for op in "+-":
            for b in range(10):
                target = slipped_solution(make_fib_problem(a, op, b, 4), rng, step_noise=1.0)
                v = bench.check_chain(f"{a}{op}{b}=", target, 4)
                assert (v["steps"], v["copy"], v["arith"], v["format"]) == (4, 0, 4, 0), target
                steps_seen += v["steps"]
    assert steps_seen == 800
    assert (
        slipped_solution(make_fib_problem(3, "+", 7, 4), rng, step_noise=0.0) == make_fib_problem(3, "+", 7, 4).solution
    )


def test_the_warm_start_uses_the_fib_tasks_own_slips():
    """warm_start_target with the task's slipper (what warm_start_data passes for fib): the target is a fib
    chain whose every step slipped, not the generic arithmetic slipper's reading of a fib prompt."""
    import random

    from epic_slime.runtime import task_fib
    from epic_slime.runtime.warmstart import warm_start_target

    problem = make_fib_problem(3, "+", 7, 4)
    target = warm_start_target(problem, random.Random(1), 0.0, 1.0, None, task_fib.slipped_solution)
    v = bench.check_chain(problem.prompt, target, 4)
    assert (v["steps"], v["copy"], v["arith"], v["format"]) == (4, 0, 4, 0), target
