"""The step being trained (``StepInFlight``), the run's clock, and the metrics line of a finished step."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from epic_slime import metric_names as names
from epic_slime.provenance import resident_memory_mib

from .batches import Accounting, Group


@dataclass
class StepInFlight:
    """One step: the groups dropped while choosing its batch, then its batch, lags (one per sample)
    and the trainer's future. A new one starts after each finished step."""

    dropped_samples: int = 0
    dropped_ids: list[int] = field(default_factory=list)
    batch: list[Group] = field(default_factory=list)
    lags: list[int] = field(default_factory=list)
    future: Any = None

    def dropped(self, groups: list[Group]) -> None:
        self.dropped_samples += sum(len(g) for g in groups)
        self.dropped_ids.extend(g.group_id for g in groups)

    def start(self, batch: list[Group], version: int, trainer) -> None:
        self.lags = [version - g.version for g in batch for _ in g.samples]
        self.batch = batch
        self.future = trainer.train_step.remote(batch)


class RunClock:
    """Wall time since the loop began and per step, and the samples trained since then."""

    def __init__(self) -> None:
        self.t_start: float | None = None
        self.step_t: float | None = None
        self.trained_at_start = 0

    def start(self, trained: int) -> None:
        self.trained_at_start = trained
        self.t_start = self.step_t = time.time()

    def loop_s(self) -> float:
        return time.time() - self.t_start

    def rate(self, trained: int, seconds: float) -> float:
        return (trained - self.trained_at_start) / max(1e-9, seconds)

    def lap(self, trained: int) -> dict:
        now = time.time()
        out = {
            "time/elapsed_s": now - self.t_start,
            "time/step_s": now - self.step_t,
            "perf/trained_samples_per_s": self.rate(trained, now - self.t_start),
        }
        self.step_t = now
        return out


def step_metrics(
    step: int, version: int, done: StepInFlight, acc: Accounting, buffered: int, in_flight: int, timing: dict
) -> dict:
    """A finished step's metrics line (before the trainer's own ``train/*``)."""
    samples = [s for g in done.batch for s in g.samples]
    rewards = [s["reward"] for s in samples]
    return {
        "step": step,
        "version": version,
        names.REWARD_MEAN: statistics.fmean(rewards),
        names.RESPONSE_LENGTH_MEAN: statistics.fmean(len(s["response_ids"]) for s in samples),
        names.TRUNCATED_FRAC: statistics.fmean(s["status"] == "truncated" for s in samples),
        "rollout/top_p_logprob_gap": statistics.fmean(
            (b - q) for s in samples for b, q in zip(s["behavior_log_probs"], s["sampling_log_probs"])
        ),
        names.STALENESS_MEAN: statistics.fmean(done.lags),
        names.STALENESS_MAX: max(done.lags),
        names.STALENESS_PREFIX + "dropped_step": done.dropped_samples,
        names.STALENESS_PREFIX + "dropped_total": acc.dropped,
        names.STALENESS_PREFIX + "stale_kept_total": acc.stale_kept,
        "accounting/generated": acc.generated,
        "accounting/trained": acc.trained,
        "accounting/dropped": acc.dropped,
        "accounting/buffered": buffered,
        "accounting/in_flight_requests": in_flight,
        "accounting/lost": acc.lost,
        "accounting/worker_restarts": acc.worker_restarts,
        **timing,
        "driver/rss_mb": resident_memory_mib(),
        **agent_metrics(samples),
    }


def agent_metrics(samples: list[dict]) -> dict:
    """The agent task's trajectories (samples with ``tool_calls``): the tool's counts per response, and
    the share of trajectories whose model tokens came from more than one weight version."""
    if not samples or "tool_calls" not in samples[0]:
        return {}
    from .rollout_agent import tool_stats

    spans = [len(_model_versions(s)) > 1 for s in samples]
    return {
        **{f"rollout/{name}": value for name, value in tool_stats(samples).items()},
        "rollout/multi_version_frac": statistics.fmean(spans),
    }


def model_versions(batch: list[Group]) -> list[list[int]] | None:
    """Per trained group of the agent task, the sorted weight versions of its model tokens (None for
    other tasks): a group spans a push when it holds two."""
    if not batch or "token_versions" not in batch[0].samples[0]:
        return None
    return [sorted(set().union(*(_model_versions(s) for s in g.samples))) for g in batch]


def _model_versions(sample: dict) -> set[int]:
    """The weight versions of a trajectory's model tokens (its tool tokens carry None)."""
    return {v for v in sample["token_versions"] if v is not None}
