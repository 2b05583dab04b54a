"""bench/async_pairs.py: the interleaved runtime re-measurement's log is read pair by pair, never mixed up."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from async_pairs import read_pairs, summary  # noqa: E402

LOG = """# old a, new b, 20 steps
== pair 1 old 05:11:29 load 0.87
async:    875.1 trained samples/s
async / sync trained-samples/s ratio: 1.16
== pair 1 new 05:12:30 load 1.38
async / sync trained-samples/s ratio: 1.13
== pair 2 old 05:13:35 load 1.30
async / sync trained-samples/s ratio: 1.34
== pair 2 new 05:14:35 load 1.65
async / sync trained-samples/s ratio: 1.40
"""


def test_pairs_are_read_in_order_and_differenced_new_minus_old():
    s = summary(read_pairs(LOG))
    assert s["pairs"] == 2
    assert s["diffs"] == pytest.approx([1.13 - 1.16, 1.40 - 1.34])
    assert s["old_median"] == pytest.approx(1.25) and s["new_median"] == pytest.approx(1.265)
    assert s["load_range"] == (0.87, 1.65)


def test_a_pair_missing_its_new_half_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unpaired runs \(old pairs \[1, 2\], new pairs \[1\]\)"):
        read_pairs(LOG.rsplit("== pair 2 new", 1)[0])


def test_the_committed_log_has_three_complete_pairs():
    s = summary(read_pairs((Path(__file__).resolve().parents[2] / "bench" / "async_pairs.log").read_text()))
    assert s["pairs"] == 3 and len(s["diffs"]) == 3
