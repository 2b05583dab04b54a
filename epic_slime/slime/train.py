"""The asynchronous slime driver: ``python -m epic_slime.slime.train <slime flags + project flags>``.

slime's own train scripts are repository-root files, not part of its package, so this driver
is built from slime's public pieces (placement groups, RolloutManager, the actor group's
``async_train`` / ``update_weights`` / ``save_model``):

  1. push the initial weights to SGLang (weight version 1);
  2. ask the RolloutManager for rollout ``start``; for every rollout ``r``: wait for its data,
     immediately ask for rollout ``r + 1`` (the background worker of
     ``epic_slime.slime.rollout`` never stops generating), train ``r`` with ``D`` optimizer
     steps, save when due (data state, then model; with ``--async-save`` the model write overlaps
     what follows, see ``save_checkpoint``), push the new weights, evaluate every ``--eval-interval``.

slime's RolloutManager actor runs one call at a time and the weight push asks it for the
engines, so the push after rollout ``r`` happens once rollout ``r + 1`` is collected (as in
slime's train_async.py): batches after the first are at least one update stale. Requests in
flight during a push are aborted (SGLang's default pause mode) and resubmitted as prompt + partial
response on the new weights (their samples carry both versions; see docs/cluster.md, "What runs").
How stale a group may be when it is trained is bounded by ``--max-staleness`` (>= 1).

``--max-staleness 0`` runs the synchronous schedule instead (``sync_training_loop``, the order of
slime's train.py and the paper's protocol): generate rollout ``r`` with the current weights, train
it, push, then generate ``r + 1``; every trained group is on-policy at the start of its batch.
Only this schedule lets SGLang and Megatron share GPUs (``--colocate``, ``--offload*``,
``--release-train``): it offloads the engines around training and onloads them for the push.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from epic_slime.provenance import resident_memory_mib
from epic_slime.slime.stream.checkpoint_marks import ModelSaves
from epic_slime.slime.cli.checks import validate_project_args
from epic_slime.slime.cli.command_line import read_command_line
from epic_slime.slime.cli.flags import ProjectFlagError, add_project_arguments

logger = logging.getLogger(__name__)


def log_driver_metrics(args: Any, rollout_id: int) -> dict[str, float]:
    """``perf/driver_rss_mb`` every rollout (the paper's Fig. 4b compares driver memory), through
    slime's tracking when it is importable."""
    metrics = {"perf/driver_rss_mb": resident_memory_mib(), "rollout/step": float(rollout_id)}
    logger.info("rollout %d driver: %s", rollout_id, metrics)
    try:
        from slime.observability import logging_utils
    except ImportError:
        return metrics
    if getattr(args, "use_wandb", False) or getattr(args, "use_tensorboard", False):
        logging_utils.log(args, dict(metrics), step_key="rollout/step")
    return metrics


def _periodic(rollout_id: int, interval: int | None, per_epoch: int | None, last: int | None = None) -> bool:
    """Same rule as slime's ``should_run_periodic_action`` (a 1-based step hits the interval)."""
    if interval is None:
        return False
    if last is not None and rollout_id == last:
        return True
    step = rollout_id + 1
    return step % interval == 0 or (per_epoch is not None and step % per_epoch == 0)


def save_checkpoint(
    args: Any,
    rollout_manager: Any,
    actor_model: Any,
    rollout_id: int,
    force_sync: bool,
    get: Callable[[Any], Any],
    marks: ModelSaves | None = None,
) -> None:
    """The data state (slime's data-source state and the consumed, untrained groups) first, then
    the model checkpoint. A resume starts from the newest model checkpoint, so that checkpoint must
    never exist without its data state: in the overlap schedule the data save waits behind
    ``generate(r + 1)`` on the one-call-at-a-time RolloutManager, often minutes, and a crash in that
    window would otherwise restart the data at prompt 0. A crash between the two now resumes from
    the previous checkpoint, whose data state is complete.

    With ``--async-save`` slime's ``save_model`` returns once Megatron has staged the checkpoint
    and the write runs on while the driver pushes and the next rollout generates; ``marks``
    (``checkpoint_marks.ModelSaves``) writes each checkpoint's completion marker once its write is
    known to be done. A kill during the write resumes from the previous marked checkpoint."""
    if marks is not None:
        marks.starting(rollout_id)
    if args.rollout_global_dataset:
        get(rollout_manager.save.remote(rollout_id))
    actor_model.save_model(rollout_id, force_sync=force_sync)
    if marks is not None:
        marks.saved(rollout_id, force_sync)


def eval_before_training(args: Any) -> int | None:
    """Rollout id of the evaluation before the first training step, or None.

    slime's rule: at a fresh start (rollout 0) unless --skip-eval-before-train. An eval-only run
    (``--num-rollout`` at or below the start, e.g. 0) evaluates the loaded weights once, keyed as
    the evaluation after the checkpoint's last rollout."""
    if args.eval_interval is None:
        return None
    start, end = args.start_rollout_id, args.num_rollout
    if start >= end:
        return max(start - 1, 0)
    if start == 0 and not getattr(args, "skip_eval_before_train", False):
        return 0
    return None


def async_training_loop(
    args: Any,
    rollout_manager: Any,
    actor_model: Any,
    num_rollout_per_epoch: int | None,
    get: Callable[[Any], Any],
) -> list[tuple[str, int]]:
    """The overlap schedule; returns the (event, rollout_id) trace (tests run it on fakes)."""
    trace: list[tuple[str, int]] = []
    start, end = args.start_rollout_id, args.num_rollout
    marks = ModelSaves(args)
    first_eval = eval_before_training(args)
    if first_eval is not None:
        get(rollout_manager.eval.remote(first_eval))
        trace.append(("eval", first_eval))
    next_ref = rollout_manager.generate.remote(start) if start < end else None
    if next_ref is not None:
        trace.append(("generate", start))
    for rollout_id in range(start, end):
        data_ref = get(next_ref)
        next_ref = None
        if rollout_id + 1 < end:
            next_ref = rollout_manager.generate.remote(rollout_id + 1)
            trace.append(("generate", rollout_id + 1))
        get(actor_model.async_train(rollout_id, data_ref))
        trace.append(("train", rollout_id))
        if _periodic(rollout_id, args.save_interval, num_rollout_per_epoch, end - 1):
            save_checkpoint(args, rollout_manager, actor_model, rollout_id, rollout_id == end - 1, get, marks)
            trace.append(("save", rollout_id))
        actor_model.update_weights()
        trace.append(("update_weights", rollout_id))
        log_driver_metrics(args, rollout_id)
        if _periodic(rollout_id, args.eval_interval, num_rollout_per_epoch):
            get(rollout_manager.eval.remote(rollout_id))
            trace.append(("eval", rollout_id))
    return trace


def push_initial_weights(
    args: Any, rollout_manager: Any, actor_model: Any, get: Callable[[Any], Any]
) -> list[tuple[str, int]]:
    """Weight version 1, the policy of the first batch; returns the trace (rollout id ``start - 1``).

    With offloaded engines the weights are onloaded before the push and the KV cache after it
    (with --release-train slime's disk reload onloads the weights itself), as in slime's train.py.
    """
    before = args.start_rollout_id - 1
    offload_rollout = bool(getattr(args, "offload_rollout", False))
    trace: list[tuple[str, int]] = []
    if offload_rollout and not getattr(args, "release_train", False):
        get(rollout_manager.onload_weights.remote())
        trace.append(("onload_weights", before))
    actor_model.update_weights()
    trace.append(("update_weights", before))
    if getattr(args, "check_weight_update_equal", False):
        get(rollout_manager.check_weights.remote(action="compare"))
        trace.append(("check_weights", before))
    if offload_rollout:
        get(rollout_manager.onload_kv.remote())
        trace.append(("onload_kv", before))
    return trace


def sync_training_loop(
    args: Any,
    rollout_manager: Any,
    actor_model: Any,
    num_rollout_per_epoch: int | None,
    get: Callable[[Any], Any],
) -> list[tuple[str, int]]:
    """The synchronous schedule (K = 0); returns the (event, rollout_id) trace, like async_training_loop.

    Per rollout r: generate r (the engines hold the weights trained on r - 1), offload the engines
    if they share GPUs, (re)create released train actors, train D steps, save when due (every
    rollout with --release-train, whose next actors reload from the checkpoint; the data state
    first), free the train actors' cached memory without --offload-train (offload-train actors
    sleep by themselves after training), onload the engines' weights, push, onload their KV cache,
    evaluate.
    """
    trace: list[tuple[str, int]] = []
    start, end = args.start_rollout_id, args.num_rollout
    offload_rollout = bool(getattr(args, "offload_rollout", False))
    release_train = bool(getattr(args, "release_train", False))
    # as slime's train.py: actors that do not sleep after training (no --offload-train) free their
    # cached memory before the push, colocated or not
    free_train_memory = not getattr(args, "offload_train", False)
    marks = ModelSaves(args)
    first_eval = eval_before_training(args)
    if first_eval is not None:
        get(rollout_manager.eval.remote(first_eval))
        trace.append(("eval", first_eval))
    for rollout_id in range(start, end):
        data_ref = get(rollout_manager.generate.remote(rollout_id))
        trace.append(("generate", rollout_id))
        if offload_rollout:
            get(rollout_manager.offload.remote())
            trace.append(("offload_rollout", rollout_id))
        if release_train:
            actor_model.create()
            trace.append(("create_train", rollout_id))
        get(actor_model.async_train(rollout_id, data_ref))
        trace.append(("train", rollout_id))
        if release_train or _periodic(rollout_id, args.save_interval, num_rollout_per_epoch, end - 1):
            save_checkpoint(
                args, rollout_manager, actor_model, rollout_id, release_train or rollout_id == end - 1, get, marks
            )
            trace.append(("save", rollout_id))
        if free_train_memory:
            actor_model.clear_memory()
            trace.append(("clear_memory", rollout_id))
        if offload_rollout and not release_train:
            get(rollout_manager.onload_weights.remote())
            trace.append(("onload_weights", rollout_id))
        actor_model.update_weights()
        trace.append(("update_weights", rollout_id))
        if offload_rollout:
            get(rollout_manager.onload_kv.remote())
            trace.append(("onload_kv", rollout_id))
        log_driver_metrics(args, rollout_id)
        if _periodic(rollout_id, args.eval_interval, num_rollout_per_epoch):
            get(rollout_manager.eval.remote(rollout_id))
            trace.append(("eval", rollout_id))
    return trace


def training_loop_for(args: Any) -> Callable[..., list[tuple[str, int]]]:
    """--max-staleness 0: the synchronous schedule; anything else: the overlap schedule."""
    return sync_training_loop if getattr(args, "max_staleness", None) == 0 else async_training_loop


def run(args: Any) -> None:
    import ray
    from slime.observability.logging_utils import configure_logger, finish_tracking, init_tracking
    from slime.ray.placement_group import create_placement_groups, create_rollout_manager, create_training_models

    configure_logger()
    pgs = create_placement_groups(args)
    init_tracking(args)
    rollout_manager, num_rollout_per_epoch = create_rollout_manager(args, pgs["rollout"])
    actor_model, _ = create_training_models(args, pgs, rollout_manager)
    push_initial_weights(args, rollout_manager, actor_model, ray.get)
    training_loop_for(args)(args, rollout_manager, actor_model, num_rollout_per_epoch, ray.get)
    ray.get(rollout_manager.dispose.remote())
    finish_tracking(args)


def parse(argv: Sequence[str]) -> Any:
    """slime's parser with the project's flags, on the command line with the driver's rewrites
    (``command_line.read_command_line``: update depth, aggregation, oversampling, warmup, rollout
    log-probs, data source, R3 hook)."""
    # slime ignores unknown flags and SGLang's parser expands abbreviations: the spelling is checked first
    line = read_command_line(argv)
    for override in line.overrides:
        print(f"epic_slime.slime.train: override: {override.describe()}", file=sys.stderr)
    from slime.utils.arguments import parse_args

    saved = sys.argv
    sys.argv = [saved[0] if saved else "epic_slime.slime.train", *line.driver_argv]
    try:
        args = parse_args(add_custom_arguments=add_project_arguments)
    finally:
        sys.argv = saved
    config = validate_project_args(args)
    logger.info("epic-slime config: %s", config)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse(argv)
    except ProjectFlagError as exc:
        print(f"epic_slime.slime.train: error: {exc}", file=sys.stderr)
        return 2
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
