"""The simulator's "best" line: the fastest row that is steady (not past its throughput bound), with
nothing dropped, <= 1% requeued and none over K. A row measured faster than its bound is a window too
short for its K, not a schedule that beats the bound (the frontier's K = 8 rows at 116% and 128%)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from schedsim.report import STEADY_SHARE_MAX, best_line, best_row  # noqa: E402


def _row(k: int, ratio: float, share: float, dropped: int = 0, requeued_share: float = 0.0, over_k: int = 0) -> dict:
    return dict(schedule=f"async K={k}", push="abort", split="24:8", gpe=4, ratio=ratio, share=share,
                dropped=dropped, requeued_share=requeued_share, over_k=over_k)


def test_a_row_past_its_bound_is_not_the_best():
    rows = [_row(2, 1.50, 0.73), _row(4, 1.89, 0.90), _row(8, 2.47, 1.16)]
    assert best_row(rows)["schedule"] == "async K=4"
    line = best_line(rows)
    assert line.startswith("best: K=4 push=abort split=24:8x4: 1.89x (90% of bound)")
    assert "1 row(s) past" in line


def test_the_slack_admits_a_row_at_the_bound_and_no_further():
    assert best_row([_row(2, 1.5, 0.8), _row(8, 2.0, STEADY_SHARE_MAX)])["schedule"] == "async K=8"
    assert best_row([_row(2, 1.5, 0.8), _row(8, 2.0, STEADY_SHARE_MAX + 0.01)])["schedule"] == "async K=2"


def test_drops_requeues_and_over_k_disqualify_before_speed():
    rows = [_row(1, 1.1, 0.5), _row(2, 1.9, 0.9, dropped=1), _row(3, 1.8, 0.9, requeued_share=0.02),
            _row(4, 1.7, 0.9, over_k=3)]
    assert best_row(rows)["schedule"] == "async K=1"
    assert "past" not in best_line(rows)
