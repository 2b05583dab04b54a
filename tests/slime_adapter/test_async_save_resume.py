"""Issue 28, section 5: saves that do not stall the pipeline (``--async-save``), and a resume that
never trusts a torn model write.

The driver's real loops run on fakes at slime's interfaces: a RolloutManager serving one call at a
time (FIFO, as the Ray actor does) whose data source is the project's real ``StreamingDataSource``
(save / load / ledger) over a numbered-prompt stand-in for slime's inner source, and a train group
whose ``save_model`` behaves as slime's under ``--async-save``: it first waits for the previous
asynchronous write and finalizes it (Megatron writes ``latest_checkpointed_iteration.txt`` then),
stages the new one and returns while a background thread writes it (``force_sync`` waits). The
kill comes during the asynchronous write of rollout 3's checkpoint (its data state complete, its
model half written); the resumed process loads what Megatron would (the tracker) and the data
source loads that rollout's data state.

Failed before the fix: no completion marker existed, so ``--ckpt-step 3`` (what a user tries for the
newest checkpoint) resumed on the torn model with a complete-looking data state, and the markers'
order tests had nothing to check.
"""

from __future__ import annotations

import os
import threading
import types
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from epic_slime.slime import rollout as project_rollout
from epic_slime.slime import train
from epic_slime.slime.stream.checkpoint_marks import MODEL_DONE_FILE, ModelSaves, model_checkpoint_complete
from epic_slime.slime.stream.ledger import GroupLedger

BATCH, NUM_ROLLOUT, SAVE_INTERVAL, KILL_AT = 3, 6, 2, 3  # saves after rollouts 1, 3, 5


class Killed(BaseException):
    """SIGKILL of the driver process, as seen from inside it."""


class InnerSource:
    """slime's RolloutDataSourceWithBuffer as StreamingDataSource uses it: numbered prompts and
    their offset saved at slime's path."""

    def __init__(self, args):
        self.args, self.offset = args, 0

    def get_samples(self, n):
        out = [[types.SimpleNamespace(group_index=i, prompt=f"p{i}")] for i in range(self.offset, self.offset + n)]
        self.offset += n
        return out

    def save(self, rollout_id):
        import torch

        torch.save(
            {"offset": self.offset}, os.path.join(self.args.save, f"rollout/global_dataset_state_dict_{rollout_id}.pt")
        )

    def load(self, rollout_id=None):
        import torch

        if self.args.load is None or rollout_id is None or rollout_id < 0:
            return
        self.offset = torch.load(os.path.join(self.args.load, f"rollout/global_dataset_state_dict_{rollout_id}.pt"))[
            "offset"
        ]


def data_source(args) -> project_rollout.StreamingDataSource:
    source = object.__new__(project_rollout.StreamingDataSource)  # __init__ builds slime's real inner source
    source.args, source.inner, source.ledger = args, InnerSource(args), GroupLedger()
    source._lock, source._restored, source._returned = threading.Lock(), deque(), deque()
    return source


class RolloutManager:
    """One call at a time, in order; ``generate`` delivers a batch exactly as the project's rollout
    function accounts for it (consumed -> delivered to r; rollouts <= r - 2 trained, overlap loop)."""

    def __init__(self, args, source):
        self.args, self.source = args, source
        self._actor = ThreadPoolExecutor(max_workers=1)
        for name in ("generate", "eval", "save", "get_updatable_engines_and_lock"):
            setattr(self, name, types.SimpleNamespace(remote=self._method(getattr(self, "_" + name))))

    def _method(self, fn):
        return lambda *a, **k: self._actor.submit(fn, *a, **k)

    def _generate(self, rollout_id):
        groups = self.source.get_samples(BATCH)
        keys = [project_rollout.group_key(g) for g in groups]
        for key in keys:
            self.source.ledger.deliver(key, rollout_id)
        self.source.ledger.close_rollout(rollout_id - 2)
        return ("data", rollout_id, keys)

    def _eval(self, rollout_id):
        return None

    def _save(self, rollout_id):
        self.source.save(rollout_id)

    def _get_updatable_engines_and_lock(self):
        return []

    def close(self):
        self._actor.shutdown(wait=True)


class AsyncSavingTrainGroup:
    """slime's train group under --async-save, writing iter_<r>/ in two halves on a thread."""

    def __init__(self, args, kill_during_write_of: int | None = None):
        self.args, self.kill_at = args, kill_during_write_of
        self.trained: dict[int, list] = {}
        self.writer: threading.Thread | None = None
        self.writing: int | None = None
        self.hold = threading.Event()  # a slow disk: the second half waits for it
        self.killed = threading.Event()
        self.start_rollout_id = 0
        tracker = os.path.join(args.save, "latest_checkpointed_iteration.txt")
        if args.load and os.path.exists(tracker):  # Megatron's --load: the newest finalized save
            with open(tracker) as handle:
                self.start_rollout_id = int(handle.read()) + 1
        if getattr(args, "ckpt_step", None) is not None:
            self.start_rollout_id = args.ckpt_step + 1

    def async_train(self, rollout_id, data):
        assert data[:2] == ("data", rollout_id)
        self.trained[rollout_id] = data[2]
        return None

    def _write(self, rollout_id):
        folder = os.path.join(self.args.save, f"iter_{rollout_id:07d}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "shard_0"), "w") as handle:
            handle.write("first half")
        self.hold.wait()
        if self.killed.is_set():
            return  # the process is gone: the second half is never written
        with open(os.path.join(folder, "shard_1"), "w") as handle:
            handle.write("second half")

    def _finalize(self):
        if self.writer is None:
            return
        self.writer.join()
        with open(os.path.join(self.args.save, "latest_checkpointed_iteration.txt"), "w") as handle:
            handle.write(str(self.writing))  # Megatron's iter_finalize_fn
        self.writer = self.writing = None

    def save_model(self, rollout_id, force_sync=False):
        self._finalize()  # slime: maybe_finalize_async_save(blocking=True) before the next save
        self.hold = threading.Event()
        if self.kill_at != rollout_id:
            self.hold.set()
        self.writing = rollout_id
        self.writer = threading.Thread(target=self._write, args=(rollout_id,), daemon=True)
        self.writer.start()
        if force_sync or not self.args.async_save:  # without --async-save, save_model returns once written
            self._finalize()

    def update_weights(self):
        if self.writing is not None and self.writing == self.kill_at:
            raise Killed(f"SIGKILL during the asynchronous write of rollout {self.kill_at}")

    def clear_memory(self):
        pass

    def die(self):
        self.killed.set()
        self.hold.set()
        if self.writer is not None:
            self.writer.join()


def _get(ref):
    return ref.result() if isinstance(ref, Future) else ref


def _args(save, **overrides):
    values = dict(
        start_rollout_id=None,
        num_rollout=NUM_ROLLOUT,
        eval_interval=None,
        save_interval=SAVE_INTERVAL,
        rollout_global_dataset=True,
        skip_eval_before_train=True,
        max_staleness=2,
        async_save=True,
        offload_rollout=False,
        offload_train=False,
        release_train=False,
        check_weight_update_equal=False,
        colocate=False,
        save=str(save),
        load=None,
        ckpt_step=None,
    )
    values.update(overrides)
    return types.SimpleNamespace(**values)


def _session(args, kill_during_write_of=None):
    """One driver process: slime's start-up order (the model loads, then the data source), then the loop."""
    actor = AsyncSavingTrainGroup(args, kill_during_write_of)
    args.start_rollout_id = actor.start_rollout_id
    source = data_source(args)
    manager = RolloutManager(args, source)
    try:
        manager.load = types.SimpleNamespace(remote=manager._method(source.load))
        manager.load.remote(args.start_rollout_id - 1).result()
        train.push_initial_weights(args, manager, actor, _get)
        train.async_training_loop(args, manager, actor, None, _get)
    except Killed:
        actor.die()
    finally:
        manager.close()
    return actor, source


def test_a_kill_during_the_asynchronous_write_resumes_from_the_last_complete_save(tmp_path):
    save = tmp_path / "ckpt"
    first, _ = _session(_args(save), kill_during_write_of=KILL_AT)
    assert sorted(first.trained) == [0, 1, 2, 3]
    # the kill left rollout 3's data state whole and its model half written, unmarked
    assert (save / "rollout" / "global_dataset_state_dict_3.pt").exists()
    assert (save / "iter_0000003" / "shard_0").exists() and not (save / "iter_0000003" / "shard_1").exists()
    assert not (save / MODEL_DONE_FILE.format(rollout_id=3)).exists()
    assert (save / MODEL_DONE_FILE.format(rollout_id=1)).exists()  # marked once save_model(3) had waited for it
    assert not model_checkpoint_complete(str(save), 3) and model_checkpoint_complete(str(save), 1)

    resumed, source = _session(_args(save, load=str(save)))
    assert sorted(resumed.trained) == [2, 3, 4, 5]  # from the previous consistent save (rollout 1)
    lineage = [k for r in (0, 1) for k in first.trained[r]] + [
        k for r in range(2, NUM_ROLLOUT) for k in resumed.trained[r]
    ]
    assert sorted(lineage) == list(range(BATCH * NUM_ROLLOUT))  # every prompt trained once
    # the run ended with a forced save: everything written is marked, the tracker on the last save
    assert all((save / MODEL_DONE_FILE.format(rollout_id=r)).exists() for r in (1, 3, 5))
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "5"


def test_a_resume_from_the_torn_checkpoint_is_refused_naming_the_last_consistent_save(tmp_path):
    save = tmp_path / "ckpt"
    _session(_args(save), kill_during_write_of=KILL_AT)
    args = _args(save, load=str(save), ckpt_step=3)  # --ckpt-step 3: Megatron would take the torn iter_3
    with pytest.raises(
        RuntimeError,
        match=r"rollout-3 checkpoint: its model checkpoint is not marked complete.*"
        r"last consistent save is rollout 1: resume from it with --ckpt-step 1",
    ):
        _session(args)
    resumed, _ = _session(_args(save, load=str(save), ckpt_step=1))
    assert sorted(resumed.trained) == [2, 3, 4, 5]


def _marks(async_save: bool, tmp_path) -> list:
    marks = ModelSaves(types.SimpleNamespace(save=str(tmp_path), async_save=async_save))
    return [marks.saved(1, False), marks.saved(3, False), marks.saved(5, True)]


def test_a_synchronous_save_is_marked_at_once_an_asynchronous_one_when_the_next_save_waited_for_it(tmp_path):
    assert _marks(False, tmp_path / "sync") == [[1], [3], [5]]
    assert _marks(True, tmp_path / "async") == [[], [1], [3, 5]]
    assert ModelSaves(types.SimpleNamespace(save=None, async_save=True)).saved(1, True) == []


def test_megatrons_tracker_also_marks_a_finished_write(tmp_path):
    """The driver may die between Megatron's finalize and its own marker: the tracker still counts,
    for its own iteration (older ones carry the driver's markers)."""
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7")
    assert model_checkpoint_complete(str(tmp_path), 7)
    assert not model_checkpoint_complete(str(tmp_path), 5) and not model_checkpoint_complete(str(tmp_path), 9)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release")
    assert not model_checkpoint_complete(str(tmp_path), 0)


def test_without_async_save_the_loop_still_saves_data_then_model_and_marks_each(tmp_path):
    save = tmp_path / "ckpt"
    actor, _ = _session(_args(save, async_save=False))
    assert sorted(actor.trained) == list(range(NUM_ROLLOUT))
    assert all((save / MODEL_DONE_FILE.format(rollout_id=r)).exists() for r in (1, 3, 5))


def test_a_second_lineage_saving_a_rollout_again_drops_its_old_marker(tmp_path):
    """Resumed from rollout 1 after a first lineage had saved 3 and 5: saving 3 again starts by
    removing 3's marker, so a kill during that write cannot pass the first lineage's mark off as
    this write's."""
    save = tmp_path / "ckpt"
    _session(_args(save, async_save=False))  # lineage 1: 1, 3, 5 marked
    (save / "latest_checkpointed_iteration.txt").write_text("5")
    _session(_args(save, load=str(save), ckpt_step=1), kill_during_write_of=KILL_AT)
    assert not (save / MODEL_DONE_FILE.format(rollout_id=3)).exists()
    with pytest.raises(RuntimeError, match="rollout-3 checkpoint: its model checkpoint is not marked complete"):
        _session(_args(save, load=str(save), ckpt_step=3))
