""".ci/run writes every test's duration and tier to a file (tests/conftest.py, EPIC_SLIME_TEST_DURATIONS)
and sums it by tier (.ci/durations.py): the slow share of the suite is data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ci_scripts

REPO = Path(__file__).resolve().parents[2]


def _summary_module():
    return ci_scripts.load("durations")


def test_the_summary_sums_each_tier_and_the_fast_tier_is_everything_not_slow(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text(
        "seconds\toutcome\ttiers\tnodeid\n"
        "10.0\tpassed\tslow,real_sglang\ttests/a.py::t1\n"
        "2.5\tfailed\tslow\ttests/a.py::t2\n"
        "0.5\tpassed\tneeds_slime\ttests/b.py::t3\n"
        "0.25\tskipped\t-\ttests/c.py::t4\n"
    )
    got = _summary_module().summarize(path)
    assert got["all"] == (4, pytest.approx(13.25))
    assert got["slow"] == (2, pytest.approx(12.5)) and got["real_sglang"] == (1, pytest.approx(10.0))
    assert got["fast"] == (2, pytest.approx(0.75)) and got["needs_slime"] == (1, pytest.approx(0.5))


def test_the_slowest_files_come_first_with_their_tests_summed(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text(
        "seconds\toutcome\ttiers\tnodeid\n"
        "3.0\tpassed\t-\ttests/b.py::t1\n"
        "10.0\tpassed\tslow\ttests/a.py::t1[x]\n"
        "4.0\tpassed\t-\ttests/b.py::t2\n"
        "0.5\tpassed\t-\ttests/c.py::t1\n"
    )
    files = _summary_module().slowest_files(path, n=2)
    assert [(f, n) for f, n, _ in files] == [("tests/a.py", 1), ("tests/b.py", 2)]
    assert files[1][2] == pytest.approx(7.0)


def test_a_run_writes_one_line_per_test_with_its_outcome_and_tiers(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_x.py").write_text(
        "import time, pytest\n\n"
        "def test_quick():\n    pass\n\n"
        "@pytest.mark.slow\ndef test_sleepy():\n    time.sleep(0.3)\n\n"
        "def test_red():\n    assert False\n"
    )
    # the project's conftest (its plugin) in a folder of its own, with the project's settings
    (tests / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    out = tmp_path / "out" / "durations.tsv"
    env = {**os.environ, "EPIC_SLIME_TEST_DURATIONS": str(out)}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(REPO / "pyproject.toml"),
            str(tests),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert rows[0] == ["seconds", "outcome", "tiers", "nodeid"]
    by_name = {r[3].rsplit("::", 1)[1]: r for r in rows[1:]}
    assert set(by_name) == {"test_quick", "test_sleepy", "test_red"}
    assert by_name["test_sleepy"][2] == "slow" and float(by_name["test_sleepy"][0]) >= 0.3
    assert rows[1][3].endswith("test_sleepy")  # slowest first
    assert by_name["test_red"][1] == "failed" and by_name["test_quick"][1:3] == ["passed", "-"]
