"""Progress output: a tqdm bar on a terminal (with tqdm's ETA); one plain line every N steps otherwise,
with the time so far and an ETA.

A log file (stdout redirected, a batch job) must not fill with thousands of carriage-return
updates, and a person at a terminal wants the bar. Status messages (`say`) go to stdout too, so
that they interleave with the progress lines in the order they happened."""

from __future__ import annotations

import sys
import time


def say(message: str) -> None:
    print(f"[epic-slime] {message}", flush=True)


def is_terminal(stream=None) -> bool:
    stream = stream or sys.stdout
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def format_fields(fields: dict) -> str:
    return "  ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items())


class Progress:
    """update(step, fields) after each step; close() at the end. `enabled=False` prints nothing."""

    def __init__(
        self,
        total: int,
        *,
        initial: int = 0,
        desc: str = "train",
        enabled: bool = True,
        interval: int = 10,
        stream=None,
    ):
        self.total, self.desc, self.interval = total, desc, max(1, interval)
        self.stream = stream or sys.stdout
        self.enabled = enabled
        self.t0 = time.time()
        self.initial = initial
        self.bar = None
        if enabled and is_terminal(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True, file=self.stream)

    def update(self, step: int, fields: dict | None = None) -> None:
        if not self.enabled:
            return
        fields = fields or {}
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix_str(format_fields(fields), refresh=False)
            return
        if step % self.interval == 0 or step == self.total:
            elapsed = time.time() - self.t0
            line = f"[{self.desc}] step {step}/{self.total}  {format_fields(fields)}  ({elapsed:.0f} s{self._eta(step, elapsed)})"
            print(line.replace("   (", "  ("), file=self.stream, flush=True)

    def _eta(self, step: int, elapsed: float) -> str:
        """ ", ETA 1m05s" from the mean pace of this process's steps so far; "" when done or unknown."""
        done = step - self.initial
        if done <= 0 or step >= self.total:
            return ""
        left = round(elapsed / done * (self.total - step))
        return f", ETA {left // 60}m{left % 60:02d}s" if left >= 60 else f", ETA {left} s"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
