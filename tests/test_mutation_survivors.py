"""Tests a mutation run showed missing (each kills a small plausible bug that survived the suite)."""

from __future__ import annotations

import pytest

from epic_slime.reward import math_reward
from epic_slime.reward.normalize import normalize_answer
from epic_slime.slime.staleness import StalenessGate


def test_staleness_min_is_the_smallest_admitted_lag():
    gate = StalenessGate(max_staleness=3, stale_policy="drop")
    for lag in (2, 3, 1, 2):
        assert gate.admit(lag, 4)
    m = gate.metrics()
    assert m["staleness/min"] == 1.0 and m["staleness/max"] == 3.0 and m["staleness/mean"] == 2.0
    assert not gate.admit(4, 4) and gate.metrics()["staleness/min"] == 1.0   # a dropped group is not a lag


@pytest.mark.parametrize("text,expected", [("0", "0"), ("00", "0"), ("-0", "0"), ("007", "7"), ("+0", "0")])
def test_zero_answers_stay_zero(text, expected):
    assert normalize_answer(text) == expected


def test_answer_zero_is_scored_and_an_empty_answer_is_not():
    assert math_reward("so the result is\nAnswer: 0", "0") == 1.0
    assert math_reward("so the result is\nAnswer: 000", "0") == 1.0
    assert math_reward("so the result is\nAnswer: ", "0") == 0.0        # "" must not equal a normalised "0"
    assert math_reward("so the result is\nAnswer: 1", "0") == 0.0
