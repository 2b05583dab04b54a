"""Shared helpers for the runtime tests: a tiny, fast configuration of the embedded runtime."""

from __future__ import annotations

import json
from pathlib import Path

from epic_slime.runtime.config import parse_config

REPO = Path(__file__).resolve().parents[1]

# Small enough for CI (2 cores): 4 prompts x 4 samples per step, 8 held-out prompts x 2 samples.
TINY_FLAGS = [
    "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--update-depth", "2",
    "--num-rollout-workers", "2", "--num-rollout", "4", "--eval-interval", "2",
    "--n-samples-per-eval-prompt", "2", "--task-eval-num-prompts", "8",
    "--warm-start-steps", "20", "--warm-start-batch-size", "16", "--rollout-max-response-len", "16",
    "--lr", "3e-4", "--no-progress", "--on-bad-tokens", "raise",
]


def tiny_config(tmp_path: Path, *extra: str, name: str = "run"):
    return parse_config([*TINY_FLAGS, "--output-dir", str(tmp_path / name),
                         "--warm-start-cache-dir", str(tmp_path / "warm_cache"), *extra])


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]
