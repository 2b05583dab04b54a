"""A small persistent pool of math-verify worker processes with a hard per-call deadline.

Why processes: math-verify's timeouts rely on SIGALRM, which only works on the main thread,
and sympy can run for minutes (or forever) on hostile input. Each worker runs math-verify on
its own main thread; the caller (any thread, any process, a Ray actor) waits at most
``timeout`` seconds for the answer, and on a miss the worker is killed, reaped and replaced.

Workers are started with ``subprocess`` (fork+exec of ``sys.executable -m ...``), not with
multiprocessing, so nothing depends on the caller's ``__main__`` module or start method.
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


class RewardWorkerError(RuntimeError):
    """A reward worker could not start (math-verify missing, interpreter problem, ...)."""


class _Worker:
    """One worker process and its two pipe ends (parent side)."""

    def __init__(self, backstop_s: int):
        to_child_read, to_child_write = os.pipe()
        from_child_read, from_child_write = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "epic_slime.reward._worker", str(to_child_read), str(from_child_write), str(backstop_s)],
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
        if not self.reader.poll(startup_timeout):
            self.kill()
            raise RewardWorkerError(f"reward worker did not start within {startup_timeout:.0f} s")
        try:
            message = self.reader.recv()
        except (EOFError, OSError) as error:
            self.kill()
            raise RewardWorkerError(f"reward worker exited during start-up (exit code {self.process.poll()})") from error
        if message[0] != "ready":
            self.kill()
            raise RewardWorkerError(f"reward worker failed to start:\n{message[1]}")
        self.ready = True

    def kill(self) -> None:
        for conn in (self.writer, self.reader):
            try:
                conn.close()
            except OSError:
                pass
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

    None means no verdict (deadline passed or the worker failed); the event is counted in
    ``stats()`` and the worker is replaced. Use as a context manager or call ``close()``;
    pools still open at interpreter exit are closed by an atexit hook.
    """

    def __init__(self, num_workers: int | None = None, timeout: float = 5.0, startup_timeout: float = 120.0):
        if num_workers is None:
            num_workers = default_num_workers()
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.num_workers = int(num_workers)
        self.timeout = float(timeout)
        self.startup_timeout = float(startup_timeout)
        self._lock = threading.Lock()
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._workers: set[_Worker] = set()
        self._closed = False
        self._stats = {"verified": 0, "timeouts": 0, "worker_errors": 0, "worker_restarts": 0}
        for _ in range(self.num_workers):
            self._start_worker()
        _OPEN_POOLS.add(self)

    # -- workers -------------------------------------------------------------------------
    def _backstop_s(self) -> int:
        return int(max(30.0, 6.0 * self.timeout))

    def _start_worker(self) -> None:
        worker = _Worker(self._backstop_s())
        with self._lock:
            self._workers.add(worker)
        self._idle.put(worker)

    def _retire(self, worker: _Worker, counter: str) -> None:
        worker.kill()
        with self._lock:
            self._workers.discard(worker)
            self._stats[counter] += 1
            closed = self._closed
            if not closed:
                self._stats["worker_restarts"] += 1
        if not closed:
            self._start_worker()

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [worker.pid for worker in self._workers]

    # -- requests ------------------------------------------------------------------------
    def verify(self, prediction: str, reference: str, timeout: float | None = None) -> bool | None:
        if self._closed:
            raise RuntimeError("RewardPool is closed")
        timeout = self.timeout if timeout is None else float(timeout)
        worker = self._idle.get()
        try:
            worker.wait_ready(self.startup_timeout)  # start-up is not part of the call's budget
        except RewardWorkerError:
            self._retire(worker, "worker_errors")
            raise
        deadline = time.monotonic() + timeout
        try:
            worker.writer.send(("verify", prediction, reference))
            if worker.reader.poll(max(deadline - time.monotonic(), 0.0)):
                status, value = worker.reader.recv()
            else:
                self._retire(worker, "timeouts")
                return None
        except (EOFError, OSError):
            self._retire(worker, "worker_errors")
            return None
        with self._lock:
            self._stats["verified"] += 1
            if status != "ok":
                self._stats["worker_errors"] += 1
        self._idle.put(worker)
        return bool(value) if status == "ok" else None

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._workers)
            self._workers.clear()
        for worker in workers:
            worker.kill()
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
