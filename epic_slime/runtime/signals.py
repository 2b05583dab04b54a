"""SIGINT / SIGTERM during a run: the first signal asks the driver for a checkpoint at its next
quiescent point, a second one stops at once. During start-up (the warm start, Ray, the workers:
before the driver calls `begin_steps`) there is no step to finish and nothing to save, so the first
signal stops at once."""

from __future__ import annotations

import signal
import threading
import time

STOP_WAIT_S = 120.0  # after SIGINT / SIGTERM: longest wait for the step in flight before giving up


class StopRequest:
    """The first signal sets `requested` (the driver polls it); a second one raises KeyboardInterrupt."""

    def __init__(self):
        self.signal_name: str | None = None
        self.at: float | None = None
        self.steps_begun = False
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def begin_steps(self) -> None:
        """From here on a signal waits for the step in flight (the driver's loop has started)."""
        self.steps_begun = True

    def _handle(self, signum, _frame):
        name = signal.Signals(signum).name
        if self.requested:
            raise KeyboardInterrupt(f"second {name}")
        self.signal_name, self.at = name, time.time()
        if not self.steps_begun:
            print(f"\n[epic-slime] {name} during start-up, before any step: stopping now", flush=True)
            raise KeyboardInterrupt(f"{name} during start-up")
        print(
            f"\n[epic-slime] {name}: finishing the step in flight, then checkpoint, summary and "
            "plots (send it again to exit at once, without a checkpoint)",
            flush=True,
        )

    def install(self) -> None:
        """Idempotent: a second call (after ray.init, which may set its own) re-installs the handlers
        but keeps the ones from before the first call, which `restore` puts back."""
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread (sweeps in threads, tests)
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.signal(sig, self._handle)
            self._previous.setdefault(sig, previous)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def check_deadline(self) -> None:
        if self.requested and time.time() - self.at > STOP_WAIT_S:
            raise KeyboardInterrupt(f"no quiescent point within {STOP_WAIT_S:.0f} s of {self.signal_name}")
