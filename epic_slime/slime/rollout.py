"""``--rollout-function-path epic_slime.slime.rollout.generate_rollout``: the rollout functions of
both schedules (with ``--data-source-path epic_slime.slime.data_source.StreamingDataSource``, which the
driver sets).

Asynchronous schedule (``--max-staleness K``, K >= 1): a background ``GroupStream``
(``epic_slime.slime.stream.group_stream``) generates consumed groups through slime's own
``generate_and_rm_group``, across weight updates. It starts a group whenever the admission budget
allows (``epic_slime.admission.AdmissionBudget``: live groups < (g + K) * B), tops up on every
completion, whenever a batch is taken and when a push lands, and each rollout takes the oldest
``rollout_batch_size`` groups in start order (waiting for them). ``--async-groups-in-flight`` (the
oversampled batch with ``--oversample-ratio``) is an optional cap on the groups held, on top of the
budget. This module works out each group's staleness from ``Sample.weight_versions``
(``epic_slime.slime.stream.gate``), enforces ``--max-staleness`` with ``--stale-policy`` and returns
``rollout_batch_size`` admitted groups with staleness and accounting metrics
(``rollout/staleness/*``, ``rollout/accounting/*``). A group too stale to train (under ``drop``) is not
lost: it is regenerated from its fresh prompt (``rollout/staleness/requeued``), at most
``MAX_STALE_REQUEUES`` times, and only then dropped (counted).

Why not slime's ``AsyncRolloutWorker``: it runs its own event loop in a thread, while slime's eval
path (``sglang_rollout.generate_rollout(evaluation=True)``) runs on slime's global loop
(``slime.utils.async_utils``); both share ``GenerateState``'s semaphore and the global
``httpx.AsyncClient``, which bind to the first loop that uses them. Evaluating while groups are in
flight then fails with "bound to a different event loop", and the worker drops the crashed group
after its prompt was consumed. ``GroupStream`` runs on slime's global loop, so training groups and
eval share one loop, one semaphore and one client.

Staleness on a cluster (the driver's overlap schedule, slime's push order): when ``generate(r)`` is
asked for (trainer version T = r - s + 1) the engines hold version T - 1, and the budget admits
groups up to (T - 1 + K) batches since the start: the n-th (in start order) trains at version
floor(n / B) + 1 and started at a g with n < (g + K) B, so no trained group is more than K
versions stale and none is requeued or dropped for staleness (the gate still checks and counts).

Resume: ``StreamingDataSource`` (``epic_slime.slime.data_source``) saves every consumed group not yet
trained next to slime's data-source state and hands them out first on load.

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

from epic_slime.length_deciles import decile_metrics, format_deciles, length_deciles
from epic_slime.metric_names import STALENESS_PREFIX
from epic_slime.slime.data_source import StreamingDataSource, group_key
from epic_slime.slime.cli.flags import DATA_SOURCE_PATH
from epic_slime.slime.stream.gate import (
    StalenessGate,
    annotate_group,
    collect_admitted_groups,
    sample_version,
    select_groups,
    trainer_version_for_rollout,
)
from epic_slime.slime.stream.group_stream import GroupStream
from epic_slime.slime.stream.sample_checks import check_groups_alignment
from epic_slime.staleness import over_limit

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_stream = None
_totals = {"dropped_groups": 0, "dropped_samples": 0, "kept_over_limit_groups": 0, "requeued_groups": 0}
# First training rollout id seen by this process: the driver generates its start rollout first.
# (args.start_rollout_id is not reliable here: slime fills it in the driver only after the
# RolloutManager actor received its copy of args, when resuming from a checkpoint.)
_first_rollout_id: int | None = None


def training_rollouts_started() -> bool:
    """True once this process generated a training rollout: an evaluation before that is the
    pre-training one (slime keys it, and the one after training rollout 0, both as step 0)."""
    return _first_rollout_id is not None


def _get_stream(args, data_source) -> GroupStream:
    global _stream
    with _lock:
        if _stream is None:
            _stream = GroupStream(args, data_source, cap=getattr(args, "async_groups_in_flight", None))
        elif _stream.data_source is not data_source:
            raise RuntimeError(
                "epic_slime.slime.rollout: one RolloutManager per process (a second data source appeared)"
            )
        return _stream


def _group_sort_key(group) -> int:
    for sample in group:
        if getattr(sample, "index", None) is not None:
            return int(sample.index)
    return 0


def _check_data_source(data_source) -> None:
    if not isinstance(data_source, StreamingDataSource):
        raise ValueError(
            f"epic_slime.slime.rollout needs --data-source-path {DATA_SOURCE_PATH} (got "
            f"{type(data_source).__name__}): it records every consumed prompt for accounting and resume"
        )


async def _collect(
    args, stream: GroupStream, trainer_version: int, gate: StalenessGate, rollout_id: int, poll_seconds: float = 0.05
):
    ledger = stream.data_source.ledger
    stream.start_rollout(trainer_version)
    groups = await collect_admitted_groups(
        stream.pop,
        trainer_version=trainer_version,
        gate=gate,
        target=args.rollout_batch_size,
        poll_seconds=poll_seconds,
        requeue=stream.requeue if gate.stale_policy == "drop" else None,
        on_drop=stream.drop,
    )
    check_groups_alignment(groups)  # a misaligned generate function stops the run before any delivery
    for group in groups:
        ledger.deliver(group_key(group), rollout_id)
        stream.release(group)
        lag = int(group[0].metadata["epic_group_staleness"])
        stream.record(group, "over_k" if over_limit(lag, gate.max_staleness) else "trained", lag)
    # the driver asks for rollout r while r - 1 trains: rollouts <= r - 2 are trained by now
    ledger.close_rollout(rollout_id - 2)
    ledger.check(worker_in_flight=stream.accounted())
    return groups, ledger.metrics(), stream.held()


def generate_rollout(args, rollout_id: int, data_source, evaluation: bool = False):
    from epic_slime.slime.push_mode import install_rollout_hook

    install_rollout_hook(args)  # --weight-push-mode in_place: a prefix-cache key per group (idempotent)
    if evaluation:
        from slime.rollout.sglang_rollout import generate_rollout as slime_generate_rollout

        from epic_slime.slime.routing import eval_args

        # runs on slime's global loop, next to the GroupStream's training groups; no R3 routing
        return slime_generate_rollout(eval_args(args), rollout_id, data_source, evaluation=True)

    if getattr(args, "max_staleness", None) == 0:
        return generate_on_policy_rollout(args, rollout_id, data_source)

    from slime.rollout.base_types import RolloutFnTrainOutput
    from slime.utils.async_utils import run

    if not args.rollout_global_dataset:
        raise ValueError(
            "epic_slime.slime.rollout needs slime's global dataset (do not pass --disable-rollout-global-dataset)"
        )
    _check_data_source(data_source)
    global _first_rollout_id
    if _first_rollout_id is None:
        _first_rollout_id = rollout_id
    stream = _get_stream(args, data_source)
    trainer_version = trainer_version_for_rollout(rollout_id, _first_rollout_id)
    gate = StalenessGate(getattr(args, "max_staleness", None), getattr(args, "stale_policy", "drop"))
    groups, accounting, held = run(_collect(args, stream, trainer_version, gate, rollout_id))
    groups.sort(key=_group_sort_key)
    for key in _totals:
        _totals[key] += getattr(gate, key)
    metrics = gate.metrics(prefix=STALENESS_PREFIX)
    metrics |= {f"{STALENESS_PREFIX}total_{k}": float(v) for k, v in _totals.items()}
    metrics[f"{STALENESS_PREFIX}trainer_version"] = float(trainer_version)
    metrics[f"{STALENESS_PREFIX}queue_left"] = float(held)
    metrics |= accounting
    metrics |= decile_metrics(length_deciles(stream.decile_records), prefix=f"{STALENESS_PREFIX}deciles/")
    run_deciles = length_deciles(stream.run_decile_records)
    metrics |= decile_metrics(run_deciles, prefix=f"{STALENESS_PREFIX}run_deciles/")
    logger.info("rollout %d: the run's groups by response-length decile\n%s", rollout_id, format_deciles(run_deciles))
    metrics["rollout/accounting/crash_retries"] = float(stream.crash_retries)
    metrics["rollout/accounting/abort_resubmits"] = float(stream.abort_resubmits)
    metrics["rollout/accounting/stale_requeues"] = float(stream.stale_requeues)
    metrics["rollout/accounting/empty_call_versions"] = float(stream.empty_call_versions)
    metrics["rollout/accounting/coarse_version_calls"] = float(stream.coarse_version_calls)
    metrics |= stream.faults.metrics()  # rollout/faults/*: engine death, hang, restart (engine_faults.py)
    logger.info(
        "rollout %d: %s", rollout_id, {k: v for k, v in metrics.items() if "groups_at" not in k and "deciles/" not in k}
    )
    from epic_slime.slime.routing import stage_for_training

    return RolloutFnTrainOutput(samples=stage_for_training(args, groups, rollout_id), metrics=metrics)


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
    _check_data_source(data_source)
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
    # accounting: the driver asks for rollout r once r - 1 is trained; nothing else is in flight
    # (slime's synchronous rollout hands back aborted groups through add_samples only with
    # --partial-rollout, which K = 0 rejects)
    ledger = data_source.ledger
    check_groups_alignment(groups)
    for group in groups:
        ledger.deliver(group_key(group), rollout_id)
    ledger.close_rollout(rollout_id - 1)
    ledger.check(worker_in_flight=data_source.handed_back())
    metrics = dict(output.metrics or {})
    metrics |= gate.metrics(prefix=STALENESS_PREFIX)
    metrics[f"{STALENESS_PREFIX}trainer_version"] = float(trainer_version)
    metrics |= ledger.metrics()
    logger.info("rollout %d (synchronous): %d groups on policy version %d", rollout_id, len(groups), trainer_version)
    from epic_slime.slime.routing import stage_for_training

    return type(output)(samples=stage_for_training(args, groups, rollout_id), metrics=metrics)
