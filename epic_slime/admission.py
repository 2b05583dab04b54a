"""The admission budget shared by the slime stream and the embedded runtime (pure Python): AReaL's
staleness budget, in groups. The one object that counts the live groups: both paths start, discard
and ask for room through it, and nothing else keeps the count."""

from __future__ import annotations

import sys
from typing import Any


class AdmissionBudget:
    """How many groups may be generating or waiting for training at once (AReaL's rule, in groups).

    Versions (one convention for both paths): a weight version counts the trainer's updates, and
    lag = the trainer's version when a group trains minus the version that generated it. Batch b
    (0-based, batches taken in start order) trains at version ``first_train_version + b``: slime
    pushes once before its first rollout, so its first batch trains at version 1 (the default); the
    embedded runtime trains its first batch on the initial weights, version 0. Callers pass the
    version the group generates with, as it is, and nothing else.

    The rule: a new group may START only while live < (g - first_train_version + 1 + K) * B, with
    g = the engine weight version the group starts at (slime: the version the driver knows has
    landed; while a push is in flight, the older one), K = ``max_staleness``, B = ``batch_groups``,
    live = groups started and not discarded (a requeued, dropped or lost group no longer counts;
    its regeneration is a new start). In slime's versions that is (g + K) * B. The n-th live group
    (0-based) started at a g with n < (g - f + 1 + K) B and trains at version f + floor(n / B), so
    its lag is <= K: nothing is dropped or requeued for staleness. K = 0 is the synchronous schedule
    (B groups, then wait). ``max_staleness=None``: no limit (``limit`` is None, ``room`` is
    ``UNBOUNDED_ROOM``).

    The count: ``start(n)`` when groups start (also beyond ``room``: a checkpoint's top-up),
    ``discard(n)`` when live groups leave without training (dropped, requeued, lost with a worker),
    ``restore(started)`` after a resume; ``live = started - discarded``. A trained group stays
    counted: the window moves with the version, not with the count.
    """

    UNBOUNDED_ROOM = sys.maxsize

    def __init__(self, batch_groups: int, max_staleness: int | None, first_train_version: int = 1):
        if not _is_int(batch_groups) or batch_groups < 1:
            raise ValueError(f"AdmissionBudget.batch_groups must be an integer >= 1, got {batch_groups!r}")
        if max_staleness is not None and (not _is_int(max_staleness) or max_staleness < 0):
            raise ValueError(f"AdmissionBudget.max_staleness must be an integer >= 0 or None, got {max_staleness!r}")
        if first_train_version not in (0, 1):
            raise ValueError(f"AdmissionBudget.first_train_version must be 0 or 1, got {first_train_version!r}")
        self.batch_groups = batch_groups
        self.max_staleness = max_staleness
        self.first_train_version = first_train_version
        self.started = 0  # groups started (since the run began, or since the restore)
        self.discarded = 0  # of those, left without training

    def __repr__(self) -> str:
        return (
            f"AdmissionBudget(B={self.batch_groups}, K={self.max_staleness}, first_train_version="
            f"{self.first_train_version}, started={self.started}, discarded={self.discarded})"
        )

    @property
    def live(self) -> int:
        """Groups started and not discarded: generating, waiting for training, or trained."""
        return self.started - self.discarded

    def limit(self, engine_version: int) -> int | None:
        """Most live groups allowed while the engines hold ``engine_version``: (g - f + 1 + K) * B."""
        if not _is_int(engine_version) or engine_version < 0:
            raise ValueError(f"engine_version must be an integer >= 0, got {engine_version!r}")
        if self.max_staleness is None:
            return None
        windows = engine_version - self.first_train_version + 1 + self.max_staleness
        return windows * self.batch_groups

    def room(self, engine_version: int) -> int:
        """How many more groups may start now at ``engine_version`` (>= 0; ``UNBOUNDED_ROOM`` without a limit)."""
        limit = self.limit(engine_version)
        if limit is None:
            return self.UNBOUNDED_ROOM
        # start while live < limit: the last one allowed makes live == limit
        return max(0, limit - self.live)

    def start(self, n: int = 1) -> None:
        """``n`` groups started."""
        _check_count("start", n)
        self.started += n

    def discard(self, n: int = 1) -> None:
        """``n`` live groups left without training (dropped, requeued, lost): their slots free up."""
        _check_count("discard", n)
        if n > self.live:
            raise ValueError(f"discard({n}) with only {self.live} live groups: a group left the budget twice")
        self.discarded += n

    def state(self) -> dict:
        return {"started": self.started, "discarded": self.discarded}

    def restore(self, started: int, discarded: int = 0) -> None:
        """The counts after a resume (the runtime: a checkpoint is quiescent, so trained + buffered
        groups are live and none is generating)."""
        _check_count("restore started", started)
        _check_count("restore discarded", discarded)
        if discarded > started:
            raise ValueError(f"restore: discarded {discarded} > started {started}")
        self.started, self.discarded = started, discarded


def _check_count(what: str, n: Any) -> None:
    if not _is_int(n) or n < 0:
        raise ValueError(f"AdmissionBudget.{what} needs an integer count >= 0, got {n!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
