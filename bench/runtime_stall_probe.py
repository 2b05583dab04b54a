"""Does the admission budget or the start-order wait stall the embedded runtime's async loop? (issue 34)

    PYTHONPATH=TREE python bench/runtime_stall_probe.py [--steps 20] [-- TRAIN ARGS]

Runs `epic-slime train` in async mode (default config, no eval, no checkpoints) with the driver's
decisions observed, not changed, and counts, in whichever tree is on PYTHONPATH:
  - worker checks: each time the loop looked at an idle rollout worker, whether it started a request,
    or was held back by the memory cap (`rollout_buffer_batches`) or, with the cap leaving room, by the
    admission budget alone, or got a smaller request from the budget (trees with the budget: `Run._room`,
    or `RolloutPool.room` since the loop's generation side moved into `runtime/rollout_pool.py`);
  - start-order waits: `_take_batch` calls that found no batch although B trainable groups were buffered
    (the batch waited for the oldest group still generating), and their total wall time;
  - trainer idle: wall time between a step's end and the next step's start (the trainer is the
    bottleneck here, so this is the time the loop made it wait);
  - at each step's end: the requests in flight and the batches buffered;
  - CPU seconds per step of the trainer actor, the rollout workers (summed) and the driver, from the
    first step's end to the last one's (/proc/<pid>/stat of the actors, whose pids the actors report):
    the whole run's work, its content included (which groups share a minibatch, the response lengths).
Counts are structural (what the loop decided), so they hold under load; the wall times do not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

COUNTS = {
    "worker_started": 0,
    "worker_held_by_cap": 0,
    "worker_held_by_budget": 0,
    "request_cut_by_budget": 0,
    "start_order_waits": 0,
}
WALL = {"start_order_wait_s": 0.0, "trainer_idle_s": []}


def _cpu_s(pid: int) -> float:
    """utime + stime of a process on this machine, in seconds."""
    import os

    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pids(self) -> dict:
    import os

    import ray

    def pid(actor) -> int:
        return ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()))

    workers = self.pool.workers if hasattr(self, "pool") else self.workers
    return {"trainer": [pid(self.trainer)], "workers": [pid(w) for w in workers], "driver": [os.getpid()]}


def _instrument_pool(driver, trainable_groups) -> None:
    """The same observations in a tree whose generation side is ``RolloutPool`` (runtime/rollout_pool.py)
    and whose step in flight is ``StepInFlight`` (runtime/train_step.py)."""
    from epic_slime.runtime.rollout_pool import RolloutPool
    from epic_slime.runtime.train_step import StepInFlight

    Run = driver.Run
    real_fill, real_take, real_start, real_finish = (
        RolloutPool.fill,
        Run._take_batch,
        StepInFlight.start,
        Run._finish_train,
    )
    state = {"wait_since": None, "finished_at": None}

    def fill(pool):
        cap = pool.cfg.rollout_buffer_batches * pool.cfg.samples_per_step
        request = pool.prompts_per_request * pool.cfg.n_samples_per_prompt
        for i in pool.idle_workers():  # the same tests as the real method, read before it runs
            if pool.buffered_samples() + pool.pending_samples() + request > cap:
                COUNTS["worker_held_by_cap"] += 1
            elif pool.room(i) == 0:
                COUNTS["worker_held_by_budget"] += 1
            elif pool.room(i) < pool.prompts_per_request:
                COUNTS["request_cut_by_budget"] += 1
        before = len(pool.pending)
        real_fill(pool)
        COUNTS["worker_started"] += len(pool.pending) - before

    def take(self):
        pool = self.pool
        ready = trainable_groups(pool.buffer, pool.version, self.cfg.max_staleness, self.cfg.stale_policy)
        sel = real_take(self)
        now = time.perf_counter()
        if sel.batch is None and ready >= self.cfg.rollout_batch_size:
            COUNTS["start_order_waits"] += 1
            state["wait_since"] = state["wait_since"] or now
        elif sel.batch is not None and state["wait_since"] is not None:
            WALL["start_order_wait_s"] += now - state["wait_since"]
            state["wait_since"] = None
        return sel

    def start(step, batch, version, trainer):
        if state["finished_at"] is not None:
            WALL["trainer_idle_s"].append(time.perf_counter() - state["finished_at"])
        return real_start(step, batch, version, trainer)

    def finish(self):
        state["finished_at"] = time.perf_counter()
        if "pids" not in state:
            state["pids"] = _pids(self)
        WALL.setdefault("cpu", []).append({k: sum(_cpu_s(p) for p in v) for k, v in state["pids"].items()})
        m = real_finish(self)
        WALL.setdefault("at_step_end", []).append(
            (m["accounting/in_flight_requests"], m["accounting/buffered"] / self.cfg.samples_per_step)
        )
        return m

    RolloutPool.fill, Run._take_batch, StepInFlight.start, Run._finish_train = fill, take, start, finish


def _instrument(Run, trainable_groups) -> None:
    budgeted = hasattr(Run, "_room")
    real_fill, real_take, real_start, real_finish = (
        Run._fill_workers,
        Run._take_batch,
        Run._start_train,
        Run._finish_train,
    )
    state = {"wait_since": None, "finished_at": None}

    def fill(self):
        cap = self.cfg.rollout_buffer_batches * self.cfg.samples_per_step
        request = self.prompts_per_request * self.cfg.n_samples_per_prompt
        for i in self._idle_workers():  # the same tests as the real method, read before it runs
            if self._buffered_samples() + self._pending_samples() + request > cap:
                COUNTS["worker_held_by_cap"] += 1
            elif budgeted and self._room(i) == 0:
                COUNTS["worker_held_by_budget"] += 1
            elif budgeted and self._room(i) < self.prompts_per_request:
                COUNTS["request_cut_by_budget"] += 1
        before = len(self.pending_gen)
        real_fill(self)
        COUNTS["worker_started"] += len(self.pending_gen) - before

    def take(self):
        ready = trainable_groups(self.buffer, self.version, self.cfg.max_staleness, self.cfg.stale_policy)
        sel = real_take(self)
        now = time.perf_counter()
        if sel.batch is None and ready >= self.cfg.rollout_batch_size:
            COUNTS["start_order_waits"] += 1
            state["wait_since"] = state["wait_since"] or now
        elif sel.batch is not None and state["wait_since"] is not None:
            WALL["start_order_wait_s"] += now - state["wait_since"]
            state["wait_since"] = None
        return sel

    def start(self, sel):
        if state["finished_at"] is not None:
            WALL["trainer_idle_s"].append(time.perf_counter() - state["finished_at"])
        return real_start(self, sel)

    def finish(self, metrics):
        state["finished_at"] = time.perf_counter()
        if "pids" not in state:
            state["pids"] = _pids(self)
        WALL.setdefault("cpu", []).append({k: sum(_cpu_s(p) for p in v) for k, v in state["pids"].items()})
        m = real_finish(self, metrics)
        WALL.setdefault("at_step_end", []).append(
            (m["accounting/in_flight_requests"], m["accounting/buffered"] / self.cfg.samples_per_step)
        )
        return m

    Run._fill_workers, Run._take_batch, Run._start_train, Run._finish_train = fill, take, start, finish


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    args, extra = ap.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    from pathlib import Path

    import epic_slime
    from epic_slime.runtime import driver
    from epic_slime.runtime.config import parse_config

    try:
        from epic_slime.runtime.batches import trainable_groups
    except ImportError:  # a tree before the split of epic_slime/staleness.py
        from epic_slime.staleness import trainable_groups

    tree = Path(epic_slime.__file__).resolve().parents[1]
    pool_shape = hasattr(driver.Run, "_take_and_train")
    if pool_shape:
        _instrument_pool(driver, trainable_groups)
    else:
        _instrument(driver.Run, trainable_groups)
    out = tempfile.mkdtemp(prefix="epic_slime_probe_")
    cfg = parse_config(
        [
            "--config",
            str(tree / "configs/local/default.yaml"),
            "--num-rollout",
            str(args.steps),
            "--eval-interval",
            "0",
            "--no-plots",
            "--no-progress",
            "--save-interval",
            "0",
            "--rollout-mode",
            "async",
            "--output-dir",
            out,
            *extra,
        ]
    )
    driver.run_training(cfg)
    idle = WALL["trainer_idle_s"]
    ends = WALL.get("at_step_end", [])
    print(
        f"tree {tree}, async, {args.steps} steps, budget in the runtime: {pool_shape or hasattr(driver.Run, '_room')}"
    )
    print("worker checks: " + ", ".join(f"{k} {v}" for k, v in COUNTS.items() if k != "start_order_waits"))
    print(f"start-order waits: {COUNTS['start_order_waits']} ({WALL['start_order_wait_s'] * 1e3:.1f} ms in all)")
    print(
        f"trainer idle between steps: median {statistics.median(idle) * 1e3:.1f} ms, max {max(idle) * 1e3:.1f} ms, "
        f"sum {sum(idle) * 1e3:.1f} ms over {len(idle)} gaps"
    )
    cpu = WALL["cpu"]
    steps = len(cpu) - 1
    print(
        f"CPU per step, steps 2-{len(cpu)}: "
        + ", ".join(f"{k} {(cpu[-1][k] - cpu[0][k]) / steps * 1e3:.1f} ms" for k in cpu[0])
    )
    print(
        f"at step ends: requests' samples in flight {sorted({e[0] for e in ends})}, "
        f"batches buffered {sorted({e[1] for e in ends})}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
