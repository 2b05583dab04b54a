"""The mutation runner itself (tests/mutation/run.py): how it applies one mutant, and its per-mutant limit."""

from __future__ import annotations


def _mutation_runner():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "mutation" / "run.py"
    spec = importlib.util.spec_from_file_location("epic_mutation_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mutation_runner_applies_one_occurrence_and_calls_a_stale_entry_not_applicable():
    run = _mutation_runner()
    text = "a = x <= k\nb = x <= k\nc = y\n"
    assert run.mutate(text, {"original": "y", "replacement": "z"}) == ("a = x <= k\nb = x <= k\nc = z\n", "")
    assert (
        run.mutate(text, {"original": "x <= k", "replacement": "x < k", "occurrence": 2})[0]
        == "a = x <= k\nb = x < k\nc = y\n"
    )
    for entry, why in [
        ({"original": "w = 1"}, "not found"),
        ({"original": "x <= k"}, "found 2 times"),
        ({"original": "x <= k", "occurrence": 3}, "occurrence 3"),
        ({"original": "b = x\nc"}, "one-line"),
    ]:
        mutated, reason = run.mutate(text, {**entry, "replacement": "-"})
        assert mutated is None and why in reason
    with open(run.HERE / "mutants.yaml") as f:  # the list parses and every entry is complete
        assert len(run.load_mutants(run.HERE / "mutants.yaml")) == len(__import__("yaml").safe_load(f))


def test_mutation_runner_keeps_its_per_mutant_limit_when_a_test_leaves_children(tmp_path):
    """A mutant whose test hangs after starting a child (as a Ray node or a stand-in server is): the
    run is cut at its limit and the child is ended with it. subprocess.run's timeout killed pytest
    only, and the child ran on, taking the cores of the mutants after it."""
    import os
    import time

    run = _mutation_runner()
    pid_file = tmp_path / "child.pid"
    (tmp_path / "test_hangs.py").write_text(
        "import subprocess, time\n\n\ndef test_hangs():\n"
        f"    child = subprocess.Popen(['sleep', '60'])\n    open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "    time.sleep(3600)\n"
    )
    start = time.monotonic()
    rc, seconds, last = run.run_tests(tmp_path, ["test_hangs.py", "-s", "-p", "no:timeout"], timeout=3)
    assert rc == -1 and "timed out after 3s" in last and time.monotonic() - start < 30, (rc, last)
    child = int(pid_file.read_text())
    for _ in range(50):  # SIGKILLed with its group; reaped by init
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the test's child {child} outlived the mutant's run")
