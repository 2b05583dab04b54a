"""``GroupLedger``: where every consumed prompt (group) of the slime path is (pure Python): in flight,
delivered to training in a rollout, trained, or dropped for staleness. The bookkeeping invariant,
checked every rollout: consumed = trained + dropped + in flight."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any


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
