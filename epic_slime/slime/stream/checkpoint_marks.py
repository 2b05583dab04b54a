"""Which Megatron checkpoints are on disk whole: the completion marker that a resume trusts.

A checkpoint of rollout r is two saves, the data state first (``StreamingDataSource.save``, its
own completeness marked by slime's state file, written last) and then the Megatron model. With
``--async-save`` the model write runs in the background after ``save_model`` returned, so "saved"
and "on disk" part: a kill during the write leaves ``iter_<r>`` torn next to a complete data
state. Two markers say the model write of r finished:

- Megatron's own tracker (``latest_checkpointed_iteration.txt``), which rank 0 writes in the
  save's finalize step, i.e. once every rank's write is done (at once without ``--async-save``);
  a plain ``--load`` resumes from it, so it never picks a torn checkpoint;
- the driver's ``rollout/epic_model_complete_<r>``, written by ``ModelSaves`` as soon as the
  driver knows the write is done: after ``save_model`` returned for a synchronous or forced save,
  and, under ``--async-save``, after the *next* ``save_model`` returned (slime's ``save_model``
  first waits for the previous asynchronous write: Megatron's
  ``maybe_finalize_async_save(blocking=True)``) or the final, forced one.

``model_checkpoint_complete`` accepts either (the tracker for its own iteration only: a run resumed
from an older checkpoint keeps the tracker of its first lineage until its first save is finalized);
``StreamingDataSource.load`` refuses a resume from a checkpoint neither marks (``--ckpt-step`` of a
torn write), naming the last consistent save. A new save of rollout r first removes r's marker (a
resumed run saves its rollouts again, over its first lineage's checkpoints).
"""

from __future__ import annotations

import os

MODEL_DONE_FILE = "rollout/epic_model_complete_{rollout_id}"
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"


def mark_model_complete(save_dir: str, rollout_id: int) -> str:
    """Write the driver's marker for rollout ``rollout_id`` (atomic: a temporary name, then a rename)."""
    path = os.path.join(save_dir, MODEL_DONE_FILE.format(rollout_id=rollout_id))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        handle.write(f"{rollout_id}\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(path + ".tmp", path)
    return path


def megatron_tracker_iteration(load_dir: str) -> int | None:
    """The iteration in Megatron's tracker, or None (absent, or "release")."""
    try:
        with open(os.path.join(load_dir, MEGATRON_TRACKER)) as handle:
            text = handle.read().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def model_checkpoint_complete(load_dir: str, rollout_id: int) -> bool:
    """True when the model checkpoint of ``rollout_id`` finished writing (see the module docstring)."""
    if os.path.exists(os.path.join(load_dir, MODEL_DONE_FILE.format(rollout_id=rollout_id))):
        return True
    return megatron_tracker_iteration(load_dir) == rollout_id


class ModelSaves:
    """The driver's side: marks each model checkpoint once its write is known to be done."""

    def __init__(self, args):
        self.save_dir = getattr(args, "save", None)
        self.async_save = bool(getattr(args, "async_save", False))
        self.unfinished: int | None = None  # the asynchronous write still running, if any

    def starting(self, rollout_id: int) -> None:
        """A save of ``rollout_id`` begins (data state first): an older marker of it no longer holds."""
        if self.save_dir:
            path = os.path.join(self.save_dir, MODEL_DONE_FILE.format(rollout_id=rollout_id))
            if os.path.exists(path):
                os.unlink(path)

    def saved(self, rollout_id: int, force_sync: bool) -> list[int]:
        """``save_model(rollout_id, force_sync)`` returned; returns the rollouts marked now."""
        if not self.save_dir:
            return []
        done = []
        if self.unfinished is not None:  # save_model waited for it before starting this one
            done.append(self.unfinished)
            self.unfinished = None
        if self.async_save and not force_sync:
            self.unfinished = rollout_id
        else:
            done.append(rollout_id)
        for finished in done:
            mark_model_complete(self.save_dir, finished)
        return done
