"""The staleness rule both training paths share (pure Python, no framework).

lag (staleness) = the trainer's weight version when a group trains minus the version that generated
it (``epic_slime.admission.AdmissionBudget`` states the version convention); K = max_staleness. A
group with lag > K is dropped (stale_policy "drop"; on the slime path its prompt is regenerated
instead, up to a cap: "requeued") or trained anyway and counted ("keep"). ``is_dropped`` is that one
decision, for the slime gate (``epic_slime.slime.stream.gate``) and the runtime's batch selection
(``epic_slime.runtime.batches``). A GRPO group is kept or dropped as a whole (advantages are
normalised inside the group).

Admission keeps the rule from firing: ``AdmissionBudget`` starts a group only while the budget has
room and batches are taken in start order, so no trained group exceeds K; the gate re-checks and counts.
"""

from __future__ import annotations

STALE_POLICIES = ("drop", "keep")


def check_stale_policy(stale_policy: str) -> None:
    if stale_policy not in STALE_POLICIES:
        raise ValueError(f"stale_policy must be 'drop' or 'keep', got {stale_policy!r}")


def over_limit(lag: int, max_staleness: int | None) -> bool:
    """True when a lag exceeds the bound K (None: unbounded)."""
    return max_staleness is not None and lag > max_staleness


def is_dropped(lag: int, max_staleness: int | None, stale_policy: str) -> bool:
    """The drop rule: a group over K under stale_policy "drop" does not train."""
    return over_limit(lag, max_staleness) and stale_policy == "drop"
