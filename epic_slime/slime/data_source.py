"""``--data-source-path epic_slime.slime.data_source.StreamingDataSource`` (the driver sets it): slime's
data source plus a ledger of every consumed prompt, and the saves that let a resumed run train every
prompt once.

``StreamingDataSource`` records every consumed group until it is trained or dropped (``GroupLedger``);
``save(r)`` (rollouts <= r are trained) writes the fresh prompts of all others next to slime's
data-source state, and ``load`` hands them out first. The driver saves this data state before the
model checkpoint, and ``load`` refuses a checkpoint whose data state is missing, naming the last
rollout that has one.

slime is imported lazily: this module runs inside slime's RolloutManager actor.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from collections import deque

from epic_slime.slime.stream.checkpoint_marks import MEGATRON_TRACKER, MODEL_DONE_FILE, model_checkpoint_complete
from epic_slime.slime.stream.ledger import GroupLedger

logger = logging.getLogger(__name__)

PENDING_FILE = "rollout/epic_pending_groups_{rollout_id}.pt"
DATA_STATE_FILE = "rollout/global_dataset_state_dict_{rollout_id}.pt"  # slime's RolloutDataSource.save


def group_key(group) -> int:
    """A group's identity: slime's data source numbers prompts (``Sample.group_index``)."""
    index = getattr(group[0], "group_index", None)
    if index is None:
        raise ValueError("a rollout group has no Sample.group_index: the data source must number its prompts")
    return int(index)


class StreamingDataSource:
    """slime's ``RolloutDataSourceWithBuffer`` plus a ledger of every group handed out.

    Same interface (``get_samples``, ``add_samples``, ``save``, ``load``, ``len``); the ledger says
    for each consumed group whether it is in flight, delivered to a rollout, trained or dropped.
    """

    def __init__(self, args):
        from slime.rollout.data_source import RolloutDataSourceWithBuffer

        self.args = args
        self.inner = RolloutDataSourceWithBuffer(args)
        self.ledger = GroupLedger()
        self._lock = threading.Lock()
        self._restored: deque = deque()  # fresh groups of a saved run, handed out first
        self._returned: deque = deque()  # groups given back through add_samples (already consumed)

    def __len__(self) -> int:
        return len(self.inner)

    def get_samples(self, num_samples: int):
        with self._lock:
            out = []
            while self._returned and len(out) < num_samples:
                out.append(self._returned.popleft())
            while self._restored and len(out) < num_samples:
                group = self._restored.popleft()
                self.ledger.restore(group_key(group), copy.deepcopy(group))
                out.append(group)
            if len(out) < num_samples:
                for group in self.inner.get_samples(num_samples - len(out)):
                    self.ledger.consume(group_key(group), copy.deepcopy(group))
                    out.append(group)
            return out

    def handed_back(self) -> int:
        """Groups given back through ``add_samples``, waiting to be handed out again (consumed, not
        delivered: the stream and the rollout count them as the worker's)."""
        return len(self._returned)

    def add_samples(self, samples) -> None:
        """Groups given back (slime's abort with ``--partial-rollout``, its fully-async worker) are
        handed out again first, oldest first, without counting them as consumed twice. slime's
        ``--buffer-filter-path`` (which groups its own buffer serves) is refused by the driver: this
        queue never consults it."""
        with self._lock:
            for group in samples:
                key = group_key(group)
                if key not in self.ledger.payloads:
                    raise ValueError(f"add_samples: group {key} was never handed out by this data source")
                if any(group_key(waiting) == key for waiting in self._returned):
                    raise ValueError(
                        f"add_samples: group {key} is already waiting to be handed out again (given back twice)"
                    )
                self._returned.append(group)

    def fresh_group(self, key: int):
        """A copy of the group as it was consumed (prompt only), to regenerate it."""
        with self._lock:
            return copy.deepcopy(self.ledger.payloads[key])

    def save(self, rollout_id: int) -> None:
        """Every consumed group not trained by rollout ``rollout_id`` (the driver saves after training
        it: in flight, queued, or delivered to a later rollout), then slime's data-source state.

        slime's state file is written last: its presence marks a complete data save, which ``load``
        checks (the pending file is written to a temporary name and renamed, so a crash leaves the
        previous one whole)."""
        import torch

        with self._lock:
            self.ledger.close_rollout(rollout_id)
            pending = self.ledger.pending_payloads() + [copy.deepcopy(g) for g in self._restored]
        path = os.path.join(self.args.save, PENDING_FILE.format(rollout_id=rollout_id))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # model_marker: this checkpoint's model is trusted only once marked complete (checkpoint_marks)
        torch.save({"groups": pending, "model_marker": True}, path + ".tmp")
        os.replace(path + ".tmp", path)
        self.inner.save(rollout_id)
        logger.info("saved %d consumed-but-untrained groups with the rollout-%d data state", len(pending), rollout_id)

    def load(self, rollout_id=None) -> None:
        """Resume (``rollout_id`` = the checkpoint's last trained rollout, >= 0): the data state and
        pending groups saved with it must exist, and its model checkpoint must be marked complete
        (``checkpoint_marks.model_checkpoint_complete``: a resume with ``--ckpt-step`` of a
        checkpoint whose asynchronous write was cut short is refused; data states saved before the
        marker existed carry no ``model_marker`` and are trusted as before); a fresh start (None or
        -1) loads nothing."""
        import torch

        if self.args.load is None or rollout_id is None or rollout_id < 0:
            self.inner.load(rollout_id)
            return
        state = os.path.join(self.args.load, DATA_STATE_FILE.format(rollout_id=rollout_id))
        path = os.path.join(self.args.load, PENDING_FILE.format(rollout_id=rollout_id))
        if getattr(self.args, "rollout_global_dataset", True) and not (os.path.exists(state) and os.path.exists(path)):
            raise RuntimeError(
                f"resume from the rollout-{rollout_id} checkpoint: its data state ({state} and {path}) is "
                f"missing, so the run would restart the data at prompt 0 and train prompts twice. "
                f"{last_consistent_save(self.args.load, rollout_id)}"
            )
        saved = torch.load(path, weights_only=False) if os.path.exists(path) else {"groups": []}
        if saved.get("model_marker") and not model_checkpoint_complete(self.args.load, rollout_id):
            raise RuntimeError(
                f"resume from the rollout-{rollout_id} checkpoint: its model checkpoint is not marked complete "
                f"(no {MODEL_DONE_FILE.format(rollout_id=rollout_id)} and Megatron's {MEGATRON_TRACKER} is "
                f"behind it): its write, asynchronous with --async-save, was cut short, so the weights may be "
                f"torn. {last_consistent_save(self.args.load, rollout_id)}"
            )
        self.inner.load(rollout_id)
        groups = saved["groups"]
        with self._lock:
            self._restored.extend(groups)
        logger.info("restored %d consumed-but-untrained groups from %s", len(groups), path)


def _consistent(load_dir: str, rollout_id: int) -> bool:
    """Data state complete and, for saves that carry the marker flag, the model marked complete."""
    import torch

    path = os.path.join(load_dir, PENDING_FILE.format(rollout_id=rollout_id))
    if not os.path.exists(path):
        return False
    if model_checkpoint_complete(load_dir, rollout_id):
        return True
    return not torch.load(path, weights_only=False).get("model_marker", False)


def last_consistent_save(load_dir: str, before: int) -> str:
    """A sentence naming the newest rollout below ``before`` whose data state is complete and whose
    model checkpoint is marked complete (see ``StreamingDataSource.load``)."""
    import re

    candidates = []
    rollout_dir = os.path.join(load_dir, "rollout")
    names = os.listdir(rollout_dir) if os.path.isdir(rollout_dir) else []
    for name in names:
        match = re.fullmatch(r"global_dataset_state_dict_(\d+)\.pt", name)
        if match and int(match.group(1)) < before:
            candidates.append(int(match.group(1)))
    found = next((r for r in sorted(candidates, reverse=True) if _consistent(load_dir, r)), None)
    if found is None:
        return f"No earlier rollout in {load_dir} has a complete data state and model checkpoint: start the run afresh."
    # slime saves the Megatron checkpoint of rollout r as iteration r
    return f"The last consistent save is rollout {found}: resume from it with --ckpt-step {found}."
