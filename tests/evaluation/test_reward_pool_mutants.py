"""The reward pool's failure replies against the real pool and its worker processes (issue 28 s3,
found missing by item 7's mutation pass): a worker whose verification raises, a worker that dies
holding a request, a worker killed while idle. Each gives a counted non-reward (None from the pool,
0.0 from math_reward), never a 1.0, and the pool serves the next answer right."""

from __future__ import annotations

import os
import signal
import time

import pytest

from epic_slime.reward import RewardPool, math_reward

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


def test_a_verification_that_raises_is_no_verdict_counted_and_the_worker_serves_on(one_worker):
    # an int where math-verify's parser expects text: it raises inside the worker's verify call
    assert one_worker.verify(12345, "1") is None
    stats = one_worker.stats()
    assert stats["worker_errors"] == 1 and stats["timeouts"] == 0 and stats["worker_restarts"] == 0, stats
    assert one_worker.verify(*HALF) is True


def test_a_verifier_error_scores_zero_never_one(one_worker, monkeypatch):
    """Through math_reward: the error reply becomes 0.0 and is counted as no verdict."""
    import epic_slime.reward as reward

    before = reward.reward_stats()["no_verdict"]
    real_verify = one_worker.verify
    monkeypatch.setattr(one_worker, "verify", lambda p, r, timeout=None: real_verify(12345, r, timeout))
    assert math_reward("Answer: \\frac{9}{\\sqrt{23}}", "\\frac{9 \\sqrt{23}}{23}", pool=one_worker) == 0.0
    assert reward.reward_stats()["no_verdict"] == before + 1


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
