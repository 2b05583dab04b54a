"""torch's intra-op thread count, set explicitly wherever the embedded runtime runs torch: the warm
start (in the driver process), the rollout workers, the trainer and the eval worker (Ray actors).

Why one thread by default: the model is tiny (64 hidden), so each op is microseconds of work and a
second thread gains little even on an idle machine (23 vs 28 ms per warm-start step on 2 cores).
On a busy machine it is a disaster: an OpenMP team of 2 must meet at a barrier after every op, and
when the partner thread waits for a core the other one spins. With 6 busy processes on 2 cores a
warm-start step took 1115 ms with torch's default 2 threads against 149 ms with 1
(`bench/warm_start_threads.py`), the first run's 10-20x slow warm start on a loaded machine.
`EPIC_SLIME_TORCH_THREADS=N` overrides it (Ray actors inherit the driver's environment)."""

from __future__ import annotations

import contextlib
import os

ENV = "EPIC_SLIME_TORCH_THREADS"
DEFAULT_THREADS = 1


def configured_threads() -> int:
    """$EPIC_SLIME_TORCH_THREADS when set (a positive integer), else 1."""
    raw = os.environ.get(ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_THREADS
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{ENV}={raw!r}: must be a positive integer (torch intra-op threads)")
    return n


def set_torch_threads(n: int | None = None) -> int:
    """Set this process's torch intra-op threads to n (default: `configured_threads()`); returns n.
    For processes that only run the runtime's own work (the Ray actors)."""
    import torch

    n = configured_threads() if n is None else n
    torch.set_num_threads(n)
    return n


@contextlib.contextmanager
def torch_threads(n: int | None = None):
    """The configured thread count inside the block, the caller's own afterwards (the warm start runs in
    the caller's process: a test, a sweep, the study)."""
    import torch

    before = torch.get_num_threads()
    set_torch_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
