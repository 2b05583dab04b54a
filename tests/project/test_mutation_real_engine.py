"""The mutation check runs the real-engine files (issue 46 item 2): a slip that only the real SGLang server
or router reaches is killed there when the venv is on the machine, instead of counting as untested.
The runner's ``REAL_ENGINE_TESTS`` names every real-engine file and what it covers; a survivor of its own
tests runs again against the real-engine files of its source, with the real engine required."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# what makes a test file need the real engines: their fixtures (tests/conftest.py), a test of the
# conformance ``engine`` fixture (its real-server half; tests/slime_adapter/conftest.py provides it), or
# the venv's own helpers (the real router, SGLang's offline engine; not a port helper such as free_port); a
# file with a fixture of its own named ``engine`` fakes one
_REAL = re.compile(
    r"\breal_engines\b|\bvictim_server\b|\breal_sglang\.(?:required|sglang_python|RealRouter|RealServer)\b"
    r"|^def test_\w+\((?:[^)]*\W)?engine\b",
    re.M,
)


def _is_real_engine(text: str) -> bool:
    return bool(_REAL.search(text)) and not re.search(r"^def engine\(", text, re.M)  # not a file's own fake


def _runner():
    spec = importlib.util.spec_from_file_location("mutation_run", REPO / "tests" / "mutation" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_real_engine_file_is_listed_with_source_that_exists():
    run = _runner()
    found = {
        str(p.relative_to(REPO))
        for p in (REPO / "tests").glob("*/test_*.py")
        if p.name != Path(__file__).name and _is_real_engine(p.read_text())
    }
    assert found == set(run.REAL_ENGINE_TESTS), (
        f"unlisted: {sorted(found - set(run.REAL_ENGINE_TESTS))}, listed but not real-engine: "
        f"{sorted(set(run.REAL_ENGINE_TESTS) - found)}"
    )
    for test, covered in run.REAL_ENGINE_TESTS.items():
        for source in covered:
            assert (REPO / source).is_dir() if source.endswith("/") else (REPO / source).is_file(), (test, source)


def test_a_source_file_reaches_the_real_engine_files_that_cover_it():
    run = _runner()
    faults = run.real_engine_tests(
        "epic_slime/slime/stream/engine_faults.py", ["tests/slime_adapter/test_engine_faults.py"]
    )
    assert "tests/slime_adapter/test_engine_faults_real.py" in faults
    assert "tests/slime_adapter/test_slime_e2e_real.py" in faults  # through its folder, epic_slime/slime/
    assert "tests/slime_adapter/test_real_sglang.py" not in faults
    # a file the mutant already names is not run twice
    assert "tests/slime_adapter/test_engine_faults_real.py" not in run.real_engine_tests(
        "epic_slime/slime/stream/engine_faults.py", ["tests/slime_adapter/test_engine_faults_real.py"]
    )
    assert run.real_engine_tests("epic_slime/losses/core.py", []) == ["tests/slime_adapter/test_slime_e2e_real.py"]
    assert run.real_engine_tests("epic_slime/runtime/driver.py", []) == []


def _mutant_tree(tmp_path):
    (tmp_path / "epic_slime" / "slime" / "stream").mkdir(parents=True)
    (tmp_path / "epic_slime" / "slime" / "stream" / "engine_faults.py").write_text("DELAY = 2\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_own.py").write_text("")
    return {
        "id": "m",
        "file": "epic_slime/slime/stream/engine_faults.py",
        "original": "DELAY = 2",
        "replacement": "DELAY = 0",
        "tests": ["tests/test_own.py"],
        "user_meets": "-",
    }


def test_a_survivor_of_its_own_tests_is_run_against_the_real_engine(tmp_path, monkeypatch):
    run = _runner()
    m = _mutant_tree(tmp_path)
    monkeypatch.setattr(run, "run_tests", lambda root, tests, timeout, extra_env=None: (0, 1.0, "1 passed"))
    real = run.RealEngine("/venv/bin/python", timeout=900.0)
    seen = []

    def real_run(root, tests):
        seen.append((tests, (root / m["file"]).read_text()))
        return (1, 2.0, "1 failed") if len(seen) == 1 else (0, 2.0, "3 passed")  # then the unmutated control

    monkeypatch.setattr(real, "run", real_run)
    result = run.check_one(tmp_path, m, timeout=10.0, real=real)
    assert result["result"] == "killed" and result["why"].startswith("(real engine)")
    # run with the mutant applied, and only the real-engine files of that source
    assert seen and seen[0][1] == "DELAY = 0\n"
    assert seen[0][0] == run.real_engine_tests(m["file"], m["tests"])
    assert (tmp_path / m["file"]).read_text() == "DELAY = 2\n"  # restored
    assert real.env["EPIC_SLIME_SGLANG_PYTHON"] == "/venv/bin/python"
    assert real.env["EPIC_SLIME_REQUIRE_REAL_SGLANG"] == "1"


def test_a_real_engine_kill_counts_only_if_the_run_passes_without_the_mutant(tmp_path, monkeypatch):
    run = _runner()
    m = _mutant_tree(tmp_path)
    monkeypatch.setattr(run, "run_tests", lambda root, tests, timeout, extra_env=None: (0, 1.0, "1 passed"))
    real = run.RealEngine("/venv/bin/python", timeout=900.0)
    for fails_unmutated, expected in ((False, "killed"), (True, "error")):
        seen = []

        def real_run(root, tests, fails_unmutated=fails_unmutated):
            mutated = (root / m["file"]).read_text() == "DELAY = 0\n"
            seen.append(mutated)
            return (1, 2.0, "1 failed") if mutated or fails_unmutated else (0, 2.0, "3 passed")

        monkeypatch.setattr(real, "run", real_run)
        result = run.check_one(tmp_path, m, timeout=10.0, real=real)
        assert seen == [True, False] and result["result"] == expected, (fails_unmutated, result)


def test_killed_by_its_own_tests_or_without_the_venv_the_real_engine_is_not_run(tmp_path, monkeypatch):
    run = _runner()
    m = _mutant_tree(tmp_path)

    def must_not_run(root, tests):
        raise AssertionError("the real engine ran")

    for own_rc, python, expected in ((1, "/venv/bin/python", "killed"), (0, None, "survived")):
        monkeypatch.setattr(run, "run_tests", lambda root, tests, timeout, extra_env=None, rc=own_rc: (rc, 1.0, "x"))
        real = run.RealEngine(python, timeout=900.0)
        monkeypatch.setattr(real, "run", must_not_run)
        assert run.check_one(tmp_path, m, timeout=10.0, real=real)["result"] == expected


def test_a_real_engine_that_did_not_start_is_an_error_not_a_kill(tmp_path, monkeypatch):
    """The real-engine fixtures fail (never skip) under EPIC_SLIME_REQUIRE_REAL_SGLANG=1 when the server does
    not start, as a slow start on a loaded machine may: that run says nothing about the mutant."""
    run = _runner()
    (tmp_path / "test_no_server.py").write_text(
        "import pytest\n\n\ndef test_needs_the_server():\n"
        "    pytest.fail('EPIC_SLIME_REQUIRE_REAL_SGLANG=1 and could not launch the real SGLang server', pytrace=False)\n"
    )
    real = run.RealEngine("/venv/bin/python", timeout=120.0)
    rc, _, last = real.run(tmp_path, ["test_no_server.py"])
    assert rc == 3 and "could not launch" in last
    m = _mutant_tree(tmp_path)
    (tmp_path / "tests" / "test_own.py").write_text("def test_passes():\n    pass\n")  # the mutant survives it
    monkeypatch.setattr(run, "real_engine_tests", lambda source, own: ["test_no_server.py"])
    result = run.check_one(tmp_path, m, timeout=120.0, real=real)
    assert result["result"] == "error" and "(real engine)" in result["why"], result
    # an ordinary failure in the same run is a kill
    (tmp_path / "test_no_server.py").write_text("def test_sees_the_mutant():\n    assert False\n")
    assert real.run(tmp_path, ["test_no_server.py"])[0] == 1
