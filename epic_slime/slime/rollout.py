"""``--rollout-function-path epic_slime.slime.rollout.generate_rollout``: streaming generation
with a staleness bound.

Training batches: slime's ``AsyncRolloutWorker`` (``slime.rollout.fully_async_rollout``) keeps
generating groups in a background thread across weight updates; this function takes finished
groups from its queue, works out each group's staleness from ``Sample.weight_versions``
(``epic_slime.slime.staleness``), enforces ``--max-staleness`` with ``--stale-policy`` and returns
``rollout_batch_size`` admitted groups with staleness statistics as rollout metrics.

Synchronous schedule (``--max-staleness 0``): no background worker (it would keep generating
with the old weights while the driver trains); each call runs slime's own synchronous training
rollout (``sglang_rollout.generate_rollout``, exactly one batch with the engines' current
weights) and passes its groups through the same staleness gate with K = 0, which every group must
meet (``generate_on_policy_rollout``).

Evaluation: slime's synchronous ``sglang_rollout.generate_rollout(..., evaluation=True)``, which
honours ``--eval-prompt-data``, ``--n-samples-per-eval-prompt``, ``--eval-top-p``, ... .

slime is imported lazily: this module runs inside slime's RolloutManager actor.
"""

from __future__ import annotations

import logging
import threading

from epic_slime.metric_names import STALENESS_PREFIX
from epic_slime.slime.staleness import (
    StalenessGate,
    annotate_group,
    collect_admitted_groups,
    sample_version,
    select_groups,
    trainer_version_for_rollout,
)

logger = logging.getLogger("epic_slime.slime.rollout")

_lock = threading.Lock()
_worker = None
_totals = {"dropped_groups": 0, "dropped_samples": 0, "kept_over_limit_groups": 0}
# First training rollout id seen by this process: the driver generates its start rollout first.
# (args.start_rollout_id is not reliable here: slime fills it in the driver only after the
# RolloutManager actor received its copy of args, when resuming from a checkpoint.)
_first_rollout_id: int | None = None


def _get_worker(args, data_source):
    global _worker
    with _lock:
        if _worker is None or _worker.worker_thread is None or not _worker.worker_thread.is_alive():
            from slime.rollout.fully_async_rollout import AsyncRolloutWorker

            # slime's default (server concurrency x engines, ~1000 groups) would let the queue run
            # many batches ahead and make most samples stale; one batch ahead by default.
            concurrency = getattr(args, "async_groups_in_flight", None) or args.rollout_batch_size
            _worker = AsyncRolloutWorker(args, data_source, concurrency=concurrency)
            _worker.start()
        return _worker


def _group_sort_key(group) -> int:
    for sample in group:
        if getattr(sample, "index", None) is not None:
            return int(sample.index)
    return 0


def generate_rollout(args, rollout_id: int, data_source, evaluation: bool = False):
    if evaluation:
        from slime.rollout.sglang_rollout import generate_rollout as slime_generate_rollout

        return slime_generate_rollout(args, rollout_id, data_source, evaluation=True)

    if getattr(args, "max_staleness", None) == 0:
        return generate_on_policy_rollout(args, rollout_id, data_source)

    from slime.rollout.base_types import RolloutFnTrainOutput
    from slime.utils.async_utils import run

    if not args.rollout_global_dataset:
        raise ValueError("epic_slime.slime.rollout needs slime's global dataset (do not pass --disable-rollout-global-dataset)")
    global _first_rollout_id
    if _first_rollout_id is None:
        _first_rollout_id = rollout_id
    worker = _get_worker(args, data_source)
    trainer_version = trainer_version_for_rollout(rollout_id, _first_rollout_id)
    gate = StalenessGate(getattr(args, "max_staleness", None), getattr(args, "stale_policy", "drop"))
    groups = run(
        collect_admitted_groups(
            # slime's worker hands out (group id, group) pairs
            lambda limit: [group for _, group in worker.get_completed_groups(limit=limit)],
            trainer_version=trainer_version,
            gate=gate,
            target=args.rollout_batch_size,
        )
    )
    groups.sort(key=_group_sort_key)
    for key in _totals:
        _totals[key] += getattr(gate, key)
    metrics = gate.metrics(prefix=STALENESS_PREFIX)
    metrics |= {f"{STALENESS_PREFIX}total_{k}": float(v) for k, v in _totals.items()}
    metrics[f"{STALENESS_PREFIX}trainer_version"] = float(trainer_version)
    metrics[f"{STALENESS_PREFIX}queue_left"] = float(worker.queue_size())
    logger.info("rollout %d: %s", rollout_id, {k: v for k, v in metrics.items() if "groups_at" not in k})
    return RolloutFnTrainOutput(samples=groups, metrics=metrics)


def _slime_generate_batch(args, rollout_id: int, data_source):
    """slime's synchronous training rollout: one batch, generated with the engines' current weights."""
    from slime.rollout.sglang_rollout import generate_rollout as slime_generate_rollout

    return slime_generate_rollout(args, rollout_id, data_source, evaluation=False)


def generate_on_policy_rollout(args, rollout_id: int, data_source):
    """The synchronous schedule's rollout (K = 0): slime's batch, checked on-policy group by group.

    The driver pushes the weights trained on rollout r - 1 before it asks for rollout r, so every
    sample must carry the training policy's version: the staleness gate (K = 0) admits all groups
    or the version bookkeeping is broken, which raises instead of silently dropping prompts.
    """
    global _first_rollout_id
    if _first_rollout_id is None:
        _first_rollout_id = rollout_id
    trainer_version = trainer_version_for_rollout(rollout_id, _first_rollout_id)
    output = _slime_generate_batch(args, rollout_id, data_source)
    groups = [list(group) for group in output.samples]
    versions = [
        [sample_version(getattr(s, "weight_versions", None), getattr(s, "index", None)) for s in group]
        for group in groups
    ]
    gate = StalenessGate(0, "drop")
    admitted, stalenesses = select_groups(groups, versions, trainer_version, gate, target=len(groups))
    if gate.dropped_groups:
        stale = sorted({trainer_version - min(v) for v in versions} - {0})
        raise RuntimeError(
            f"rollout {rollout_id}: {gate.dropped_groups} of {len(groups)} groups were generated "
            f"{stale} weight updates before the training policy (version {trainer_version}); the "
            "synchronous schedule (--max-staleness 0) pushes weights before every rollout, so the "
            "driver's version count and the engines' weight_version disagree"
        )
    for index, staleness in zip(admitted, stalenesses, strict=True):
        annotate_group(groups[index], versions[index], trainer_version, staleness)
    metrics = dict(output.metrics or {})
    metrics |= gate.metrics(prefix=STALENESS_PREFIX)
    metrics[f"{STALENESS_PREFIX}trainer_version"] = float(trainer_version)
    logger.info("rollout %d (synchronous): %d groups on policy version %d", rollout_id, len(groups), trainer_version)
    return type(output)(samples=groups, metrics=metrics)
