"""Shared helpers for the reward / data / evaluation tests (no conftest: the lead owns it)."""

from __future__ import annotations

import json
import os

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_MATH = os.path.join(REPO_ROOT, "..", "shared", "data", "math")
BENCHMARK_FILES = ("aime_2024", "aime_2025", "amc_2023", "hmmt_feb_2025")


def require_shared_math() -> str:
    """Path of ../shared/data/math, or skip the test (the shared data is not in the repo)."""
    if not os.path.isfile(os.path.join(SHARED_MATH, "aime_2024.jsonl")):
        pytest.skip(f"shared math data not found at {os.path.abspath(SHARED_MATH)}")
    return SHARED_MATH


def load_shared_rows(name: str) -> list[dict]:
    with open(os.path.join(require_shared_math(), f"{name}.jsonl")) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def run_config_yaml(path: str, records_path: str, run_name: str, method: str | None = None) -> str:
    """The run identity file the launchers hand to ``--custom-config-path`` (launch/_submit.sh's
    ``run_config_yaml``): top-level keys slime sets on ``args``, read by the eval-record hook."""
    lines = [f"epic_run_name: {json.dumps(run_name)}", f"epic_eval_records_path: {json.dumps(records_path)}"]
    if method is not None:
        lines.append(f"epic_method: {json.dumps(method)}")
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


def report_on_records(records_path: str, out_dir: str) -> dict:
    """``epic-slime report`` on one records file, as the CLI runs it (``report.main``), over the
    benchmarks the file holds; fails the test with the report's own error when it refuses.

    Returns ``{"selection": selection.json, "records_per_step": {run: {step: count}}}`` so a caller
    can check that every evaluated step holds exactly one record set.
    """
    import contextlib
    import io
    from collections import Counter

    from epic_slime.evaluation.records import read_records
    from epic_slime.evaluation.report import main as report_main

    records = read_records(records_path)
    assert records, f"no eval records in {records_path}"
    benchmarks = sorted({r.benchmark for r in records})
    argv = ["--records", records_path, "--out", out_dir, "--benchmarks", *benchmarks,
            "--bootstrap", "0", "--no-plots"]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        rc = report_main(argv)
    assert rc == 0, f"epic-slime report {' '.join(argv)} refused the records: {stderr.getvalue().strip()}"
    with open(os.path.join(out_dir, "selection.json")) as handle:
        selection = json.load(handle)
    per_step: dict[str, Counter] = {}
    for record in records:
        per_step.setdefault(record.run, Counter())[record.step] += 1
    return {"selection": selection, "records_per_step": {run: dict(sorted(c.items())) for run, c in per_step.items()}}
