"""The slime path's staleness gate (pure Python; slime's ``Sample`` is read, never imported).

Versions on slime: slime's weight updaters count updates from 0 and tag every SGLang response
with ``weight_version = str(n)`` after the n-th update; the driver pushes weights once before the
first rollout (version 1) and once after training each rollout, so the policy that starts
training rollout ``r`` is version ``r - start_rollout_id + 1`` (``AdmissionBudget``'s
first_train_version 1). A sample generated across a weight update carries several versions; its
oldest counts (a call that returned no tokens, e.g. a request aborted by a push before its first
token, contributes no version: the slime stream removes it).

``StalenessGate`` admits or drops each group by the shared rule (``epic_slime.staleness.is_dropped``)
and counts every decision; ``collect_admitted_groups`` pulls finished groups from the stream until a
batch is admitted. Where every consumed prompt is: ``epic_slime.slime.stream.ledger.GroupLedger``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from epic_slime.staleness import check_stale_policy, is_dropped, over_limit

# SGLang's weight_version before any update is the string "default": the initial weights.
INITIAL_VERSION_NAMES = ("default",)


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
        if is_dropped(staleness, self.max_staleness, self.stale_policy):
            self.dropped_groups += 1
            self.dropped_samples += group_size
            return False
        if over_limit(staleness, self.max_staleness):
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
