"""Why the first-run warm start slows down 10-20x on a busy machine: torch's intra-op threads.

    PYTHONPATH=. python bench/warm_start_threads.py [--steps 30] [--repeats 3] [--load 2]

Times the real supervised warm start (``epic_slime.runtime.warmstart.supervised_warm_start``, the
default model and batch) for a few steps, in a fresh process per measurement, with torch's default
thread count (one per core) and with one thread, on an idle machine and with ``--load`` busy-loop
processes beside it (``python -c 'while True: pass'``, the load of other work on a shared machine;
started and killed by this script). Prints wall and CPU seconds per step and each row's ratio to the
one-thread idle row of the same run. CPU seconds far above wall seconds times one means threads
spinning in OpenMP barriers while their partner thread waits for a core.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, sys, time, torch
threads, steps = int(sys.argv[1]), int(sys.argv[2])
if threads > 0:
    torch.set_num_threads(threads)
from epic_slime.runtime.model import ModelConfig
from epic_slime.runtime.task import TaskConfig
from epic_slime.runtime.warmstart import supervised_warm_start
supervised_warm_start(ModelConfig(), TaskConfig(), steps=1, lr=3e-3, batch_size=64, seed=1)   # first-call costs
wall, cpu = time.perf_counter(), time.process_time()
supervised_warm_start(ModelConfig(), TaskConfig(), steps=steps, lr=3e-3, batch_size=64, seed=1, answer_noise=0.8)
print(json.dumps({"threads": torch.get_num_threads(), "wall": time.perf_counter() - wall,
                  "cpu": time.process_time() - cpu}))
"""


def probe(threads: int, steps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("EPIC_SLIME_TORCH_THREADS", None)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(threads), str(steps)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="warm-start steps timed per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--load", type=int, default=2, help="busy-loop processes in the loaded rows")
    args = parser.parse_args(argv)

    rows = []
    for load in (0, args.load):
        loops = busy_loops(load)
        try:
            time.sleep(0.5 if load else 0.0)
            for threads in (1, 0):  # 0: torch's default (one per core)
                runs = [probe(threads, args.steps) for _ in range(args.repeats)]
                rows.append(
                    {
                        "load": load,
                        "threads": runs[0]["threads"],
                        "default": threads == 0,
                        "wall": [r["wall"] / args.steps for r in runs],
                        "cpu": [r["cpu"] / args.steps for r in runs],
                    }
                )
        finally:
            for p in loops:
                p.kill()
                p.wait()
    base = statistics.median(rows[0]["wall"])
    print(
        f"warm start, {args.steps} steps per measurement, median of {args.repeats}; {os.cpu_count()} cores; "
        f"ratios against 1 thread, idle"
    )
    print(
        f"{'background load':>16} {'torch threads':>14} {'wall ms/step':>13} {'cpu ms/step':>12} {'ratio':>6}  runs (wall ms)"
    )
    for r in rows:
        wall, cpu = statistics.median(r["wall"]), statistics.median(r["cpu"])
        threads = f"{r['threads']}{' (default)' if r['default'] else ''}"
        runs = " ".join(f"{1000 * w:.0f}" for w in r["wall"])
        print(f"{r['load']:>16} {threads:>14} {1000 * wall:>13.0f} {1000 * cpu:>12.0f} {wall / base:>6.2f}  {runs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
