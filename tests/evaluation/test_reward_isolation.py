"""Verifier isolation: threads, deadlines, pathological inputs, no leaked processes, Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from support.eval_helpers import REPO_ROOT, pid_alive
from epic_slime.reward import RewardPool, math_reward, reward_stats

TOWER = "Answer: 9^{9^{9^{9}}}"  # sympy tries to evaluate 9^(9^(9^9)): never finishes


@pytest.fixture(scope="module")
def pool():
    with RewardPool(num_workers=2, timeout=10.0) as shared_pool:
        yield shared_pool


@pytest.fixture(scope="module")
def pathological_pool():
    with RewardPool(num_workers=2, timeout=1.0) as shared_pool:
        yield shared_pool


def _wait_dead(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_calls_from_many_threads_are_correct(pool):
    cases = [
        ("Answer: \\frac{9}{\\sqrt{23}}", "\\frac{9 \\sqrt{23}}{23}", 1.0),
        ("Answer: \\frac{9}{\\sqrt{22}}", "\\frac{9 \\sqrt{23}}{23}", 0.0),
        ("\\boxed{\\frac{\\pi - 2}{\\pi}}", "1-\\frac{2}{\\pi}", 1.0),
        ("Answer: 204", "204", 1.0),
        ("Answer: \\sqrt{640}", "8\\sqrt{10}", 1.0),
        ("Answer: \\sqrt{641}", "8\\sqrt{10}", 0.0),
    ] * 4
    with ThreadPoolExecutor(max_workers=6) as executor:
        got = list(executor.map(lambda c: math_reward(c[0], c[1], pool=pool), cases))
    assert got == [c[2] for c in cases]


def test_timeout_kills_and_replaces_the_worker_and_counts_it():
    with RewardPool(num_workers=1, timeout=0.5) as small_pool:
        assert math_reward("Answer: 2/4", "\\frac{1}{2}", pool=small_pool) == 1.0  # worker started
        (old_pid,) = small_pool.worker_pids()
        start = time.monotonic()
        result = math_reward(TOWER, "5", timeout=0.5, pool=small_pool)
        elapsed = time.monotonic() - start
        assert result == 0.0
        assert elapsed < 0.5 + 1.0, elapsed
        stats = small_pool.stats()
        assert stats["timeouts"] == 1 and stats["worker_restarts"] == 1
        assert _wait_dead(old_pid), "timed-out worker still running"
        (new_pid,) = small_pool.worker_pids()
        assert new_pid != old_pid
        small_pool.wait_idle()  # the replacement starts in the background
        # the replacement serves the next call correctly
        assert math_reward("Answer: \\frac{3}{6}", "\\frac{1}{2}", pool=small_pool) == 1.0


def test_default_pool_counts_no_verdict_from_a_thread(monkeypatch):
    import epic_slime.reward as reward

    monkeypatch.setattr(reward, "DEFAULT_TIMEOUT_S", 0.5)
    reward.shutdown_default_pool()
    try:
        before = reward_stats()["no_verdict"]
        with ThreadPoolExecutor(max_workers=1) as executor:
            assert executor.submit(math_reward, TOWER, "5", 0.5).result() == 0.0
        stats = reward_stats()
        assert stats["no_verdict"] == before + 1
        assert stats["pool_timeouts"] == 1
    finally:
        reward.shutdown_default_pool()


@pytest.mark.parametrize(
    "response",
    [
        "Answer: " + "+".join(f"\\frac{{{i}}}{{{i + 1}}}" for i in range(1, 700)),  # ~10,000 characters
        TOWER,
        "Answer: 2^{2^{2^{2^{2^{2^{2^{2}}}}}}}",
        "Answer: " + "\\frac{1}{" * 150 + "2" + "}" * 150,  # deeply nested fractions
        "Answer: " + "(" * 3000 + "1" + ")" * 3000,
        "\\boxed{" * 2000 + "}" * 2000,
    ],
    ids=["latex_10k", "tower_9", "tower_2", "nested_frac", "nested_parens", "nested_boxes"],
)
def test_pathological_inputs_return_within_the_bound(pathological_pool, response):
    timeout = 1.0
    pathological_pool.wait_idle()  # replacements of killed workers start in the background
    start = time.monotonic()
    result = math_reward(response, "\\frac{1}{3}", timeout=timeout, pool=pathological_pool, max_answer_chars=20_000)
    elapsed = time.monotonic() - start
    assert result == 0.0
    assert elapsed < timeout + 1.0, elapsed


def test_overlong_answer_is_rejected_at_once_and_counted():
    before = reward_stats()["too_long"]
    start = time.monotonic()
    assert math_reward("Answer: " + "1+" * 5000 + "1", "10001") == 0.0
    assert time.monotonic() - start < 0.5
    assert reward_stats()["too_long"] == before + 1


def test_deadline_covers_waiting_for_a_busy_worker():
    with RewardPool(num_workers=1, timeout=5.0) as small_pool:
        with ThreadPoolExecutor(max_workers=2) as executor:
            stuck = executor.submit(small_pool.verify, "9^{9^{9^{9}}}", "5", 1.5)
            time.sleep(0.2)  # the only worker is now busy with the tower
            start = time.monotonic()
            assert small_pool.verify("1/2", "\\frac{1}{2}", timeout=0.5) is None
            assert 0.45 < time.monotonic() - start < 1.0
            assert stuck.result() is None
        stats = small_pool.stats()
        assert stats["busy_timeouts"] == 1 and stats["timeouts"] == 1


def test_close_leaves_no_worker_processes():
    small_pool = RewardPool(num_workers=2, timeout=2.0)
    small_pool.verify("1/2", "\\frac{1}{2}")
    pids = small_pool.worker_pids()
    assert len(pids) == 2 and all(pid_alive(pid) for pid in pids)
    small_pool.close()
    assert all(_wait_dead(pid) for pid in pids)


def test_workers_exit_when_the_parent_is_killed():
    script = textwrap.dedent(
        """
        import os, sys
        from epic_slime.reward import RewardPool
        pool = RewardPool(num_workers=2, timeout=2.0)
        assert pool.verify("1/2", "\\\\frac{1}{2}") is True
        print(" ".join(map(str, pool.worker_pids())), flush=True)
        os._exit(0)  # no atexit, no close(): like a SIGKILL
        """
    )
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    pids = [int(pid) for pid in done.stdout.split()]
    assert len(pids) == 2
    assert all(_wait_dead(pid) for pid in pids), "orphaned reward workers"


@pytest.mark.slow
def test_reward_inside_a_ray_actor():
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=1, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": REPO_ROOT}}
    )
    try:

        @ray.remote(num_cpus=0)
        class Scorer:
            def score(self, response, label):
                from epic_slime.reward import math_reward as reward_fn

                return reward_fn(response, label, timeout=5.0)

            def score_from_thread(self, response, label):
                import threading

                from epic_slime.reward import math_reward as reward_fn

                out = []
                thread = threading.Thread(target=lambda: out.append(reward_fn(response, label, timeout=5.0)))
                thread.start()
                thread.join()
                return out[0]

        scorer = Scorer.remote()
        assert ray.get(scorer.score.remote("Answer: \\frac{9}{\\sqrt{23}}", "\\frac{9 \\sqrt{23}}{23}")) == 1.0
        assert ray.get(scorer.score_from_thread.remote("Answer: \\sqrt{640}", "8\\sqrt{10}")) == 1.0
        assert ray.get(scorer.score.remote("Answer: \\sqrt{641}", "8\\sqrt{10}")) == 0.0
    finally:
        ray.shutdown()


def test_forked_child_neither_uses_nor_kills_the_parents_workers(pool):
    pids = pool.worker_pids()
    child = os.fork()
    if child == 0:  # child: using the inherited pool must fail; closing it must not kill the workers
        code = 0
        try:
            pool.verify("1", "1")
            code = 3
        except RuntimeError:
            pool.close()
        os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert all(pid_alive(pid) for pid in pids)
    assert pool.verify("2/4", "\\frac{1}{2}") is True
