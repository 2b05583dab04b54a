"""SIGINT / SIGTERM during a run: the first signal asks the driver for a checkpoint at its next
quiescent point, a second one stops at once."""

from __future__ import annotations

import signal
import threading
import time

STOP_WAIT_S = 120.0   # after SIGINT / SIGTERM: longest wait for the step in flight before giving up


class StopRequest:
    """The first signal sets `requested` (the driver polls it); a second one raises KeyboardInterrupt."""

    def __init__(self):
        self.signal_name: str | None = None
        self.at: float | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum, _frame):
        if self.requested:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}")
        self.signal_name, self.at = signal.Signals(signum).name, time.time()
        print(f"\n[epic-slime] {self.signal_name}: finishing the step in flight, then checkpoint, summary and "
              "plots (send it again to exit at once, without a checkpoint)", flush=True)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return   # signal handlers can only be set from the main thread (sweeps in threads, tests)
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def check_deadline(self) -> None:
        if self.requested and time.time() - self.at > STOP_WAIT_S:
            raise KeyboardInterrupt(f"no quiescent point within {STOP_WAIT_S:.0f} s of {self.signal_name}")
