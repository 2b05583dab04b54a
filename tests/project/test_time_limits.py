"""Every test has a time limit (pytest-timeout, configured in pyproject.toml and tests/conftest.py):
a hang fails within its limit, names its test, and the rest of the suite still runs."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

import conftest

REPO = Path(__file__).resolve().parents[2]


def test_the_suite_has_a_default_limit_and_the_signal_method():
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < float(ini["timeout"]) <= 300 and ini["timeout_method"] == "signal"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("pytest-timeout") for r in extras["test"])


def test_every_slow_file_and_test_named_exists():
    missing = [f for f in conftest.SLOW_FILE_TIMEOUT_S if not (REPO / f).is_file()]
    assert not missing, f"stale entries in tests/conftest.py SLOW_FILE_TIMEOUT_S: {missing}"
    for nodeid in conftest.SLOW_TEST_TIMEOUT_S:
        path, name = nodeid.split("::")
        assert f"def {name}(" in (REPO / path).read_text(), f"stale entry in SLOW_TEST_TIMEOUT_S: {nodeid}"


def test_this_test_carries_its_limit(request):
    marker = request.node.get_closest_marker("timeout")
    if request.config.getoption("timeout", None) is not None or not float(request.config.getini("timeout") or 0):
        pytest.skip("--timeout given on the command line (one limit for all), or no default limit")
    assert marker is not None and marker.args[0] == pytest.approx(
        float(request.config.getini("timeout")) * conftest._timeout_scale()
    )


def test_the_scale_multiplies_a_slow_files_limit(monkeypatch):
    class Item:
        fspath, nodeid = REPO / "tests" / "runtime" / "test_runtime_e2e.py", "tests/runtime/test_runtime_e2e.py::t"

    monkeypatch.setenv(conftest.TIMEOUT_SCALE_ENV, "2.5")
    assert conftest.time_limit_s(Item, 120) == 2.5 * conftest.SLOW_FILE_TIMEOUT_S["tests/runtime/test_runtime_e2e.py"]
    Item.fspath, Item.nodeid = REPO / "tests" / "project" / "test_docs.py", "tests/project/test_docs.py::t[x]"
    assert conftest.time_limit_s(Item, 120) == 2.5 * 120
    nodeid, own = next(iter(conftest.SLOW_TEST_TIMEOUT_S.items()))  # a single test's own limit beats its file's
    Item.fspath, Item.nodeid = REPO / nodeid.split("::")[0], nodeid
    assert conftest.time_limit_s(Item, 120) == 2.5 * own
    monkeypatch.setenv(conftest.TIMEOUT_SCALE_ENV, "0")
    with pytest.raises(pytest.UsageError, match="EPIC_SLIME_TEST_TIMEOUT_SCALE='0': must be a number > 0"):
        conftest.time_limit_s(Item, 120)


def test_a_hanging_test_fails_by_name_and_the_next_one_runs(tmp_path):
    """The project's pytest settings (its pyproject.toml) on a file with a test that sleeps for an
    hour, with a 2 s limit: that test fails naming itself, and the test after it passes."""
    (tmp_path / "test_hang.py").write_text(
        "import time\n\n\ndef test_sleeps_for_an_hour():\n    time.sleep(3600)\n\n\n"
        "def test_after_it():\n    assert True\n"
    )
    start = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(REPO / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-o",
            "timeout=2",
            str(tmp_path / "test_hang.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - start
    out = done.stdout + done.stderr
    assert done.returncode == 1 and took < 60, (took, out)
    assert "FAILED" in out and "test_sleeps_for_an_hour" in out and "Timeout" in out, out
    assert "1 failed, 1 passed" in out, out


def test_the_slow_tail_says_what_is_running(monkeypatch):
    """The first test of a slow file names the file, an end-to-end (`slow`) test names itself, others
    stay dots; the line is printed as the test starts."""

    class Item:
        def __init__(self, rel, name, slow=False):
            self.fspath, self.nodeid, self.slow = REPO / rel, f"{rel}::{name}", slow

        def get_closest_marker(self, name):
            return object() if name == "slow" and self.slow else None

    e2e, docs = "tests/runtime/test_runtime_e2e.py", "tests/project/test_docs.py"
    items = [Item(docs, "a"), Item(e2e, "test_first"), Item(e2e, "test_big_run", slow=True), Item(e2e, "test_small")]
    monkeypatch.delenv(conftest.TIMEOUT_SCALE_ENV, raising=False)
    limit = conftest.SLOW_FILE_TIMEOUT_S[e2e]
    assert conftest.announcements(items, 120) == {
        f"{e2e}::test_first": f"running {e2e} (3 tests of a slow file; limit {limit:.0f} s each)",
        f"{e2e}::test_big_run": f"running {e2e}::test_big_run (end-to-end; limit {limit:.0f} s)",
    }

    lines = []

    class Reporter:
        def write(self, text):
            lines.append(text)

        def write_line(self, text):
            lines.append(text)

    monkeypatch.setitem(conftest._REPORTER, "tr", Reporter())
    monkeypatch.setattr(conftest, "_ANNOUNCE", conftest.announcements(items, 120))
    for item in items:
        conftest.pytest_runtest_logstart(item.nodeid, None)
    assert lines == [
        f"running {e2e} (3 tests of a slow file; limit {limit:.0f} s each)",
        f"running {e2e}::test_big_run (end-to-end; limit {limit:.0f} s)",
    ]


# ---- the tiers: the slow list sets the marker too (tests/conftest.py, tier_markers) ----


def _collected(*args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_a_slow_files_tests_are_marked_slow_and_the_fast_tier_leaves_them_out():
    path = "tests/bench/test_gpu_check.py"  # listed, and no `slow` marker of its own: the list marks it
    assert path in conftest.SLOW_FILE_TIMEOUT_S and "mark.slow" not in (REPO / path).read_text()
    every = _collected(path)
    assert every and _collected(path, "-m", "slow") == every
    assert _collected(path, "-m", "not slow") == []


def test_a_fast_file_stays_in_the_fast_tier():
    path = "tests/project/test_packaging.py"
    assert path not in conftest.SLOW_FILE_TIMEOUT_S
    every = _collected(path)
    assert every and _collected(path, "-m", "not slow") == every and _collected(path, "-m", "slow") == []


def test_only_the_real_server_half_of_a_conformance_test_is_real_sglang():
    path = "tests/slime_adapter/test_sglang_conformance.py"
    every = _collected(path)
    if not every:
        pytest.skip("the conformance file skipped at collection (aiohttp / requests absent)")
    real = _collected(path, "-m", "real_sglang")
    assert real and all("[real" in nodeid or "real]" in nodeid for nodeid in real)
    assert set(_collected(path, "-m", "not real_sglang")) == set(every) - set(real)


def test_a_module_that_imports_slime_is_needs_slime():
    path = "tests/slime_adapter/test_engine_faults.py"
    every = _collected(path)
    if not every:
        pytest.skip("slime is not importable here (SLIME_PATH): the file skipped at collection")
    assert _collected(path, "-m", "needs_slime") == every
    assert _collected("tests/project/test_packaging.py", "-m", "needs_slime") == []


def test_a_megatron_file_is_megatron_and_nothing_else_is():
    path = "tests/slime_adapter/test_megatron_cpu_patches.py"
    assert path.startswith(conftest.MEGATRON_FILES)
    every = _collected(path)
    if not every:
        pytest.skip("Megatron-core or megatron.training is not importable here: the file skipped at collection")
    assert _collected(path, "-m", "megatron") == every
    assert _collected("tests/project/test_packaging.py", "-m", "megatron") == []


def test_the_launchers_tests_are_launch_and_nothing_else_is():
    path = "tests/launch/test_launch_reeval.py"
    assert path.startswith(conftest.LAUNCH_TESTS)
    every = _collected(path)
    assert every and _collected(path, "-m", "launch") == every
    assert _collected("tests/project/test_packaging.py", "-m", "launch") == []


def test_a_marker_nobody_registered_is_refused(tmp_path):
    (tmp_path / "test_typo.py").write_text("import pytest\n\n@pytest.mark.slwo\ndef test_x():\n    pass\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(REPO / "pyproject.toml"),
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "'slwo' not found in `markers`" in done.stdout + done.stderr
