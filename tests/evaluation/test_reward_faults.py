"""Issue 28, section 3: the verifier never scores its own failure, against the real reward pool.

Real worker processes run a verifier that fails on demand (tests/support/reward_faults.py) on a
pair math-verify judges correct ("2/4" = "0.5", not a fast-path case), so a failure scored as a
verdict would show as 1.0. Each failure gives a non-reward (None from the pool, 0.0 from
``math_reward``), counted in ``reward_stats()["no_verdict"]`` and in the pool's named counter,
and the pool serves the next call correctly.

Failed before the fix: ``not_bool`` (the truthy "False" was scored 1.0) and
``test_a_worker_that_died_idle_is_replaced_without_failing_a_call`` (the next call went to the dead
worker and got no verdict).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from support.eval_helpers import REPO_ROOT, pid_alive
from support.reward_faults import FAULT_FILE_ENV
from epic_slime.reward import RewardPool, math_reward, reward_stats

CORRECT = ("Answer: \\frac{2}{4}", "0.5")  # needs math-verify: 1.0
WRONG = ("Answer: \\frac{2}{5}", "0.5")  # needs math-verify: 0.0
TESTS_DIR = os.path.join(REPO_ROOT, "tests")


@pytest.fixture
def faults(tmp_path, monkeypatch):
    """The fault file, visible to every worker the pool starts (they inherit the environment)."""
    path = tmp_path / "fault"
    monkeypatch.setenv(FAULT_FILE_ENV, str(path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")]))
    return path


def _pool(**kwargs) -> RewardPool:
    return RewardPool(verifier="support.reward_faults:verify", **kwargs)


def _dead(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    "fault, counter, replaced",
    [
        ("raise", "worker_errors", False),
        ("not_bool", "worker_errors", False),
        ("hang", "timeouts", True),
        ("exit", "worker_deaths", True),
        ("sigkill", "worker_deaths", True),
        ("fatal", "worker_deaths", True),  # the worker answers "fatal" and exits: retired at once
    ],
)
def test_a_failing_verifier_gives_a_counted_non_reward_and_the_pool_recovers(faults, fault, counter, replaced):
    with _pool(num_workers=1, timeout=3.0) as pool:
        assert math_reward(*CORRECT, pool=pool) == 1.0 and math_reward(*WRONG, pool=pool) == 0.0
        (first,) = pool.worker_pids()
        before = reward_stats()["no_verdict"]
        faults.write_text(fault)
        start = time.monotonic()
        assert math_reward(*CORRECT, timeout=1.0, pool=pool) == 0.0  # never the 1.0 it would have been
        assert time.monotonic() - start < 1.0 + 1.0
        assert reward_stats()["no_verdict"] == before + 1
        stats = pool.stats()
        assert stats[counter] == 1, stats
        assert sum(stats[k] for k in ("worker_errors", "timeouts", "worker_deaths")) == 1, stats
        assert stats["worker_restarts"] == (1 if replaced else 0)
        if replaced:
            assert _dead(first), "the failed worker still runs"
        pool.wait_idle()
        assert pool.verify(CORRECT[0][8:], CORRECT[1], timeout=10.0) is True  # later calls still work
        assert math_reward(*WRONG, pool=pool, timeout=10.0) == 0.0
        assert (pool.worker_pids() == [first]) is (not replaced)


def test_a_worker_killed_from_outside_mid_call_is_a_counted_non_reward(faults):
    with _pool(num_workers=1, timeout=20.0) as pool:
        faults.write_text("hang")
        started = faults.parent / (faults.name + ".started")
        got = []
        call = threading.Thread(target=lambda: got.append(pool.verify("2/4", "0.5", timeout=20.0)))
        call.start()
        deadline = time.monotonic() + 15
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(int(started.read_text()), signal.SIGKILL)  # the OOM killer, mid-call
        call.join(10)
        assert got == [None]
        assert pool.stats()["worker_deaths"] == 1 and pool.stats()["timeouts"] == 0
        pool.wait_idle()
        assert pool.verify("2/4", "0.5", timeout=10.0) is True


def test_a_worker_that_died_idle_is_replaced_without_failing_a_call(faults):
    with _pool(num_workers=1, timeout=20.0) as pool:
        (pid,) = pool.worker_pids()
        os.kill(pid, signal.SIGKILL)
        assert _dead(pid)
        before = reward_stats()["no_verdict"]
        assert math_reward(*CORRECT, pool=pool, timeout=20.0) == 1.0  # served by its replacement
        assert reward_stats()["no_verdict"] == before
        stats = pool.stats()
        assert stats["idle_deaths"] == 1 and stats["worker_restarts"] == 1 and stats["worker_deaths"] == 0


def test_faults_in_a_batch_score_only_their_own_sample(faults):
    from epic_slime.reward import math_rewards

    with _pool(num_workers=2, timeout=3.0) as pool:
        faults.write_text("exit")
        rewards = math_rewards([CORRECT[0]] * 6, [CORRECT[1]] * 6, timeout=3.0, pool=pool)
        assert sorted(rewards) == [0.0] + [1.0] * 5 and pool.stats()["worker_deaths"] == 1


def test_a_verifier_that_is_not_module_colon_function_is_refused():
    with pytest.raises(ValueError, match="verifier must be 'module:function', got 'nocolon'"):
        RewardPool(num_workers=1, verifier="nocolon")


# ---- the pool's failure replies with no fault file: a worker whose verification raises, one that dies
# holding a request, one killed while idle (found missing by issue 28 item 7's mutation pass; each test
# names the mutants of tests/mutation/mutants.yaml it was written for).
HALF = ("2/4", "\\frac{1}{2}")  # needs math-verify (not the fast path): a real round trip to a worker


class _DiesWhenRead:
    """A request whose unpickling in the worker ends the worker process (as a segfault or the OOM
    killer would, mid-request): the parent meets a closed pipe."""

    def __reduce__(self):
        return (os._exit, (3,))


@pytest.fixture
def one_worker():
    with RewardPool(num_workers=1, timeout=10.0) as pool:
        yield pool


# mutants: pool_error_reply_uncounted, pool_error_reply_restarts_worker
def test_a_verification_that_raises_is_no_verdict_counted_and_the_worker_serves_on(one_worker):
    # an int where math-verify's parser expects text: it raises inside the worker's verify call
    assert one_worker.verify(12345, "1") is None
    stats = one_worker.stats()
    assert stats["worker_errors"] == 1 and stats["timeouts"] == 0 and stats["worker_restarts"] == 0, stats
    assert one_worker.verify(*HALF) is True


# mutants: pool_error_reply_scores_its_text, worker_error_is_a_wrong_answer
def test_a_verifier_error_scores_zero_never_one(one_worker, monkeypatch):
    """Through math_reward: the error reply becomes 0.0 and is counted as no verdict."""
    import epic_slime.reward as reward

    before = reward.reward_stats()["no_verdict"]
    real_verify = one_worker.verify
    monkeypatch.setattr(one_worker, "verify", lambda p, r, timeout=None: real_verify(12345, r, timeout))
    assert math_reward("Answer: \\frac{9}{\\sqrt{23}}", "\\frac{9 \\sqrt{23}}{23}", pool=one_worker) == 0.0
    assert reward.reward_stats()["no_verdict"] == before + 1


# mutants: pool_dead_worker_counted_as_timeout, pool_dead_worker_kept
def test_a_worker_that_dies_mid_request_is_replaced_and_counted(one_worker):
    (old,) = one_worker.worker_pids()
    start = time.monotonic()
    assert one_worker.verify(_DiesWhenRead(), "1") is None
    assert time.monotonic() - start < 5.0  # the closed pipe answers at once, not at the deadline
    stats = one_worker.stats()
    # a death mid-call is its own count (the pool's worker_deaths), not a verifier error
    assert stats["worker_deaths"] == 1 and stats["worker_errors"] == 0 and stats["timeouts"] == 0, stats
    assert stats["worker_restarts"] == 1, stats
    one_worker.wait_idle()
    (new,) = one_worker.worker_pids()
    assert new != old and one_worker.verify(*HALF) is True


# mutant: pool_idle_death_drops_the_call
def test_a_worker_killed_while_idle_is_replaced_before_the_next_call(one_worker):
    (old,) = one_worker.worker_pids()
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while one_worker._workers and next(iter(one_worker._workers)).process.poll() is None:
        assert time.monotonic() < deadline, "the killed worker did not exit"
        time.sleep(0.02)
    # the pool finds the dead worker before it writes the call, replaces it (idle_deaths) and the
    # call is answered by the replacement within its deadline: no verdict lost, never a 1.0 unearned
    assert one_worker.verify(*HALF) is True
    stats = one_worker.stats()
    assert stats["idle_deaths"] == 1 and stats["worker_errors"] == 0 and stats["worker_deaths"] == 0, stats
    assert one_worker.verify("2/4", "\\frac{1}{3}") is False


# mutant: worker_backstop_not_cleared
def test_a_worker_lives_past_its_backstop_once_it_has_answered():
    """The worker arms a SIGALRM backstop per request (an orphaned worker must not compute forever)
    and must disarm it with the answer: otherwise it dies backstop seconds later, idle, and the next
    call through it gets no verdict. A worker of the pool's own kind, with a 1 s backstop."""
    from epic_slime.reward.pool import _Worker

    worker = _Worker(backstop_s=1)
    try:
        worker.wait_ready(120)
        worker.writer.send(("verify", *HALF))
        assert worker.reader.recv() == ("ok", True)
        time.sleep(2.0)
        assert worker.process.poll() is None, "the worker died idle, after its backstop"
        worker.writer.send(("verify", "2/4", "\\frac{1}{3}"))
        assert worker.reader.recv() == ("ok", False)
    finally:
        worker.kill()


# mutant: pool_broken_pipe_raises
def test_a_worker_that_dies_between_the_liveness_check_and_the_send_is_replaced(one_worker, monkeypatch):
    """The race the liveness check cannot close: the worker dies right after ``poll()`` said it
    lives, so writing the call meets a broken pipe. The call was never sent: the worker is replaced
    (idle_deaths) and the call goes to the replacement, no error raised into the rollout."""
    (worker,) = one_worker._workers
    os.kill(worker.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while worker.process.poll() is None:
        assert time.monotonic() < deadline, "the killed worker did not exit"
        time.sleep(0.02)
    monkeypatch.setattr(worker.process, "poll", lambda: None)  # as if it died just after the check
    assert one_worker.verify(*HALF, timeout=30.0) is True
    stats = one_worker.stats()
    assert stats["idle_deaths"] == 1 and stats["worker_deaths"] == 0 and stats["worker_errors"] == 0, stats
