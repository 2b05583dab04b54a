""".ci/lanes.py runs the suite in two pytest processes at once: every test in exactly one lane, and the
suite's exit status from both."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ci_scripts
from _pytest.mark.expression import Expression

import conftest

REPO = Path(__file__).resolve().parents[2]


def _lanes_module():
    return ci_scripts.load("lanes")


def test_every_combination_of_tier_markers_falls_in_exactly_one_lane():
    lanes = _lanes_module().LANES
    compiled = {name: Expression.compile(expr) for name, expr in lanes.items()}
    for n in range(len(conftest.TIER_MARKERS) + 1):
        for markers in itertools.combinations(conftest.TIER_MARKERS, n):
            hits = [name for name, expr in compiled.items() if expr.evaluate(lambda m, have=markers: m in have)]
            assert len(hits) == 1, (markers, hits)
    # the real server starts in one lane only: every test that needs it, and Megatron's, are there
    assert compiled["server"].evaluate(lambda m: m == "real_sglang")
    assert compiled["server"].evaluate(lambda m: m == "megatron")
    assert compiled["server"].evaluate(lambda m: m == "launch")
    assert not compiled["server"].evaluate(lambda m: m in ("slow", "needs_slime"))


@pytest.mark.parametrize(
    "codes, expected",
    [
        ([0, 0], 0),
        ([0, 5], 0),  # a lane with nothing to run (e.g. no slime here) is not a failure
        ([5, 0], 0),
        ([5, 5], 5),  # nothing collected anywhere: the caller's failure
        ([1, 0], 1),
        ([0, 1], 1),
        ([5, 2], 2),
        ([3, 1], 3),  # the first failing lane's status
    ],
)
def test_the_suites_exit_status_comes_from_both_lanes(codes, expected):
    assert _lanes_module().combined_exit(codes) == expected


def _tiny_suite(root: Path, failing: str | None) -> None:
    (root / "pytest.ini").write_text(
        "[pytest]\naddopts = --strict-markers -p no:cacheprovider\nmarkers =\n    real_sglang: x\n    megatron: x\n    launch: x\n"
    )
    tests = {
        "test_server.py": "import pytest\n\n@pytest.mark.real_sglang\ndef test_real():\n    {body}\n",
        "test_megatron.py": "import pytest\n\n@pytest.mark.megatron\ndef test_mcore():\n    {body}\n",
        "test_plain.py": "def test_plain():\n    {body}\n",
    }
    for name, text in tests.items():
        body = "assert False" if name == failing else "pass"
        (root / name).write_text(text.format(body=body))


def _run_lanes(root: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "EPIC_SLIME_TEST_DURATIONS")}
    return subprocess.run(
        [sys.executable, str(REPO / ".ci" / "lanes.py"), "-rA"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_each_test_runs_once_in_its_lane_and_the_server_lanes_log_is_printed_after(tmp_path):
    _tiny_suite(tmp_path, failing=None)
    done = _run_lanes(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    server_part = out[out.index("==== the server lane") :]
    rest_part = out[: out.index("==== the server lane")]
    assert "PASSED test_server.py::test_real" in server_part and "PASSED test_megatron.py::test_mcore" in server_part
    assert "PASSED test_plain.py::test_plain" in rest_part and "test_plain" not in server_part
    assert out.count("PASSED test_server.py::test_real") == 1 and out.count("PASSED test_plain.py::test_plain") == 1
    assert (tmp_path / ".ci-out" / "lane-server.log").is_file()


@pytest.mark.parametrize("failing", ["test_server.py", "test_plain.py"])
def test_a_failure_in_either_lane_fails_the_suite(tmp_path, failing):
    _tiny_suite(tmp_path, failing=failing)
    done = _run_lanes(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"FAILED {failing}::" in done.stdout
