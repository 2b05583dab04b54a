"""A stand-in for a finished `epic-slime train` run in a folder (what the README's command 1 leaves in
runs/local-default): every file `epic_slime.runtime.run_files.existing_run` looks for, and a saved
checkpoint. `.ci/run` puts one in the checkout's default run folder before the suite, so that a test
which reads or writes that folder fails in CI as it would after command 1.

    python tests/support/occupied_run.py runs/local-default   # prints "created" or "kept"
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STAND_IN_NOTE = "a stand-in for a finished run, written by tests/support/occupied_run.py"


def occupy(folder: Path) -> bool:
    """Write the stand-in run into `folder` unless it exists already (a real run stays untouched).
    True when it wrote one (its caller then removes it), False when the folder was there."""
    folder = Path(folder)
    if folder.exists():
        return False
    step = folder / "checkpoints" / "step_000200"
    step.mkdir(parents=True)
    (step / "NOTE").write_text(STAND_IN_NOTE + "\n")
    for name in ("metrics.jsonl", "batches.jsonl", "eval_metrics.jsonl", "eval_records.jsonl"):
        (folder / name).write_text(json.dumps({"step": 200, "note": STAND_IN_NOTE}) + "\n")
    for name in ("summary.json", "config.json"):
        (folder / name).write_text(json.dumps({"note": STAND_IN_NOTE}) + "\n")
    return True


if __name__ == "__main__":
    print("created" if occupy(Path(sys.argv[1])) else "kept")
