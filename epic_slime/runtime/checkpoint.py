"""Checkpoints of the embedded runtime: where a step's state goes, its named keys, and the one rule
that decides whether a checkpoint may resume the run being started.

A checkpoint is a step directory `<checkpoint_dir>/step_NNNNNN/` with the trainer's state
(`trainer.pt`: weights, optimizer, reference, RNGs, version) and the driver's (`driver.pkl`: the
keys of DRIVER_STATE_KEYS); `<checkpoint_dir>/latest` names the newest step directory.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from .config import ConfigError, RuntimeConfig

DRIVER_STATE_FILE = "driver.pkl"
TRAINER_STATE_FILE = "trainer.pt"
LATEST_FILE = "latest"

# What the driver saves: data position, buffered groups and accounting, so that a resumed run
# trains on exactly the batch the uninterrupted run would have trained on next.
DRIVER_STATE_KEYS = (
    "step",
    "version",
    "next_group_id",
    "buffer",
    "accounting",
    "trained_group_ids",
    "dropped_group_ids",
    "killed_once",
    "config",
)

# Keys a resumed run may change: where things go, how long, how often to evaluate / save / log.
# Everything else (model, task, seed, loss, optimizer, rollout, staleness) must match the checkpoint.
RESUME_FREE_KEYS = frozenset(
    {
        "output_dir",
        "num_rollout",
        "save",
        "load",
        "save_interval",
        "overwrite",
        "eval_interval",
        "n_samples_per_eval_prompt",
        "eval_temperature",
        "eval_top_p",
        "task_eval_num_prompts",
        "warm_start_cache_dir",
        "use_wandb",
        "wandb_mode",
        "wandb_project",
        "progress",
        "log_interval",
        "plots",
        "debug_kill_rollout_worker_at_step",
        "on_bad_tokens",
        "max_bad_token_frac",
    }
)


def step_dir(checkpoint_dir: Path, step: int) -> Path:
    return checkpoint_dir / f"step_{step:06d}"


def has_checkpoint(checkpoint_dir: Path) -> bool:
    """True when some step directory of `checkpoint_dir` holds a complete driver state."""
    return checkpoint_dir.is_dir() and any((d / DRIVER_STATE_FILE).exists() for d in checkpoint_dir.iterdir())


def save_driver_state(checkpoint_dir: Path, step: int, state: dict) -> Path:
    """Write the driver's state of `step` (the trainer's is written beside it first) and mark the
    step as the latest. Atomic: a crash mid-write leaves the previous checkpoint the latest."""
    if tuple(state) != DRIVER_STATE_KEYS:
        raise ValueError(f"driver state keys {tuple(state)} are not the checkpoint's {DRIVER_STATE_KEYS}")
    d = step_dir(checkpoint_dir, step)
    tmp = d / (DRIVER_STATE_FILE + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(state, f)
    os.replace(tmp, d / DRIVER_STATE_FILE)
    (checkpoint_dir / LATEST_FILE).write_text(d.name)
    return d


def resolve_checkpoint(path: str) -> Path:
    """`--load PATH`: a step directory, or a checkpoints directory (then its latest step)."""
    p = Path(path)
    if (p / DRIVER_STATE_FILE).exists():
        return p
    latest = p / LATEST_FILE
    if latest.exists():
        q = p / latest.read_text().strip()
        if (q / DRIVER_STATE_FILE).exists():
            return q
    raise FileNotFoundError(
        f"--load {path}: no checkpoint there (expected {DRIVER_STATE_FILE} or a '{LATEST_FILE}' file)"
    )


def load_driver_state(path: Path) -> dict:
    with open(path / DRIVER_STATE_FILE, "rb") as f:
        return pickle.load(f)


def resume_differences(saved: dict, current: dict) -> list[str]:
    """'key: checkpoint X, now Y' for every training-relevant key that differs (keys absent on
    either side, e.g. from an older version, cannot be compared and are skipped)."""
    out = []
    for key in sorted(set(saved) & set(current) - RESUME_FREE_KEYS):
        if saved[key] != current[key]:
            out.append(f"{key}: checkpoint {saved[key]!r}, now {current[key]!r}")
    return out


def check_resumable(state: dict, cfg: RuntimeConfig, current: dict | None = None) -> None:
    """A checkpoint resumes only the run that wrote it (same training-relevant config) and only
    when there is something left to train. ``current``: the values to compare (default cfg.to_dict(),
    which resolves the loss parameters: torch; the quick check before torch passes the rest)."""
    diffs = resume_differences(state.get("config", {}), cfg.to_dict() if current is None else current)
    if diffs:
        raise ConfigError(
            f"--load {cfg.load}: the checkpoint was trained with a different config; resuming "
            "would mix two runs. Differences:\n  " + "\n  ".join(diffs)
        )
    if state["step"] >= cfg.num_rollout:
        raise ConfigError(
            f"--load {cfg.load}: the checkpoint is at step {state['step']}, "
            f"--num-rollout is {cfg.num_rollout}: nothing to train (raise --num-rollout)"
        )


def check_trainer_version(path: Path, trainer_version: int, state: dict) -> None:
    """The trainer state loaded from `path` belongs to the same step as the driver state."""
    if trainer_version != state["version"]:
        raise RuntimeError(f"checkpoint {path}: trainer version {trainer_version} != driver version {state['version']}")
