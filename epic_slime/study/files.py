"""The study directory's files: where each run's records live, and the study's own records.

    <out>/runs/<setting>/<method>_s<seed>/   an ordinary `epic-slime train` run directory
        result.json                          the run's test scores (written last: the "finished" marker)
    <out>/warm_start.json                    chance level, the warm start's scores and entropy profile
    <out>/provenance.jsonl                   one line per invocation that ran runs (command, commit, versions)

The run phase writes these files and the report phase only reads them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

RESULT = "result.json"
WARM_START = "warm_start.json"
PROVENANCE = "provenance.jsonl"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]


def run_dir(out: Path, setting: str, method: str, seed: int) -> Path:
    return Path(out) / "runs" / setting / f"{method}_s{seed}"


def write_json_atomically(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def finished_results(out: Path, specs) -> list[dict]:
    """result.json of every planned run that has one, in plan order."""
    paths = [run_dir(out, s.setting, s.method, s.seed) / RESULT for s in specs]
    return [json.loads(p.read_text()) for p in paths if p.exists()]


def run_metrics(out: Path, result: dict) -> list[dict]:
    """metrics.jsonl (one line per training step) of a finished run."""
    return read_jsonl(run_dir(out, result["setting"], result["method"], result["seed"]) / "metrics.jsonl")


def read_warm_start(out: Path) -> dict | None:
    path = Path(out) / WARM_START
    return json.loads(path.read_text()) if path.exists() else None


def record_provenance(out: Path, command: str, commit: str, runs_executed: int) -> None:
    """One line per study invocation that ran runs: which code, packages and command produced them."""
    from epic_slime.provenance import stack_versions

    with open(Path(out) / PROVENANCE, "a") as f:
        f.write(
            json.dumps(
                {
                    "command": command,
                    "commit": commit,
                    "versions": stack_versions(),
                    "runs_executed": runs_executed,
                    "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                }
            )
            + "\n"
        )


def read_provenance(out: Path) -> list[dict]:
    path = Path(out) / PROVENANCE
    return read_jsonl(path) if path.exists() else []
