"""Length-decile reporting (epic_slime.length_deciles, reported by epic_slime.slime.rollout),
checked against an independent reference: bins by explicit rank thresholds, means by fractions."""

import random
from fractions import Fraction

import pytest

from epic_slime.length_deciles import OUTCOMES, decile_metrics, format_deciles, length_deciles


def _reference(records, deciles=10):
    """Per decile: (counts per outcome, mean lag of trained as a Fraction or None)."""
    order = sorted(range(len(records)), key=lambda i: (records[i][0], i))
    n = len(records)
    out = []
    for d in range(deciles):
        # rank r is in decile d when d * n <= deciles * r < (d + 1) * n
        members = [records[order[r]] for r in range(n) if d * n <= deciles * r < (d + 1) * n]
        counts = {o: sum(1 for m in members if m[2] == o) for o in OUTCOMES}
        lags = [m[1] for m in members if m[2] in ("trained", "over_k")]
        out.append((counts, Fraction(sum(lags), len(lags)) if lags else None))
    return out


@pytest.mark.parametrize("n", [1, 7, 10, 23, 100, 257])
def test_deciles_match_the_reference(n):
    rng = random.Random(n)
    records = [
        (rng.choice([5, 10, 10, 50, 200]) + rng.random() * (n % 3), rng.randint(0, 4), rng.choice(OUTCOMES))
        for _ in range(n)
    ]
    rows = length_deciles(records)
    for row, (counts, mean) in zip(rows, _reference(records), strict=True):
        assert row.counts == counts
        if mean is None:
            assert row.mean_staleness is None
        else:
            assert row.mean_staleness == pytest.approx(float(mean), abs=1e-12)
    assert sum(r.groups for r in rows) == n


def test_length_ranges_are_ordered_and_long_groups_land_last():
    records = [(float(length), 0 if length < 500 else 3, "trained") for length in range(0, 1000, 10)]
    rows = length_deciles(records)
    assert [r.groups for r in rows] == [10] * 10
    assert rows[0].min_length == 0 and rows[0].max_length == 90 and rows[9].min_length == 900
    assert rows[0].mean_staleness == 0 and rows[9].mean_staleness == 3
    metrics = decile_metrics(rows, "rollout/deciles/")
    assert metrics["rollout/deciles/d9/mean_staleness"] == 3.0
    assert metrics["rollout/deciles/staleness_gap"] == 3.0
    assert metrics["rollout/deciles/d0/trained"] == 10.0 and metrics["rollout/deciles/d0/dropped"] == 0.0
    table = format_deciles(rows)
    assert len(table.splitlines()) == 11 and "3.00" in table.splitlines()[-1]


def test_dropped_and_requeued_do_not_enter_the_mean():
    rows = length_deciles(
        [(1.0, 5, "dropped"), (2.0, 4, "requeued"), (3.0, 1, "trained"), (4.0, 3, "over_k")], deciles=1
    )
    assert rows[0].mean_staleness == 2.0 and rows[0].counts == {"trained": 1, "over_k": 1, "dropped": 1, "requeued": 1}


def test_empty_input_gives_empty_rows_and_no_metrics():
    rows = length_deciles([])
    assert all(r.groups == 0 for r in rows) and decile_metrics(rows, "x/") == {}


@pytest.mark.parametrize(
    "record, field",
    [
        ((1.0, 0, "lost"), "outcome"),
        ((-1.0, 0, "trained"), "response length"),
        ((float("nan"), 0, "trained"), "response length"),
        ((1.0, -1, "trained"), "lag"),
        ((1.0, 1.5, "trained"), "lag"),
        ((1.0, 0), "record"),
    ],
)
def test_bad_records_name_the_field(record, field):
    with pytest.raises(ValueError, match=field):
        length_deciles([record])
