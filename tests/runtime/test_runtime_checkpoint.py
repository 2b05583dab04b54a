"""The runtime's checkpoint files (epic_slime.runtime.checkpoint). A crash in the middle of the driver
state's write (issue 28 item 7's mutation pass: no test wrote a checkpoint that failed half-way): the
step must not look resumable, and the latest checkpoint stays the one before."""

from __future__ import annotations

import pickle

import pytest

from epic_slime.runtime import checkpoint
from epic_slime.runtime.checkpoint import DRIVER_STATE_FILE, DRIVER_STATE_KEYS, resolve_checkpoint, step_dir


def _save(root, step):
    step_dir(root, step).mkdir(parents=True)  # the trainer's state is written there first
    return checkpoint.save_driver_state(root, step, {k: step for k in DRIVER_STATE_KEYS})


# mutant: driver_state_written_in_place
def test_a_driver_state_write_that_fails_half_way_leaves_the_previous_checkpoint_latest(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    _save(root, 2)

    def half_then_crash(obj, f):
        f.write(pickle.dumps(obj)[:10])  # the disk fills up (or the process dies) mid-pickle
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.pickle, "dump", half_then_crash)
    with pytest.raises(OSError, match="No space"):
        _save(root, 4)
    assert not (step_dir(root, 4) / DRIVER_STATE_FILE).exists()  # no truncated state to load
    assert resolve_checkpoint(str(root)) == step_dir(root, 2)
    with pytest.raises(FileNotFoundError, match="no checkpoint there"):
        resolve_checkpoint(str(step_dir(root, 4)))
    with open(step_dir(root, 2) / DRIVER_STATE_FILE, "rb") as f:
        assert pickle.load(f)["step"] == 2
