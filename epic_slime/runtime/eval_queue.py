"""``EvalQueue``: the held-out evaluations of a run, on the one eval worker. It owns the evaluations
due and not yet started (each with the weights it was due on), the one in flight, and the results
finished since the last metrics line.

Every due evaluation is queued with its weights and run in order, so a slow evaluation never lets a
later version stand in for an earlier one (checkpoint selection compares exactly the versions that
were asked for)."""

from __future__ import annotations

import statistics
from collections import deque

from .config import RuntimeConfig
from .run_files import HELDOUT, RunLog
from .tasks import eval_problems, get_task


class EvalQueue:
    def __init__(self, cfg: RuntimeConfig, log: RunLog):
        self.cfg, self.log = cfg, log
        self.problems = eval_problems(cfg.task)
        self.worker = None
        self.due: deque = deque()  # (weights ref, version) due and not yet started
        self.future = None
        self.future_version: int | None = None
        self.done: list[dict] = []  # finished since the last metrics line

    def start_worker(self, init_ref) -> None:
        from .actors import EvalWorker

        self.worker = EvalWorker.remote(self.cfg.model, init_ref, self.cfg.seed)

    def _sampling(self) -> dict:
        c = self.cfg
        return dict(
            k=c.n_samples_per_eval_prompt,
            temperature=c.eval_temperature,
            top_p=c.eval_top_p,
            max_new_tokens=c.rollout_max_response_len,
            seed=c.seed,
            **({"max_turns": c.agent_max_turns, "tool": c.agent_eval_tool} if get_task(c.task_name).agent else {}),
        )

    def due_now(self, weights_ref, version: int) -> None:
        """An evaluation is due on these weights (once per version), started when the worker is free."""
        if version not in self._versions_pending():
            self.due.append((weights_ref, version))
        self.start_next()

    def start_next(self) -> None:
        if self.future is None and self.due:
            weights_ref, version = self.due.popleft()
            self.future_version = version
            self.future = self.worker.evaluate.remote(weights_ref, version, self.problems, self._sampling())

    def _versions_pending(self) -> set[int]:
        pending = {version for _, version in self.due}
        if self.future is not None:
            pending.add(self.future_version)
        return pending

    def owns(self, fut) -> bool:
        return fut is self.future or fut == self.future

    def collect(self, step: int) -> None:
        """The evaluation in flight finished: its result is logged (at ``step``) and the next one starts."""
        import ray

        scored, correct, tool_stats, tool_counts = ray.get(self.future)  # scored: the version the worker held
        version, self.future = self.future_version, None  # the version it was due on: its step
        k = self.cfg.n_samples_per_eval_prompt
        flat = [c for row in correct for c in row]
        result = {
            f"eval/{HELDOUT}/mean@{k}": statistics.fmean(flat),
            f"eval/{HELDOUT}/pass@{k}": statistics.fmean(any(r) for r in correct),
            "eval/version": version,
            **{f"eval/{HELDOUT}/{name}": value for name, value in tool_stats.items()},
        }
        self.done.append(result)
        self.log.evaluation(step, result, version, correct, weight_version=scored, tool_counts=tool_counts)
        self.start_next()

    def finish(self, step: int, weights_ref, version: int) -> None:
        """The last step: every queued evaluation, then the final one, collected before the run ends."""
        import ray

        while self.future is not None:
            ray.wait([self.future])
            self.collect(step)
        self.due_now(weights_ref, version)
        ray.wait([self.future])
        self.collect(step)

    def take_done(self) -> dict:
        """The newest finished result for this step's metrics line (eval_metrics.jsonl and
        eval_records.jsonl keep every one: two can finish within one step when evaluations queue up)."""
        newest = self.done[-1] if self.done else {}
        self.done = []
        return newest
