"""One life of a killed-and-resumed run through slime's own MegatronTrainRayActor on CPU (issue 45 item 6):
`python tests/support/megatron_resume.py WORKDIR JOURNAL` with `EPIC_KILL=POINT:ROLLOUT` (or none).

The run is the overlap schedule's shape at the data source (rollout r + 1's prompts are taken, and
delivered, before r trains), with the project's real pieces: `StreamingDataSource` (slime's data source
plus the ledger of every consumed prompt), the driver's `save_checkpoint` (data state, then the model
through slime's `save_model` -> slime's checkpoint.py -> megatron.training's `save_checkpoint`) and its
`ModelSaves` marks. A life starts as slime's driver does: the actor's `init` loads what `--load` holds
(Megatron's tracker, or the HF export at a fresh start) and returns the start rollout; the data source
then loads the state saved with the rollout before it.

`EPIC_KILL` SIGKILLs this process at one point of rollout ROLLOUT's save:
- `first`: once the first of the two saves returned (the data state, in the driver's order);
- `model_write`: inside Megatron's save, its shards written, before its tracker is (the write's
  completion never recorded);
- `after`: once both saves and their marks are done.

Every event goes to JOURNAL as one JSON line, flushed and fsynced, so a kill loses none of them:
`start` (start rollout, groups restored, weights), `take` (the prompts a rollout got), `trained`,
`saved_model` (the weights as saved), `end` (the ledger's counts).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import types
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
NUM_ROLLOUT = 5


def _paths() -> None:
    for p in (str(REPO), str(TESTS), os.environ.get("SLIME_PATH", "")):
        if p and p not in sys.path:
            sys.path.insert(0, p)


class Journal:
    def __init__(self, path: Path):
        self.path = path

    def write(self, event: str, **fields) -> None:
        with open(self.path, "a") as handle:
            handle.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def weight_hashes(actor) -> dict[str, str]:
    """Per parameter (slime's global names): sha-256 of its bytes (equal hashes: the same values)."""
    import torch
    from slime.backends.megatron_utils.update_weight.common import named_params_and_buffers

    return {
        n: hashlib.sha256(t.detach().flatten().contiguous().view(torch.uint8).numpy()).hexdigest()
        for n, t in named_params_and_buffers(actor.args, actor.model)
    }


class KillSwitch:
    """SIGKILLs this process at `EPIC_KILL`'s point (see the module docstring)."""

    def __init__(self, spec: str | None):
        point, _, rollout = (spec or ":").partition(":")
        self.point, self.rollout = point or None, int(rollout) if rollout else None
        self.saves_done: dict[int, int] = {}
        self.in_model_save: int | None = None

    def _kill(self, journal: Journal, where: str, rollout_id: int) -> None:
        journal.write("killed", point=where, rollout=rollout_id)
        os.kill(os.getpid(), signal.SIGKILL)

    def save_returned(self, journal: Journal, rollout_id: int) -> None:
        self.saves_done[rollout_id] = self.saves_done.get(rollout_id, 0) + 1
        if self.point == "first" and rollout_id == self.rollout and self.saves_done[rollout_id] == 1:
            self._kill(journal, "first", rollout_id)

    def install_model_write_kill(self, journal: Journal) -> None:
        """Megatron's save names its tracker file once every shard is written, just before writing it."""
        import megatron.training.checkpointing as checkpointing

        tracker_name = checkpointing.get_checkpoint_tracker_filename

        def tracker_filename(path):
            if self.point == "model_write" and self.in_model_save == self.rollout:
                self._kill(journal, "model_write", self.rollout)
            return tracker_name(path)

        checkpointing.get_checkpoint_tracker_filename = tracker_filename


def start_actor(workdir: Path):
    """slime's actor as tests/support/megatron_actor.py builds it (the harness's patches, its stand-ins),
    loading `workdir/ckpt` when Megatron's tracker is there, else the HF export."""
    from support.megatron_actor import _numpy_reporting_1x, actor_argv, parse_actor_args
    from support.megatron_cpu import apply_patches, install_cpu_accelerator

    apply_patches()
    install_cpu_accelerator()
    from epic_slime.runtime.hf_export import export_checkpoint
    from epic_slime.slime.stream.checkpoint_marks import megatron_tracker_iteration
    from support.megatron_qwen import hf_policy

    hf_dir = export_checkpoint(hf_policy(), workdir / f"hf-{os.getpid()}", dtype="float32")
    ckpt = workdir / "ckpt"
    load = ckpt if megatron_tracker_iteration(str(ckpt)) is not None else hf_dir
    argv = actor_argv(str(hf_dir), str(ckpt), str(load), 1) + ["--num-rollout", str(NUM_ROLLOUT)]
    args = parse_actor_args(argv)

    import numpy

    import slime.backends.megatron_utils.initialize as slime_init
    import slime.ray.train_actor as train_actor
    from slime.backends.megatron_utils.actor import MegatronTrainRayActor

    from support.megatron_push import install_local_name_loader

    install_local_name_loader()
    train_actor.get_local_gpu_id = lambda: 0
    slime_init.np = _numpy_reporting_1x(numpy)
    actor = MegatronTrainRayActor(1, 0, "127.0.0.1", int(os.environ.get("EPIC_ACTOR_PORT", "29533")))
    actor_start = actor.init(args, "actor")
    # slime's create_training_models: a parse that found no Megatron checkpoint set 0, else the actor's
    if args.start_rollout_id is None:
        args.start_rollout_id = actor_start
    return args, actor


def run(workdir: Path, journal: Journal, kill: KillSwitch) -> None:
    from epic_slime.slime import train
    from epic_slime.slime.stream.checkpoint_marks import ModelSaves
    from epic_slime.slime.data_source import StreamingDataSource, group_key
    from support.megatron_actor import rollout_samples, slime_train_data
    from support.megatron_qwen import hf_policy
    from support.slime_store import ObjectStoreStandIn

    args, actor = start_actor(workdir)
    kill.install_model_write_kill(journal)
    source = StreamingDataSource(args)  # slime's inner source numbers prompts (no --prompt-data)
    if args.rollout_global_dataset:  # slime's create_training_models
        source.load(args.start_rollout_id - 1)
    start, end = args.start_rollout_id, args.num_rollout
    journal.write("start", start=start, restored=len(source._restored), weights=weight_hashes(actor))

    def take(rollout_id: int) -> list[int]:
        keys = [group_key(g) for g in source.get_samples(args.rollout_batch_size)]
        for key in keys:
            source.ledger.deliver(key, rollout_id)
        journal.write("take", rollout=rollout_id, prompts=keys)
        return keys

    class RolloutManager:  # the driver's calls on slime's RolloutManager (`save` -> the data source)
        save = types.SimpleNamespace(remote=lambda rollout_id: _data_save(rollout_id))

    def _data_save(rollout_id: int) -> None:
        source.save(rollout_id)
        kill.save_returned(journal, rollout_id)

    real_save_model = actor.save_model

    def save_model(rollout_id: int, force_sync: bool = False) -> None:
        kill.in_model_save = rollout_id
        real_save_model(rollout_id, force_sync=force_sync)
        kill.in_model_save = None
        journal.write("saved_model", rollout=rollout_id, weights=weight_hashes(actor))
        kill.save_returned(journal, rollout_id)

    actor.save_model = save_model
    hf, store, marks = hf_policy(), ObjectStoreStandIn(), ModelSaves(args)
    batch = take(start) if start < end else []
    for rollout_id in range(start, end):
        following = take(rollout_id + 1) if rollout_id + 1 < end else []  # generated while r trains
        samples = [s for key in batch for s in rollout_samples(hf, key, 1, args.n_samples_per_prompt)]
        actor.train(rollout_id, slime_train_data(args, samples, actor.train_parallel_config, store))
        journal.write("trained", rollout=rollout_id, prompts=sorted({s.group_index for s in samples}))
        force = rollout_id == end - 1
        train.save_checkpoint(args, RolloutManager, actor, rollout_id, force, lambda ref: ref, marks)
        if kill.point == "after" and rollout_id == kill.rollout:
            kill._kill(journal, "after", rollout_id)
        batch = following
    ledger = source.ledger
    journal.write(
        "end",
        consumed=ledger.consumed,
        trained=ledger.trained,
        dropped=ledger.dropped,
        in_flight=ledger.in_flight(),
        next_prompt=source.inner.sample_group_index,  # slime's data source: the next prompt it would number
    )


def main(argv: list[str]) -> int:
    _paths()
    workdir, journal = Path(argv[0]), Journal(Path(argv[1]))
    run(workdir, journal, KillSwitch(os.environ.get("EPIC_KILL")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
