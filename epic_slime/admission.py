"""The admission rule shared by the slime stream and the embedded runtime (pure Python; re-exported
by ``epic_slime.staleness``): AReaL's staleness budget, in groups, in slime's versions."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any


@dataclasses.dataclass(frozen=True)
class AdmissionBudget:
    """How many groups may be generating or waiting for training at once (AReaL's rule, in groups).

    A new group may START only while ``live_started < (g + K) * B``: g = the engine weight version
    the driver knows has landed (while a push is in flight, the older one), K = ``max_staleness``,
    B = ``batch_groups``, live_started = groups started since the run's first rollout and not
    discarded (a requeued or dropped group no longer counts; its regeneration is a new start).
    With batches taken in start order (FIFO), the n-th live group started at a g with
    n < (g + K) B and trains at trainer version floor(n / B) + 1, so its lag is <= K: nothing is
    dropped or requeued for staleness. K = 0 is the synchronous schedule (B groups, then wait).
    ``max_staleness=None``: no limit (``limit`` is None, ``room`` is ``UNBOUNDED_ROOM``).
    """

    batch_groups: int
    max_staleness: int | None

    UNBOUNDED_ROOM = sys.maxsize

    def __post_init__(self) -> None:
        if not _is_int(self.batch_groups) or self.batch_groups < 1:
            raise ValueError(f"AdmissionBudget.batch_groups must be an integer >= 1, got {self.batch_groups!r}")
        if self.max_staleness is not None and (not _is_int(self.max_staleness) or self.max_staleness < 0):
            raise ValueError(
                f"AdmissionBudget.max_staleness must be an integer >= 0 or None, got {self.max_staleness!r}"
            )

    def limit(self, engine_version: int) -> int | None:
        """Most live groups allowed while the engines hold version ``engine_version``: (g + K) * B."""
        if not _is_int(engine_version) or engine_version < 0:
            raise ValueError(f"engine_version must be an integer >= 0, got {engine_version!r}")
        if self.max_staleness is None:
            return None
        return (engine_version + self.max_staleness) * self.batch_groups

    def room(self, engine_version: int, live_started: int) -> int:
        """How many more groups may start now (>= 0; ``UNBOUNDED_ROOM`` without a limit)."""
        if not _is_int(live_started) or live_started < 0:
            raise ValueError(f"live_started must be an integer >= 0, got {live_started!r}")
        limit = self.limit(engine_version)
        if limit is None:
            return self.UNBOUNDED_ROOM
        # start while live_started < limit: the last one allowed makes live_started == limit
        return max(0, limit - live_started)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
