"""A small persistent pool of math-verify worker processes with a hard per-call deadline.

Why processes: math-verify's timeouts rely on SIGALRM, which only works on the main thread,
and sympy can run for minutes (or forever) on hostile input. Each worker runs math-verify on
its own main thread; the caller (any thread, any process, a Ray actor) waits at most
``timeout`` seconds for the answer, and on a miss the worker is killed, reaped and replaced.

Workers are started with ``subprocess`` (fork+exec of ``sys.executable -m ...``), not with
multiprocessing, so nothing depends on the caller's ``__main__`` module or start method.

The verifier never scores its own failure: a call whose verifier raised (or answered something
other than True/False), whose worker hung past the deadline, or whose worker died mid-call (a
crash, ``os._exit``, the OOM killer's SIGKILL) returns None, "no verdict", which ``math_reward``
scores 0.0 and counts (``reward_stats()["no_verdict"]``); the pool counts each kind
(``worker_errors``, ``timeouts``, ``worker_deaths``), replaces a worker that hung or died, and
later calls are served as before. A worker found dead when a call picks it up (it died idle)
never saw that call: it is replaced (``idle_deaths``) and the call goes to another worker within
its deadline.
"""

from __future__ import annotations

import atexit
import os
import queue
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing.connection import Connection

import epic_slime

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(epic_slime.__file__)))
DEFAULT_VERIFIER = "epic_slime.reward.equivalence:verify_equivalent"


class RewardWorkerError(RuntimeError):
    """A reward worker could not start (math-verify missing, interpreter problem, ...)."""


class _Worker:
    """One worker process and its two pipe ends (parent side)."""

    def __init__(self, backstop_s: int, verifier: str = DEFAULT_VERIFIER):
        to_child_read, to_child_write = os.pipe()
        from_child_read, from_child_write = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "epic_slime.reward._worker",
                str(to_child_read),
                str(from_child_write),
                str(backstop_s),
                verifier,
            ],
            pass_fds=(to_child_read, from_child_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        os.close(to_child_read)
        os.close(from_child_write)
        self.writer = Connection(to_child_write, readable=False)
        self.reader = Connection(from_child_read, writable=False)
        self.ready = False

    def wait_ready(self, startup_timeout: float) -> None:
        if self.ready:
            return
        try:
            arrived = self.reader.poll(startup_timeout)
        except (OSError, ValueError) as error:  # closed meanwhile (pool closed)
            raise RewardWorkerError("reward worker was stopped during start-up") from error
        if not arrived:
            self.kill()
            raise RewardWorkerError(f"reward worker did not start within {startup_timeout:.0f} s")
        try:
            message = self.reader.recv()
        except (EOFError, OSError) as error:
            self.kill()
            raise RewardWorkerError(
                f"reward worker exited during start-up (exit code {self.process.poll()})"
            ) from error
        if message[0] != "ready":
            self.kill()
            raise RewardWorkerError(f"reward worker failed to start:\n{message[1]}")
        self.ready = True

    def close_pipes(self) -> None:
        for conn in (self.writer, self.reader):
            try:
                conn.close()
            except OSError:
                pass

    def kill(self) -> None:
        self.close_pipes()
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=10)  # reap: no zombies
        except subprocess.TimeoutExpired:
            pass

    @property
    def pid(self) -> int:
        return self.process.pid


class RewardPool:
    """Thread-safe pool; ``verify(prediction, reference, timeout)`` -> True, False or None.

    The deadline covers the whole call: waiting for a free worker plus the verification.
    None means no verdict: the worker missed the deadline (it is killed, reaped and replaced;
    counted as ``timeouts``), every worker stayed busy until the deadline (``busy_timeouts``),
    the verifier raised or answered neither True nor False (``worker_errors``; the worker serves
    on), or the worker died during the call (``worker_deaths``; replaced). ``verified`` counts
    verdicts. ``verifier`` ("module:function", default math-verify's ``verify_equivalent``) is
    what the workers call with (prediction, reference). Worker start-up is not charged to calls: the
    constructor waits for the first workers, and replacements start in the background and
    join the pool once ready. Use as a context manager or call ``close()``; pools still open
    at interpreter exit are closed by an atexit hook.
    """

    def __init__(
        self,
        num_workers: int | None = None,
        timeout: float = 5.0,
        startup_timeout: float = 120.0,
        verifier: str = DEFAULT_VERIFIER,
    ):
        if num_workers is None:
            num_workers = default_num_workers()
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        module, sep, function = str(verifier).partition(":")
        if not (module and sep and function):
            raise ValueError(f"verifier must be 'module:function', got {verifier!r}")
        self.verifier = str(verifier)
        self.num_workers = int(num_workers)
        self.timeout = float(timeout)
        self.startup_timeout = float(startup_timeout)
        self._lock = threading.Lock()
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._workers: set[_Worker] = set()
        self._closed = False
        self._startup_error: RewardWorkerError | None = None
        self._owner_pid = os.getpid()  # a forked child must neither use nor kill these workers
        self._stats = {
            "verified": 0,
            "timeouts": 0,
            "busy_timeouts": 0,
            "worker_errors": 0,
            "worker_deaths": 0,
            "idle_deaths": 0,
            "worker_restarts": 0,
        }
        _OPEN_POOLS.add(self)
        first = [self._spawn() for _ in range(self.num_workers)]
        try:
            for worker in first:  # in parallel: all were spawned before the first wait
                worker.wait_ready(self.startup_timeout)
        except RewardWorkerError:
            self.close()
            raise
        for worker in first:
            self._idle.put(worker)

    # -- workers -------------------------------------------------------------------------
    def _backstop_s(self) -> int:
        return int(max(30.0, 6.0 * self.timeout))

    def _spawn(self) -> _Worker:
        worker = _Worker(self._backstop_s(), self.verifier)
        with self._lock:
            self._workers.add(worker)
        return worker

    def _start_replacement(self) -> None:
        worker = self._spawn()

        def join_when_ready() -> None:
            try:
                worker.wait_ready(self.startup_timeout)
            except RewardWorkerError as error:
                with self._lock:
                    self._workers.discard(worker)
                    self._startup_error = error
                return
            if self._closed:
                worker.kill()
            else:
                self._idle.put(worker)

        threading.Thread(target=join_when_ready, name="reward-worker-start", daemon=True).start()

    def _retire(self, worker: _Worker, counter: str) -> None:
        worker.kill()
        with self._lock:
            self._workers.discard(worker)
            self._stats[counter] += 1
            replace = not self._closed
            if replace:
                self._stats["worker_restarts"] += 1
        if replace:
            self._start_replacement()

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [worker.pid for worker in self._workers]

    def wait_idle(self, timeout: float = 120.0) -> None:
        """Block until every worker is started and idle (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._startup_error is not None:
                raise self._startup_error
            if self._idle.qsize() >= self.num_workers:
                return
            time.sleep(0.01)
        raise RewardWorkerError(f"reward workers not idle within {timeout:.0f} s")

    # -- requests ------------------------------------------------------------------------
    def verify(self, prediction: str, reference: str, timeout: float | None = None) -> bool | None:
        if self._closed:
            raise RuntimeError("RewardPool is closed")
        if os.getpid() != self._owner_pid:
            raise RuntimeError("RewardPool was created in another process (fork): create a new pool in this one")
        if self._startup_error is not None:
            raise self._startup_error
        timeout = self.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                worker = self._idle.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                with self._lock:
                    self._stats["busy_timeouts"] += 1
                return None
            if worker.process.poll() is not None:  # died while idle: it never saw this call
                self._retire(worker, "idle_deaths")
                continue
            try:
                worker.writer.send(("verify", prediction, reference))
            except OSError:  # its pipe is gone (it died idle, just now): the call was not sent
                self._retire(worker, "idle_deaths")
                continue
            break
        try:
            if not worker.reader.poll(max(deadline - time.monotonic(), 0.0)):
                self._retire(worker, "timeouts")
                return None
            status, value = worker.reader.recv()
        except (EOFError, OSError, ValueError):  # died mid-call (crash, os._exit, SIGKILL)
            self._retire(worker, "worker_deaths")
            return None
        if status == "ok" and isinstance(value, bool):
            with self._lock:
                self._stats["verified"] += 1
            self._idle.put(worker)
            return value
        if status == "error":  # the verifier raised (or answered no bool): the worker serves on
            with self._lock:
                self._stats["worker_errors"] += 1
            self._idle.put(worker)
            return None
        self._retire(worker, "worker_deaths")  # "fatal" (the worker is exiting) or a reply it never sends
        return None

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._workers)
            self._workers.clear()
        owner = os.getpid() == self._owner_pid
        for worker in workers:
            if owner:
                worker.kill()
            else:  # forked copy: drop our pipe ends only, the owner's workers live on
                worker.close_pipes()
        _OPEN_POOLS.discard(self)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def default_num_workers() -> int:
    """``EPIC_SLIME_REWARD_WORKERS`` if set, else min(4, CPU count)."""
    value = os.environ.get("EPIC_SLIME_REWARD_WORKERS")
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            raise ValueError(f"EPIC_SLIME_REWARD_WORKERS must be an integer, got {value!r}") from None
    return max(1, min(4, os.cpu_count() or 1))


_OPEN_POOLS: "weakref.WeakSet[RewardPool]" = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
    for pool in list(_OPEN_POOLS):
        pool.close()
