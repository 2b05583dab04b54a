"""Staleness, drops and requeues by response-length decile (pure Python; reported by
``epic_slime.slime.rollout``).

A schedule that favours short responses shows it here: long groups dropped, requeued, trained
past K or staler than short ones. Each record is one group decision: (response length, lag,
outcome), outcome one of ``OUTCOMES``:

- ``trained``: trained at lag <= K;
- ``over_k``: trained at lag > K (``--stale-policy keep``), counted;
- ``dropped``: rejected for staleness and its prompt not regenerated;
- ``requeued``: rejected for staleness and regenerated from its prompt (a new group later).

Deciles are by rank: the records sorted by length (stable), record i of n in decile
floor(10 i / n); fewer than 10 records leave some deciles empty. Mean staleness is over the
groups trained (``trained`` and ``over_k``); a decile with none has None.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

OUTCOMES = ("trained", "over_k", "dropped", "requeued")
DECILES = 10


@dataclass
class DecileRow:
    decile: int  # 0 = shortest tenth
    min_length: float | None = None
    max_length: float | None = None
    counts: dict = field(default_factory=lambda: {o: 0 for o in OUTCOMES})
    lag_sum: int = 0  # over trained groups (trained + over_k)

    @property
    def groups(self) -> int:
        return sum(self.counts.values())

    @property
    def trained_groups(self) -> int:
        return self.counts["trained"] + self.counts["over_k"]

    @property
    def mean_staleness(self) -> float | None:
        return self.lag_sum / self.trained_groups if self.trained_groups else None


def _check(record) -> tuple[float, int, str]:
    try:
        length, lag, outcome = record
    except (TypeError, ValueError):
        raise ValueError(f"a decile record is (response length, lag, outcome), got {record!r}") from None
    if outcome not in OUTCOMES:
        raise ValueError(f"decile record outcome must be one of {OUTCOMES}, got {outcome!r}")
    if isinstance(length, bool) or not isinstance(length, (int, float)) or not math.isfinite(length) or length < 0:
        raise ValueError(f"decile record response length must be a finite number >= 0, got {length!r}")
    if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
        raise ValueError(f"decile record lag must be an integer >= 0, got {lag!r}")
    return float(length), lag, outcome


def length_deciles(records: Iterable[tuple[float, int, str]], deciles: int = DECILES) -> list[DecileRow]:
    """Per-decile counts of each outcome, length range and mean staleness of the trained groups."""
    if isinstance(deciles, bool) or not isinstance(deciles, int) or deciles < 1:
        raise ValueError(f"deciles must be an integer >= 1, got {deciles!r}")
    checked = sorted((_check(r) for r in records), key=lambda r: r[0])
    rows = [DecileRow(d) for d in range(deciles)]
    n = len(checked)
    for i, (length, lag, outcome) in enumerate(checked):
        row = rows[deciles * i // n]
        row.min_length = length if row.min_length is None else min(row.min_length, length)
        row.max_length = length if row.max_length is None else max(row.max_length, length)
        row.counts[outcome] += 1
        if outcome in ("trained", "over_k"):
            row.lag_sum += lag
    return rows


def decile_metrics(rows: list[DecileRow], prefix: str) -> dict[str, float]:
    """Flat metrics: ``{prefix}d{i}/{groups,min_length,max_length,trained,over_k,dropped,requeued,
    mean_staleness}`` and the
    longest-minus-shortest mean staleness (``{prefix}staleness_gap``, when both are known)."""
    out: dict[str, float] = {}
    for row in rows:
        if not row.groups:
            continue
        base = f"{prefix}d{row.decile}/"
        out[base + "groups"] = float(row.groups)
        out[base + "min_length"], out[base + "max_length"] = float(row.min_length), float(row.max_length)
        for outcome in OUTCOMES:
            out[base + outcome] = float(row.counts[outcome])
        if row.mean_staleness is not None:
            out[base + "mean_staleness"] = row.mean_staleness
    known = [r for r in rows if r.mean_staleness is not None]
    if len(known) >= 2:
        out[f"{prefix}staleness_gap"] = known[-1].mean_staleness - known[0].mean_staleness
    return out


def format_deciles(rows: list[DecileRow]) -> str:
    """A text table, one line per non-empty decile."""
    lines = ["decile  length          groups  trained  over_k  dropped  requeued  mean_staleness"]
    for row in rows:
        if not row.groups:
            continue
        mean = "-" if row.mean_staleness is None else f"{row.mean_staleness:.2f}"
        lines.append(
            f"{row.decile:>6}  {row.min_length:>6.0f}-{row.max_length:<7.0f} {row.groups:>6}  "
            f"{row.counts['trained']:>7}  {row.counts['over_k']:>6}  {row.counts['dropped']:>7}  "
            f"{row.counts['requeued']:>8}  {mean:>14}"
        )
    return "\n".join(lines)
