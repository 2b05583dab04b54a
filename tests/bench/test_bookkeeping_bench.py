"""bench/bookkeeping_bench.py: the slime path's per-rollout bookkeeping, timed on the real functions."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
pytest.importorskip("slime.utils.types", reason="slime is not importable (SLIME_PATH)")

import bookkeeping_bench as bench  # noqa: E402

TINY = [
    "--prompts",
    "4",
    "--samples",
    "2",
    "--response-len",
    "300",
    "--prompt-len",
    "20",
    "--rollouts",
    "2",
    "--r3-samples",
    "2",
    "--r3-mem-samples",
    "2",
]


def test_a_tiny_run_reports_every_number(capsys):
    assert bench.main(TINY + ["--rollout-wall-s", "100"]) == 0
    out = capsys.readouterr().out
    cpu_s = float(re.search(r"CPU s per rollout \(process time, one thread\): ([0-9.]+) s", out).group(1))
    share = float(
        re.search(r"share of a simulated rollout \(100 s, paper preset async K=2 at 4 x 2\): ([0-9.]+)%", out).group(1)
    )
    assert cpu_s > 0 and share == pytest.approx(cpu_s / 100 * 100, abs=0.002)
    assert re.search(r"RolloutManager memory for one batch \+ held groups \(5 groups, 10 samples\)", out)
    # below 512 prompts the 512-prompt line is an extrapolation, and says so
    assert "linear extrapolation, measure with --prompts 512" in out


def test_the_share_is_taken_of_a_rollout_of_the_same_size():
    """More groups take longer to generate (sublinearly: the longest responses set the pace, about
    210 s at 16 x 8 against 280 s at 64 x 8 and 930 s at 512 x 8), so the share at --prompts 512 is
    not taken of a 64 x 8 rollout."""
    small, paper = bench.simulated_rollout_wall_s(16, 8), bench.simulated_rollout_wall_s(64, 8)
    assert 1.1 * small < paper
