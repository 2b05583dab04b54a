"""Staleness control and sample accounting for both training paths (pure Python, no framework).

One idea, two callers: the embedded runtime (``epic_slime.runtime``) and the slime path
(``epic_slime.slime.rollout``). lag (staleness) = the trainer's weight version at training time
minus the version that generated a group; K = max_staleness; a group with lag > K is dropped
(stale_policy "drop"; on the slime path its prompt is regenerated instead, up to a cap: "requeued")
or trained anyway and counted ("keep"). Every decision is counted, every
trained lag histogrammed, and the bookkeeping invariant is checked every step / rollout:

    consumed (generated) = trained + dropped for staleness + in flight (buffered)

Admission (both paths): ``AdmissionBudget`` starts a group only while
live_started < (g + K) * B and batches are taken in start order, so no trained group exceeds K
(the gate below re-checks and counts). Runtime: ``select_batch`` (start order) + ``trainable_groups`` + ``Accounting`` (samples). slime: ``StalenessGate`` +
``collect_admitted_groups`` (groups, versions from ``Sample.weight_versions``) + ``GroupLedger``
(every consumed prompt: delivered to training in rollout r, dropped, or in flight).

Versions on slime: slime's weight updaters count updates from 0 and tag every SGLang response
with ``weight_version = str(n)`` after the n-th update; the driver pushes weights once before the
first rollout (version 1) and once after training each rollout, so the policy that starts
training rollout ``r`` is version ``r - start_rollout_id + 1``. A sample generated across a
weight update carries several versions; its oldest counts (a call that returned no tokens, e.g. a
request aborted by a push before its first token, contributes no version: the slime stream removes it). A GRPO group is kept or dropped as a
whole (advantages are normalised inside the group).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from epic_slime.admission import AdmissionBudget  # noqa: F401  (the shared admission rule)
from epic_slime.length_deciles import OUTCOMES, DecileRow, decile_metrics, format_deciles, length_deciles  # noqa: F401

STALE_POLICIES = ("drop", "keep")
# SGLang's weight_version before any update is the string "default": the initial weights.
INITIAL_VERSION_NAMES = ("default",)


def check_stale_policy(stale_policy: str) -> None:
    if stale_policy not in STALE_POLICIES:
        raise ValueError(f"stale_policy must be 'drop' or 'keep', got {stale_policy!r}")


def over_limit(lag: int, max_staleness: int | None) -> bool:
    """True when a lag exceeds the bound K (None: unbounded)."""
    return max_staleness is not None and lag > max_staleness


def trainer_version_for_rollout(rollout_id: int, start_rollout_id: int = 0) -> int:
    """Weight version of the policy that starts training rollout ``rollout_id``."""
    if rollout_id < start_rollout_id:
        raise ValueError(f"rollout_id={rollout_id} is before start_rollout_id={start_rollout_id}")
    return rollout_id - start_rollout_id + 1


def parse_weight_version(value: Any) -> int:
    """``"3"`` -> 3; ``"default"`` -> 0 (initial weights); anything else is an error."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if text in INITIAL_VERSION_NAMES:
        return 0
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"Sample.weight_versions entry {value!r} is not an integer weight version") from None


def sample_version(weight_versions: Sequence[Any] | None, sample_index: Any = None) -> int:
    """Oldest weight version that contributed tokens to a sample."""
    if not weight_versions:
        raise ValueError(
            f"sample {sample_index}: Sample.weight_versions is empty, so its staleness is unknown. "
            "slime's SGLang generate records it; a custom --custom-generate-function-path must "
            "append the engine's weight_version for every generation call"
        )
    return min(parse_weight_version(v) for v in weight_versions)


def sample_oldest_version(sample: Any) -> int:
    """The oldest weight version of a sample's tokens: ``Sample.metadata["oldest_weight_version"]``
    when the slime stream recorded it (in place, SGLang reports only the final version, so the
    stream records the version it knew at submission), else the oldest of ``Sample.weight_versions``."""
    metadata = getattr(sample, "metadata", None) or {}
    if "oldest_weight_version" in metadata:
        return parse_weight_version(metadata["oldest_weight_version"])
    return sample_version(getattr(sample, "weight_versions", None), getattr(sample, "index", None))


def group_staleness(versions: Iterable[int], trainer_version: int) -> int:
    """Staleness of a group: trainer version minus the oldest sample version (>= 0)."""
    oldest = min(versions)
    if oldest > trainer_version:
        raise ValueError(
            f"a sample has weight version {oldest}, newer than the training policy version "
            f"{trainer_version}: the driver's version count and the engines disagree"
        )
    return trainer_version - oldest


@dataclasses.dataclass
class StalenessGate:
    """Admits or drops groups by staleness and keeps the counts that get logged."""

    max_staleness: int | None = None
    stale_policy: str = "drop"
    admitted_groups: int = 0
    dropped_groups: int = 0
    dropped_samples: int = 0
    kept_over_limit_groups: int = 0
    requeued_groups: int = 0  # rejected, and regenerated from the fresh prompt instead of dropped
    histogram: Counter = dataclasses.field(default_factory=Counter)

    def __post_init__(self) -> None:
        check_stale_policy(self.stale_policy)
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {self.max_staleness}")

    def admit(self, staleness: int, group_size: int) -> bool:
        """True when the group goes to training; every decision is counted."""
        over = over_limit(staleness, self.max_staleness)
        if over and self.stale_policy == "drop":
            self.dropped_groups += 1
            self.dropped_samples += group_size
            return False
        if over:
            self.kept_over_limit_groups += 1
        self.admitted_groups += 1
        self.histogram[staleness] += 1
        return True

    def requeued(self, group_size: int) -> None:
        """A group ``admit`` rejected was requeued as its fresh prompt by the caller: it counts as
        requeued, not dropped (its prompt is not lost, only its stale samples)."""
        if self.dropped_groups < 1 or self.dropped_samples < group_size:
            raise ValueError(f"requeued a group of {group_size} samples that the gate never rejected")
        self.dropped_groups -= 1
        self.dropped_samples -= group_size
        self.requeued_groups += 1

    def metrics(self, prefix: str = "staleness/") -> dict[str, float]:
        """Statistics of the admitted groups plus the drop and requeue counters, for this batch."""
        count = sum(self.histogram.values())
        values = sorted(self.histogram.elements())
        out = {
            f"{prefix}admitted_groups": float(self.admitted_groups),
            f"{prefix}dropped_groups": float(self.dropped_groups),
            f"{prefix}dropped_samples": float(self.dropped_samples),
            f"{prefix}kept_over_limit_groups": float(self.kept_over_limit_groups),
            f"{prefix}requeued": float(self.requeued_groups),
        }
        if count:
            out[f"{prefix}mean"] = sum(values) / count
            out[f"{prefix}max"] = float(values[-1])
            out[f"{prefix}min"] = float(values[0])
            out[f"{prefix}frac_on_policy"] = self.histogram[0] / count
            for s in sorted(self.histogram):
                out[f"{prefix}groups_at_{s}"] = float(self.histogram[s])
        return out


def select_groups(
    groups: Sequence[Sequence[Any]],
    versions: Sequence[Sequence[int]],
    trainer_version: int,
    gate: StalenessGate,
    target: int,
) -> tuple[list[int], list[int]]:
    """Indices of admitted groups (at most ``target``) and the staleness of each, in order.

    Groups past ``target`` are not examined (the caller keeps them for the next batch).
    """
    admitted, stalenesses = [], []
    for index, (group, group_versions) in enumerate(zip(groups, versions, strict=True)):
        if len(admitted) >= target:
            break
        staleness = group_staleness(group_versions, trainer_version)
        if gate.admit(staleness, len(group)):
            admitted.append(index)
            stalenesses.append(staleness)
    return admitted, stalenesses


def annotate_group(group: Sequence[Any], versions: Sequence[int], trainer_version: int, staleness: int) -> None:
    """Record on each sample (``Sample.metadata``) the version that produced it and its staleness."""
    for sample, version in zip(group, versions, strict=True):
        metadata = getattr(sample, "metadata", None)
        if metadata is None:
            metadata = {}
            sample.metadata = metadata
        metadata["epic_policy_version"] = version
        metadata["epic_trainer_version"] = trainer_version
        metadata["epic_group_staleness"] = staleness


async def collect_admitted_groups(
    pop_groups,
    trainer_version: int,
    gate: StalenessGate,
    target: int,
    poll_seconds: float = 0.05,
    max_wait_seconds: float | None = None,
    on_drop=None,
    requeue=None,
) -> list[list[Any]]:
    """Pull finished groups from ``pop_groups(limit)`` until ``target`` groups are admitted.

    ``pop_groups`` returns finished groups (lists of samples with ``weight_versions``). A group the
    gate rejects goes to ``requeue(group)`` first when given (True: the caller regenerates its
    fresh prompt, counted as requeued), else, or when that returns False, it is dropped: counted in
    ``gate`` and passed to ``on_drop(group)``. Raises TimeoutError after ``max_wait_seconds``
    without a complete batch (None: wait forever, as slime's own async rollout does).
    """
    import asyncio
    import time

    if target < 1:
        raise ValueError(f"target must be >= 1 groups, got {target}")
    admitted: list[list[Any]] = []
    started = time.monotonic()
    while len(admitted) < target:
        groups = list(pop_groups(target - len(admitted)))
        if not groups:
            if max_wait_seconds is not None and time.monotonic() - started > max_wait_seconds:
                raise TimeoutError(
                    f"collected {len(admitted)}/{target} groups in {max_wait_seconds}s "
                    f"({gate.dropped_groups} dropped as staler than {gate.max_staleness})"
                )
            await asyncio.sleep(poll_seconds)
            continue
        versions = [[sample_oldest_version(s) for s in group] for group in groups]
        chosen, stalenesses = select_groups(groups, versions, trainer_version, gate, target - len(admitted))
        for index in sorted(set(range(len(groups))) - set(chosen)):
            if requeue is not None and requeue(groups[index]):
                gate.requeued(len(groups[index]))
            elif on_drop is not None:
                on_drop(groups[index])
        for index, staleness in zip(chosen, stalenesses, strict=True):
            annotate_group(groups[index], versions[index], trainer_version, staleness)
            admitted.append(list(groups[index]))
    return admitted


@dataclass
class Group:
    group_id: int  # data position of the prompt (unique over the run)
    version: int  # weight version that generated it
    samples: list[dict]  # prompt_ids, response_ids, behavior_log_probs, status, reward, ...

    def __len__(self) -> int:
        return len(self.samples)


@dataclass
class Selection:
    batch: list[Group] | None  # None: not enough fresh groups yet
    dropped: list[Group]  # removed for staleness (final)
    stale_kept: int = 0  # samples over K kept because stale_policy == "keep"


def select_batch(
    buffer: deque,
    current_version: int,
    n_groups: int,
    max_staleness: int,
    stale_policy: str,
    first_unfinished: int | None = None,
) -> Selection:
    """Take the oldest n_groups trainable groups in START order (group_id: the data position, handed
    out as groups start) from `buffer`, dropping stale ones on the way.

    ``first_unfinished``: the id of the oldest group still generating (None: none). Only groups
    started before it may be in the batch, so a batch waits for its oldest groups (the admission
    budget's FIFO: ``AdmissionBudget``). Mutates `buffer` (left in start order): dropped groups and
    the returned batch leave it; when fewer than n_groups trainable groups are ready, those stay
    and batch is None (drops are final)."""
    check_stale_policy(stale_policy)
    kept, dropped, rest = [], [], deque()
    for g in sorted(buffer, key=lambda g: g.group_id):
        lag = current_version - g.version
        if lag < 0:
            raise RuntimeError(f"group {g.group_id} has version {g.version} newer than the trainer's {current_version}")
        ready = first_unfinished is None or g.group_id < first_unfinished
        if len(kept) < n_groups and ready:
            if over_limit(lag, max_staleness) and stale_policy == "drop":
                dropped.append(g)
            else:
                kept.append(g)
        else:
            rest.append(g)
    buffer.clear()
    if len(kept) < n_groups:
        buffer.extend(sorted(kept + list(rest), key=lambda g: g.group_id))
        return Selection(batch=None, dropped=dropped)
    buffer.extend(rest)
    stale_kept = sum(len(g) for g in kept if over_limit(current_version - g.version, max_staleness))
    return Selection(batch=kept, dropped=dropped, stale_kept=stale_kept)


def trainable_groups(buffer: deque, current_version: int, max_staleness: int, stale_policy: str) -> int:
    """How many buffered groups ``select_batch`` would train rather than drop at ``current_version``
    (the same gate: the runtime tops its buffer up to a full batch of these before a checkpoint)."""
    check_stale_policy(stale_policy)
    if stale_policy == "keep":
        return len(buffer)
    return sum(1 for g in buffer if not over_limit(current_version - g.version, max_staleness))


@dataclass
class Accounting:
    generated: int = 0  # samples returned by rollout workers
    trained: int = 0
    dropped: int = 0  # over K with stale_policy drop
    stale_kept: int = 0  # over K with stale_policy keep (also in trained)
    lost: int = 0  # requested from a worker that died before answering
    worker_restarts: int = 0
    lag_hist: Counter = field(default_factory=Counter)  # lag -> trained samples

    def check(self, buffered: int) -> None:
        if self.generated != self.trained + self.dropped + buffered:
            raise RuntimeError(
                f"sample accounting broken: generated {self.generated} != trained {self.trained} "
                f"+ dropped {self.dropped} + buffered {buffered}"
            )

    def state(self) -> dict:
        d = {k: getattr(self, k) for k in ("generated", "trained", "dropped", "stale_kept", "lost", "worker_restarts")}
        d["lag_hist"] = {str(k): v for k, v in sorted(self.lag_hist.items())}
        return d

    @classmethod
    def from_state(cls, d: dict) -> "Accounting":
        a = cls(**{k: d[k] for k in ("generated", "trained", "dropped", "stale_kept", "lost", "worker_restarts")})
        a.lag_hist = Counter({int(k): v for k, v in d["lag_hist"].items()})
        return a


@dataclass
class GroupLedger:
    """Where every consumed prompt (group) is: in flight, delivered to training in a rollout, or
    dropped for staleness. Keys are any hashable group identity (slime: the data source's group
    index); the payload is what a resumed run needs to regenerate the group (its fresh prompt).
    """

    payloads: dict = field(default_factory=dict)  # key -> payload, for groups not yet final
    delivered: dict = field(default_factory=dict)  # key -> rollout id it was delivered in
    consumed: int = 0
    dropped: int = 0
    trained: int = 0  # delivered in a rollout <= the last one closed

    def consume(self, key: Hashable, payload: Any) -> None:
        if key in self.payloads or key in self.delivered:
            raise ValueError(f"group {key!r} consumed twice: the data source handed the same prompt out again")
        self.payloads[key] = payload
        self.consumed += 1

    def restore(self, key: Hashable, payload: Any) -> None:
        """A group handed out again after a resume (it was in flight when the run was saved)."""
        self.consume(key, payload)

    def deliver(self, key: Hashable, rollout_id: int) -> None:
        self._pending(key)
        self.delivered[key] = rollout_id

    def drop(self, key: Hashable) -> None:
        self._pending(key)
        del self.payloads[key]
        self.dropped += 1

    def _pending(self, key: Hashable) -> None:
        if key not in self.payloads:
            raise ValueError(f"group {key!r} was never consumed (or is already trained / dropped)")
        if key in self.delivered:
            raise ValueError(f"group {key!r} delivered twice (rollout {self.delivered[key]} and again)")

    def close_rollout(self, rollout_id: int) -> None:
        """Rollouts <= rollout_id are trained: their groups are final."""
        for key in [k for k, r in self.delivered.items() if r <= rollout_id]:
            del self.delivered[key]
            del self.payloads[key]
            self.trained += 1

    def in_flight(self) -> int:
        """Consumed, neither dropped nor in a closed rollout (generating, queued, or delivered to a
        rollout that is not trained yet)."""
        return len(self.payloads)

    def undelivered(self) -> int:
        return len(self.payloads) - len(self.delivered)

    def pending_payloads(self) -> list:
        """Payloads of every group a run saved now would have to regenerate, in consumption order."""
        return list(self.payloads.values())

    def check(self, worker_in_flight: int) -> None:
        """consumed = trained + dropped + in flight, and the worker holds what the ledger says."""
        if self.consumed != self.trained + self.dropped + self.in_flight():
            raise RuntimeError(
                f"prompt accounting broken: consumed {self.consumed} != trained {self.trained} + dropped "
                f"{self.dropped} + in flight {self.in_flight()}"
            )
        if worker_in_flight != self.undelivered():
            raise RuntimeError(
                f"prompt accounting broken: the rollout worker holds {worker_in_flight} groups, the ledger "
                f"{self.undelivered()} consumed and not yet delivered: groups were lost or duplicated"
            )

    def metrics(self, prefix: str = "rollout/accounting/") -> dict[str, float]:
        return {
            f"{prefix}consumed_groups": float(self.consumed),
            f"{prefix}trained_groups": float(self.trained),
            f"{prefix}dropped_groups": float(self.dropped),
            f"{prefix}in_flight_groups": float(self.in_flight()),
            f"{prefix}delivered_untrained_groups": float(len(self.delivered)),
        }
