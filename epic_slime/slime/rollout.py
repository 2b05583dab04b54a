"""``--rollout-function-path epic_slime.slime.rollout.generate_rollout`` (with
``--data-source-path epic_slime.slime.rollout.StreamingDataSource``, which the driver sets):
streaming generation with a staleness bound, exact prompt accounting and resumable in-flight groups.

Training batches: a background ``GroupStream`` generates consumed groups through slime's own
``generate_and_rm_group``, across weight updates. It starts a group whenever the admission budget
allows (``epic_slime.staleness.AdmissionBudget``: live_started < (g + K) * B, see ``GroupStream``),
tops up on every completion, whenever a batch is taken and when a push lands, and each rollout
takes the oldest ``rollout_batch_size`` groups in start order (waiting for them).
``--async-groups-in-flight`` (the oversampled batch with ``--oversample-ratio``) is an optional cap
on the groups held, on top of the budget. This function works out each group's staleness from
``Sample.weight_versions`` (``epic_slime.staleness``), enforces ``--max-staleness`` with
``--stale-policy`` and returns ``rollout_batch_size`` admitted groups with staleness and
accounting metrics (``rollout/staleness/*``, ``rollout/accounting/*``). A group too stale to train
(under ``drop``) is not lost: it is regenerated from its fresh prompt (``rollout/staleness/requeued``),
at most ``MAX_STALE_REQUEUES`` times, and only then dropped (counted).

Why not slime's ``AsyncRolloutWorker``: it runs its own event loop in a thread, while slime's eval
path (``sglang_rollout.generate_rollout(evaluation=True)``) runs on slime's global loop
(``slime.utils.async_utils``); both share ``GenerateState``'s semaphore and the global
``httpx.AsyncClient``, which bind to the first loop that uses them. Evaluating while groups are in
flight then fails with "bound to a different event loop", and the worker drops the crashed group
after its prompt was consumed. ``GroupStream`` runs on slime's global loop, so training groups and
eval share one loop, one semaphore and one client. A group whose generation raises is regenerated
from its fresh prompt (counted, at most ``MAX_GROUP_ATTEMPTS`` tries, then an error); a group that
SGLang aborted (a weight push pauses generation in SGLang's abort mode) is resubmitted as prompt
plus partial response, which SGLang recomputes on the new weights (its samples carry both weight
versions; the oldest sets the staleness; a call aborted before its first token adds none).

Staleness on a cluster (the driver's overlap schedule, slime's push order): when ``generate(r)`` is
asked for (trainer version T = r - s + 1) the engines hold version T - 1, and the budget admits
groups up to (T - 1 + K) batches since the start: the n-th (in start order) trains at version
floor(n / B) + 1 and started at a g with n < (g + K) B, so no trained group is more than K
versions stale and none is requeued or dropped for staleness (the gate still checks and counts).
A group aborted ``MAX_CONSECUTIVE_ABORTS`` times in a row ends the run (``AbortLoopError``).

Resume: ``StreamingDataSource`` records every consumed group until it is trained or dropped
(``GroupLedger``); ``save(r)`` (rollouts <= r are trained) writes the fresh prompts of all others
next to slime's data-source state, and ``load`` hands them out first, so a resumed run trains
every prompt once. The driver saves this data state before the model checkpoint, and ``load``
refuses a checkpoint whose data state is missing, naming the last rollout that has one.

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

import asyncio
import copy
import logging
import os
import threading
from collections import Counter, deque

from epic_slime.metric_names import STALENESS_PREFIX
from epic_slime.slime.flags import DATA_SOURCE_PATH
from epic_slime.staleness import (
    AdmissionBudget,
    GroupLedger,
    StalenessGate,
    annotate_group,
    collect_admitted_groups,
    decile_metrics,
    format_deciles,
    length_deciles,
    over_limit,
    parse_weight_version,
    sample_oldest_version,
    sample_version,
    select_groups,
    trainer_version_for_rollout,
)

logger = logging.getLogger("epic_slime.slime.rollout")

MAX_GROUP_ATTEMPTS = 3
# A group aborted this many times in a row (each abort resubmits its partial response) fails the
# run with AbortLoopError: under the admission budget a group meets at most K + 1 pushes.
MAX_CONSECUTIVE_ABORTS = 16
# A group too stale to train is regenerated from its prompt at most this many times, then dropped
# (counted): only a group overtaken again and again (a response far longer than the rest) gets there.
MAX_STALE_REQUEUES = 3
PENDING_FILE = "rollout/epic_pending_groups_{rollout_id}.pt"
DATA_STATE_FILE = "rollout/global_dataset_state_dict_{rollout_id}.pt"   # slime's RolloutDataSource.save

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
        self._restored: deque = deque()   # fresh groups of a saved run, handed out first
        self._returned: deque = deque()   # groups given back through add_samples (already consumed)

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

    def add_samples(self, samples) -> None:
        """Groups given back (e.g. slime's partial-rollout abort path) are handed out again first,
        without counting them as consumed twice."""
        with self._lock:
            for group in samples:
                if group_key(group) not in self.ledger.payloads:
                    raise ValueError(f"add_samples: group {group_key(group)} was never handed out by this data source")
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
        torch.save({"groups": pending}, path + ".tmp")
        os.replace(path + ".tmp", path)
        self.inner.save(rollout_id)
        logger.info("saved %d consumed-but-untrained groups with the rollout-%d data state", len(pending), rollout_id)

    def load(self, rollout_id=None) -> None:
        """Resume (``rollout_id`` = the checkpoint's last trained rollout, >= 0): the data state and
        pending groups saved with it must exist; a fresh start (None or -1) loads nothing."""
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
        self.inner.load(rollout_id)
        groups = torch.load(path, weights_only=False)["groups"]
        with self._lock:
            self._restored.extend(groups)
        logger.info("restored %d consumed-but-untrained groups from %s", len(groups), path)


def last_consistent_save(load_dir: str, before: int) -> str:
    """A sentence naming the newest rollout below ``before`` whose data state is complete."""
    import re

    found = []
    rollout_dir = os.path.join(load_dir, "rollout")
    names = os.listdir(rollout_dir) if os.path.isdir(rollout_dir) else []
    for name in names:
        match = re.fullmatch(r"global_dataset_state_dict_(\d+)\.pt", name)
        if match and int(match.group(1)) < before and os.path.exists(
                os.path.join(load_dir, PENDING_FILE.format(rollout_id=int(match.group(1))))):
            found.append(int(match.group(1)))
    if not found:
        return f"No earlier rollout in {load_dir} has a complete data state: start the run afresh."
    # slime saves the Megatron checkpoint of rollout r as iteration r
    return f"The last consistent save is rollout {max(found)}: resume from it with --ckpt-step {max(found)}."


class AbortLoopError(RuntimeError):
    """One group was aborted (and resubmitted) ``aborts`` times in a row without finishing: an
    engine that aborts everything it is given (a pause never continued, a crashing scheduler)
    would otherwise resubmit it forever."""

    def __init__(self, group: int, aborts: int):
        self.group, self.aborts = group, aborts
        super().__init__(
            f"rollout group {group} was aborted {aborts} times in a row (limit {MAX_CONSECUTIVE_ABORTS}): "
            "the engines abort every request (a /pause_generation never continued?)"
        )


class GroupStream:
    """Keeps consumed groups generating (or finished, not yet taken) on slime's global event loop.

    Admission (``epic_slime.staleness.AdmissionBudget``, AReaL's rule in groups): a group STARTS
    only while live_started < (g + K) * B, g = the engine weight version the stream knows has
    landed, K = ``--max-staleness``, B = ``--rollout-batch-size``; live_started counts the groups
    started since the run's first rollout and not discarded (a requeued or dropped group leaves the
    count; its regeneration is a new start at the end of the order). The stream tops up on every
    completion, whenever a batch is taken and when a push lands, and batches are taken in START
    ORDER (``pop`` returns only the oldest live groups, waiting for them if still generating), so
    no group trains at a lag above K and none is requeued for staleness (the staleness gate still
    checks every group and counts what it would requeue or drop).

    When a push lands: slime's push waits for the RolloutManager, which serves one call at a time,
    so the push after training rollout r - 1 lands right after ``generate(r)`` returned, and when
    ``generate(r)`` is asked for (trainer version T) the engines hold version T - 1 (the first
    rollout: version 1, pushed before it). ``start_rollout(T)`` sets g to that; between the return
    and the next call the stream keeps the older g (conservative: it under-counts the landed pushes).

    ``--async-groups-in-flight`` (optional): a cap on the groups held (generating, finished and not
    taken, or waiting to start) on top of the budget, for memory; without ``--max-staleness`` it
    defaults to one batch (the budget is unbounded).

    Per sample (``Sample.metadata``): ``oldest_weight_version`` / ``newest_weight_version`` and, in
    abort mode, ``token_version_spans`` ([[version, tokens], ...], run-length per token: each generate
    call's tokens carry the version it reported). In place (``--weight-push-mode in_place``) a
    request decodes across the push and SGLang reports only the final version, so the oldest is the
    version the stream knew when it first submitted the group (a lower bound) and there are no spans.
    Staleness counts from the oldest.

    Every method except ``__init__`` runs on that loop."""

    def __init__(self, args, data_source: StreamingDataSource, cap: int | None = None,
                 max_requeues: int = MAX_STALE_REQUEUES, engine_version: int = 1):
        from slime.utils.async_utils import get_async_loop

        from epic_slime.slime.push_mode import IN_PLACE

        self.args = args
        self.data_source = data_source
        self.budget = AdmissionBudget(args.rollout_batch_size, getattr(args, "max_staleness", None))
        if cap is None and self.budget.max_staleness is None:
            cap = args.rollout_batch_size
        self.cap = cap
        self.in_place = getattr(args, "weight_push_mode", None) == IN_PLACE
        self.max_requeues = max_requeues
        self.engine_version = engine_version
        self.live_started = 0
        self.loop = get_async_loop().loop
        self.active: dict = {}           # task -> (group key, attempt, per sample (response length, versions) before)
        self.order: deque = deque()      # keys of the live, untaken groups in start order
        self.finished: dict = {}         # key -> finished group, not yet taken
        self.to_start: deque = deque()   # fresh groups of requeued prompts, started first when room opens
        self.requeues: Counter = Counter()   # group key -> times regenerated for staleness
        self.aborts: Counter = Counter()     # group key -> consecutive aborts of its current attempt
        self.crash_retries = 0
        self.abort_resubmits = 0
        self.stale_requeues = 0
        self.empty_call_versions = 0
        self.failures: list = []
        self.trainer_version = 1
        # (mean response length, lag, outcome) per group decision: this rollout's, and the run's in
        # steady state (from trainer version K + 2 on: before it the budget is still filling up)
        self.decile_records: list = []
        self.run_decile_records: list = []
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result()

    async def _start(self) -> None:
        from slime.rollout.sglang_rollout import GenerateState

        self.state = GenerateState(self.args)   # created on the loop that will use its semaphore

    @property
    def completed(self) -> list:
        """Finished groups not yet taken, in start order."""
        return [self.finished[k] for k in self.order if k in self.finished]

    def held(self) -> int:
        """Consumed groups the stream holds: generating, finished and not taken, or waiting to start."""
        return len(self.order) + len(self.to_start)

    def room(self) -> int:
        room = self.budget.room(self.engine_version, self.live_started)
        if self.cap is not None:
            room = min(room, max(0, self.cap - self.held()))
        return room

    def top_up(self) -> None:
        """Start groups while the budget (and the cap) allows: requeued prompts first."""
        for _ in range(self.room()):
            if self.to_start:
                group = self.to_start.popleft()
            else:
                groups = self.data_source.get_samples(1)
                if not groups:
                    return
                group = groups[0]
            self.live_started += 1
            self.order.append(group_key(group))
            self._submit(group, attempt=1)

    def _submit(self, group, attempt: int) -> None:
        from slime.rollout.sglang_rollout import generate_and_rm_group

        for sample in group:   # the version known at the first submission of this attempt
            metadata = _metadata(sample)
            metadata.setdefault("epic_submitted_version", self.engine_version)
            if not self.in_place:
                metadata.setdefault("token_version_spans", [])
        before = [(s.response_length, len(s.weight_versions)) for s in group]
        task = asyncio.ensure_future(
            generate_and_rm_group(self.args, group, sampling_params=self.state.sampling_params.copy(), evaluation=False)
        )
        self.active[task] = (group_key(group), attempt, before)
        task.add_done_callback(self._on_done)

    def _forget_empty_calls(self, group, before) -> None:
        """slime appends the engine's weight_version for every generate call, also for a request
        aborted before its first token (a push met it waiting): that version produced none of the
        sample's tokens and would overstate its staleness by one. Remove it."""
        from slime.utils.types import Sample

        for sample, (length, versions) in zip(group, before, strict=True):
            if sample.status == Sample.Status.ABORTED and sample.response_length == length:
                extra = len(sample.weight_versions) - versions
                if extra > 0:
                    del sample.weight_versions[versions:]
                    self.empty_call_versions += extra

    def _record_versions(self, group, before, finished: bool) -> None:
        """This call's tokens carry the version it reported (abort mode); a finished sample gets its
        oldest and newest version (in place: the oldest is the version known at submission)."""
        for sample, (length, versions) in zip(group, before, strict=True):
            metadata = _metadata(sample)
            new_tokens = sample.response_length - length
            if not self.in_place and new_tokens > 0 and len(sample.weight_versions) > versions:
                metadata["token_version_spans"].append([parse_weight_version(sample.weight_versions[-1]), new_tokens])
            if finished and sample.weight_versions:
                reported = [parse_weight_version(v) for v in sample.weight_versions]
                oldest = min(reported)
                if self.in_place:
                    oldest = min(oldest, metadata["epic_submitted_version"])
                metadata["oldest_weight_version"] = oldest
                metadata["newest_weight_version"] = max(reported)

    def _on_done(self, task) -> None:
        from slime.utils.types import Sample

        key, attempt, before = self.active.pop(task)
        try:
            group = task.result()
        except Exception as exc:  # noqa: BLE001 - any failure: regenerate the prompt, never drop it
            if attempt >= MAX_GROUP_ATTEMPTS:
                self.failures.append(RuntimeError(f"group {key}: {attempt} attempts, last error {exc!r}"))
                logger.error("rollout group %d failed %d times: %r", key, attempt, exc)
                return
            self.crash_retries += 1
            self.aborts.pop(key, None)
            logger.warning("rollout group %d raised %r; regenerating it from its prompt (attempt %d)", key, exc, attempt + 1)
            # keeps its place in the start order: it restarts at a version >= the one it was admitted at
            self._submit(self.data_source.fresh_group(key), attempt + 1)
            return
        from epic_slime.slime.routing import finish_group_routing, remember_partial_routing

        self._forget_empty_calls(group, before)
        aborted = any(getattr(s, "status", None) == Sample.Status.ABORTED for s in group)
        self._record_versions(group, before, finished=not aborted)
        if aborted:
            self.aborts[key] += 1
            if self.aborts[key] >= MAX_CONSECUTIVE_ABORTS:
                self.failures.append(AbortLoopError(key, self.aborts[key]))
                logger.error("rollout group %d aborted %d times in a row", key, self.aborts[key])
                return
            self.abort_resubmits += 1
            remember_partial_routing(group)   # R3: the rows of the tokens sampled before the push
            self._submit(group, attempt)   # prompt + partial response, continued on the new weights
            return
        self.aborts.pop(key, None)
        finish_group_routing(self.args, group)
        self.finished[key] = group
        self.top_up()

    def start_rollout(self, trainer_version: int) -> None:
        """Rollout ``trainer_version`` is asked for: the push before it landed (see the class
        docstring), so the engines hold ``trainer_version - 1`` (at least the first push's 1)."""
        self.engine_version = max(self.engine_version, trainer_version - 1)
        self.trainer_version = trainer_version
        self.decile_records = []
        self.top_up()

    def record(self, group, outcome: str, lag: int | None = None) -> None:
        """One group decision for the length-decile report."""
        if lag is None:
            lag = max(0, self.trainer_version - min(sample_oldest_version(s) for s in group))
        entry = (sum(s.response_length for s in group) / len(group), int(lag), outcome)
        self.decile_records.append(entry)
        steady_from = (self.budget.max_staleness or 0) + 2
        if self.trainer_version >= steady_from:
            self.run_decile_records.append(entry)

    def _discard(self, key) -> None:
        self.order.remove(key)
        self.finished.pop(key, None)
        self.live_started -= 1

    def requeue(self, group) -> bool:
        """A finished group too stale to train: regenerate it from its fresh prompt as a new start (at
        most ``max_requeues`` times per group; False: the caller drops it, counted)."""
        key = group_key(group)
        if key in self.order:
            self._discard(key)
        else:   # taken by pop: it leaves the live count all the same
            self.live_started -= 1
        if self.requeues[key] >= self.max_requeues:
            self.top_up()
            return False
        self.requeues[key] += 1
        self.stale_requeues += 1
        self.record(group, "requeued")
        self.to_start.append(self.data_source.fresh_group(key))
        self.top_up()
        return True

    def pop(self, limit: int) -> list:
        """Up to ``limit`` of the oldest live groups, in start order, as far as they have finished
        (an unfinished oldest group holds the batch: the caller waits for it)."""
        if self.failures:
            first = self.failures[0]
            if isinstance(first, AbortLoopError):
                raise first
            raise RuntimeError("rollout groups failed after retries: " + "; ".join(map(str, self.failures)))
        out = []
        while self.order and len(out) < limit and self.order[0] in self.finished:
            out.append(self.finished.pop(self.order.popleft()))
        if out:
            self.top_up()   # the cap (if any) has room again
        return out


def _metadata(sample) -> dict:
    metadata = getattr(sample, "metadata", None)
    if metadata is None:
        metadata = {}
        sample.metadata = metadata
    return metadata


def _get_stream(args, data_source) -> GroupStream:
    global _stream
    with _lock:
        if _stream is None:
            _stream = GroupStream(args, data_source, cap=getattr(args, "async_groups_in_flight", None))
        elif _stream.data_source is not data_source:
            raise RuntimeError("epic_slime.slime.rollout: one RolloutManager per process (a second data source appeared)")
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


async def _collect(args, stream: GroupStream, trainer_version: int, gate: StalenessGate, rollout_id: int):
    ledger = stream.data_source.ledger
    stream.start_rollout(trainer_version)
    groups = await collect_admitted_groups(
        stream.pop,
        trainer_version=trainer_version,
        gate=gate,
        target=args.rollout_batch_size,
        requeue=stream.requeue if gate.stale_policy == "drop" else None,
        on_drop=lambda group: (ledger.drop(group_key(group)), stream.record(group, "dropped")),
    )
    for group in groups:
        ledger.deliver(group_key(group), rollout_id)
        lag = int(group[0].metadata["epic_group_staleness"])
        stream.record(group, "over_k" if over_limit(lag, gate.max_staleness) else "trained", lag)
    # the driver asks for rollout r while r - 1 trains: rollouts <= r - 2 are trained by now
    ledger.close_rollout(rollout_id - 2)
    ledger.check(worker_in_flight=stream.held() + len(stream.data_source._returned))
    return groups, ledger.metrics(), stream.held()


def generate_rollout(args, rollout_id: int, data_source, evaluation: bool = False):
    from epic_slime.slime.push_mode import install_rollout_hook

    install_rollout_hook(args)   # --weight-push-mode in_place: a prefix-cache key per group (idempotent)
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
        raise ValueError("epic_slime.slime.rollout needs slime's global dataset (do not pass --disable-rollout-global-dataset)")
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
    logger.info("rollout %d: %s", rollout_id, {k: v for k, v in metrics.items() if "groups_at" not in k and "deciles/" not in k})
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
    for group in groups:
        ledger.deliver(group_key(group), rollout_id)
    ledger.close_rollout(rollout_id - 1)
    ledger.check(worker_in_flight=len(data_source._returned))
    metrics = dict(output.metrics or {})
    metrics |= gate.metrics(prefix=STALENESS_PREFIX)
    metrics[f"{STALENESS_PREFIX}trainer_version"] = float(trainer_version)
    metrics |= ledger.metrics()
    logger.info("rollout %d (synchronous): %d groups on policy version %d", rollout_id, len(groups), trainer_version)
    from epic_slime.slime.routing import stage_for_training

    return type(output)(samples=stage_for_training(args, groups, rollout_id), metrics=metrics)
