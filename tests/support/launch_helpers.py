"""Helpers for the launcher tests: run a launch script as a dry run and read the command it prints."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def dry_run(*args: str, script: str = "launch/qwen3_30b_epic.sh", **env: str) -> subprocess.CompletedProcess:
    """``bash SCRIPT ARGS`` from the repository root under DRY_RUN=1 (no W&B key, this Python)."""
    full_env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    full_env.update({"DRY_RUN": "1", "PYTHON": sys.executable, **env})  # env may set DRY_RUN itself
    return subprocess.run(["bash", script, *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=120)


def submit_command(result: subprocess.CompletedProcess) -> list[str]:
    """The one ``ray job submit`` line a dry run printed, split as the shell would."""
    lines = [line for line in result.stdout.splitlines() if line.startswith("ray job submit")]
    assert len(lines) == 1, result.stdout
    return shlex.split(lines[0])


def flag_value(argv: list[str], name: str) -> str:
    """The value after flag ``name`` in ``argv``."""
    return argv[argv.index(name) + 1]
