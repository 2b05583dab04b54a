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
