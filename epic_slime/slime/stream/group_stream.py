"""``GroupStream``: consumed groups kept generating across weight pushes, admitted by the staleness
budget and taken in start order (the asynchronous schedule's rollout, ``epic_slime.slime.rollout``).

Its event loop and its generate call are passed in: slime's global loop and slime's own
``generate_and_rm_group`` by default (what a cluster run uses), a simulated loop and engine in
``bench/schedsim``. A group whose generation raises, or that an engine behind the current weights
answered, is regenerated from its fresh prompt as ``epic_slime.slime.stream.engine_faults`` decides (with and
without ``--use-fault-tolerance``; counted in ``rollout/faults/*``); a group that SGLang aborted (a weight push pauses
generation in SGLang's abort mode) is resubmitted as prompt plus partial response, which SGLang
recomputes on the new weights (its samples carry both weight versions; the oldest sets the staleness;
a call aborted before its first token adds none). A group aborted ``MAX_CONSECUTIVE_ABORTS`` times in
a row ends the run (``AbortLoopError``).

slime is imported lazily: this module runs inside slime's RolloutManager actor.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque

from epic_slime.slime.data_source import StreamingDataSource, group_key
from epic_slime.slime.stream.engine_faults import MAX_GROUP_ATTEMPTS, EngineFailedError, EngineFaults
from epic_slime.admission import AdmissionBudget
from epic_slime.slime.stream.gate import parse_weight_version, sample_oldest_version
from epic_slime.slime.stream.version_spans import call_version_spans

logger = logging.getLogger(__name__)

__all__ = ["MAX_GROUP_ATTEMPTS", "AbortLoopError", "GroupStream", "abort_limit"]
# A group aborted this many times in a row (each abort resubmits its partial response) fails the
# run with AbortLoopError: under the admission budget a group meets at most K + 1 pushes, so the
# limit is this or K + 2, whichever is larger (``abort_limit``; at K = 16 a long group legitimately
# meets 17 pushes, which a fixed 16 took for an engine that aborts everything).
MAX_CONSECUTIVE_ABORTS = 16


def abort_limit(max_staleness: int | None) -> int:
    """Consecutive aborts that fail a group: MAX_CONSECUTIVE_ABORTS, or K + 2 above it."""
    return max(MAX_CONSECUTIVE_ABORTS, (max_staleness or 0) + 2)


# A group too stale to train is regenerated from its prompt at most this many times, then dropped
# (counted): only a group overtaken again and again (a response far longer than the rest) gets there.
MAX_STALE_REQUEUES = 3


class AbortLoopError(RuntimeError):
    """One group was aborted (and resubmitted) ``aborts`` times in a row without finishing: an
    engine that aborts everything it is given (a pause never continued, a crashing scheduler)
    would otherwise resubmit it forever."""

    def __init__(self, group: int, aborts: int, limit: int = MAX_CONSECUTIVE_ABORTS):
        self.group, self.aborts = group, aborts
        super().__init__(
            f"rollout group {group} was aborted {aborts} times in a row (limit {limit}): "
            "the engines abort every request (a /pause_generation never continued?)"
        )


class GroupStream:
    """Keeps consumed groups generating (or finished, not yet taken) on one event loop (slime's global
    loop unless ``loop`` is passed).

    Admission (``epic_slime.admission.AdmissionBudget``, AReaL's rule in groups): a group STARTS
    only while the live groups number fewer than (g + K) * B, g = the engine weight version the
    stream knows has landed, K = ``--max-staleness``, B = ``--rollout-batch-size``; the budget counts
    the groups started since the run's first rollout and not discarded (a requeued or dropped group
    leaves the count; its regeneration is a new start at the end of the order). The stream tops up on every
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
    call's tokens carry the version it reported; a multi-turn call's turns each theirs, version_spans.py).
    In place (``--weight-push-mode in_place``) a
    request decodes across the push and SGLang reports only the final version; under ``retract`` a
    request running at the push keeps the tokens it sampled on the old weights, is prefilled again and
    finishes on the new ones, and SGLang again reports only the final version (and a retraction count
    slime's ``Sample`` does not keep). In both, the oldest is the version the stream knew when it first
    submitted the group (a lower bound: the version its first token was sampled with is no older) and
    there are no spans. Staleness counts from the oldest.

    Injected (each None: slime's own, what a cluster run uses): ``loop``, the event loop the stream
    runs on (slime's global loop); ``sampling_params``, the training sampling parameters (slime's
    ``GenerateState``, created on that loop, which its semaphore binds to); ``generate_group``, the
    coroutine function that generates one group (slime's ``generate_and_rm_group``, looked up at each
    call). The schedule simulator passes its simulated loop and engine.

    Every method except ``__init__`` runs on that loop."""

    def __init__(
        self,
        args,
        data_source: StreamingDataSource,
        cap: int | None = None,
        max_requeues: int = MAX_STALE_REQUEUES,
        engine_version: int = 1,
        *,
        loop=None,
        sampling_params: dict | None = None,
        generate_group=None,
    ):
        from epic_slime.slime.push_mode import HOLDING_PUSH_MODES

        self.args = args
        self.data_source = data_source
        self.budget = AdmissionBudget(args.rollout_batch_size, getattr(args, "max_staleness", None))
        if cap is None and self.budget.max_staleness is None:
            cap = args.rollout_batch_size
        self.cap = cap
        # in_place / retract: a request is held across a push and reports only its last version
        self.held_across_push = getattr(args, "weight_push_mode", None) in HOLDING_PUSH_MODES
        self.max_requeues = max_requeues
        self.engine_version = engine_version
        self.generate_group = generate_group
        self.active: dict = {}  # task -> (group key, attempt, per sample (response length, versions) before)
        self.order: deque = deque()  # keys of the live, untaken groups in start order
        self.finished: dict = {}  # key -> finished group, not yet taken
        self.taken: set = set()  # keys popped for the rollout being collected, not yet delivered or dropped
        self.to_start: deque = deque()  # fresh groups of requeued prompts, started first when room opens
        self.requeues: Counter = Counter()  # group key -> times regenerated for staleness
        self.aborts: Counter = Counter()  # group key -> consecutive aborts of its current attempt
        self.crash_retries = 0
        self.abort_resubmits = 0
        self.stale_requeues = 0
        self.empty_call_versions = 0
        self.coarse_version_calls = 0  # multi-turn calls whose tokens took the call's oldest version (version_spans.py)
        self.failures: list = []
        self.faults = EngineFaults(args)  # engine death, hang, restart (engine_faults.py)
        self.trainer_version = 1
        # (mean response length, lag, outcome) per group decision: this rollout's, and the run's in
        # steady state (from trainer version K + 2 on: before it the budget is still filling up)
        self.decile_records: list = []
        self.run_decile_records: list = []
        if loop is None:
            from slime.utils.async_utils import get_async_loop

            loop = get_async_loop().loop
        self.loop = loop
        if sampling_params is None:
            sampling_params = asyncio.run_coroutine_threadsafe(self._slime_sampling_params(), loop).result()
        self.sampling_params = sampling_params

    async def _slime_sampling_params(self) -> dict:
        from slime.rollout.sglang_rollout import GenerateState

        return GenerateState(self.args).sampling_params  # created on the loop that will use its semaphore

    @property
    def completed(self) -> list:
        """Finished groups not yet taken, in start order."""
        return [self.finished[k] for k in self.order if k in self.finished]

    def held(self) -> int:
        """Consumed groups the stream holds: generating, finished and not taken, or waiting to start."""
        return len(self.order) + len(self.to_start)

    def accounted(self) -> int:
        """Consumed, undelivered groups this worker can name: held, taken by the rollout being collected
        (a failure may end it before delivery: they are still owed), or handed back to the data source.
        What ``GroupLedger.check`` compares with its undelivered count."""
        return self.held() + len(self.taken) + self.data_source.handed_back()

    def release(self, group) -> None:
        """A taken group left the collector: delivered to its rollout, dropped, or requeued."""
        self.taken.discard(group_key(group))

    def room(self) -> int:
        room = self.budget.room(self.engine_version)
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
            self.budget.start()
            self.order.append(group_key(group))
            self._submit(group, attempt=1)

    def _submit(self, group, attempt: int) -> None:
        generate_group = self.generate_group
        if generate_group is None:
            from slime.rollout.sglang_rollout import generate_and_rm_group as generate_group

        for sample in group:  # the version known at the first submission of this attempt
            metadata = _metadata(sample)
            metadata.setdefault("epic_submitted_version", self.engine_version)
            metadata["epic_call_version"] = self.engine_version  # this call's: the behind-version guard
            if not self.held_across_push:
                metadata.setdefault("token_version_spans", [])
        before = [(s.response_length, len(s.weight_versions)) for s in group]
        task = asyncio.ensure_future(
            generate_group(self.args, group, sampling_params=self.sampling_params.copy(), evaluation=False)
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
        oldest and newest version (in place and retract: the oldest is the version known at submission)."""
        for sample, (length, versions) in zip(group, before, strict=True):
            metadata = _metadata(sample)
            new_tokens = sample.response_length - length
            if not self.held_across_push and new_tokens > 0 and len(sample.weight_versions) > versions:
                reported = [parse_weight_version(v) for v in sample.weight_versions[versions:]]
                mask = getattr(sample, "loss_mask", None)
                spans, exact = call_version_spans(mask[length:] if mask is not None else None, new_tokens, reported)
                metadata["token_version_spans"].extend(spans)
                self.coarse_version_calls += not exact
            if finished and sample.weight_versions:
                reported = [parse_weight_version(v) for v in sample.weight_versions]
                oldest = min(reported)
                if self.held_across_push:
                    oldest = min(oldest, metadata["epic_submitted_version"])
                metadata["oldest_weight_version"] = oldest
                metadata["newest_weight_version"] = max(reported)

    def _on_done(self, task) -> None:
        from slime.utils.types import Sample

        key, attempt, before = self.active.pop(task)
        try:
            group = task.result()
        except Exception as exc:  # noqa: BLE001 - any failure: regenerate the prompt, never drop it
            self.aborts.pop(key, None)
            # engine_faults decides (it may wait or probe the engines): held in `active` meanwhile
            self._hold_active(self._after_failure(key, attempt, exc), key, attempt, before)
            return
        from epic_slime.slime.routing import finish_group_routing, remember_partial_routing

        self._forget_empty_calls(group, before)
        if self._answered_behind(key, attempt, group, before):
            return
        aborted = any(getattr(s, "status", None) == Sample.Status.ABORTED for s in group)
        self._record_versions(group, before, finished=not aborted)
        if aborted:
            self.aborts[key] += 1
            limit = abort_limit(self.budget.max_staleness)
            if self.aborts[key] >= limit:
                self.failures.append(AbortLoopError(key, self.aborts[key], limit))
                logger.error("rollout group %d aborted %d times in a row", key, self.aborts[key])
                return
            self.abort_resubmits += 1
            remember_partial_routing(group)  # R3: the rows of the tokens sampled before the push
            self._submit(group, attempt)  # prompt + partial response, continued on the new weights
            return
        self.aborts.pop(key, None)
        self.faults.succeeded(key)
        finish_group_routing(self.args, group)
        self.finished[key] = group
        self.top_up()

    async def _after_failure(self, key, attempt: int, exc: BaseException) -> None:
        error = await self.faults.after_failure(key, attempt, exc)
        if error is not None:
            self.failures.append(error)
            logger.error("rollout group %d failed (attempt %d): %s", key, attempt, error)
            return
        self.crash_retries += 1
        logger.warning(
            "rollout group %d raised %r; regenerating it from its prompt (attempt %d)", key, exc, attempt + 1
        )
        # keeps its place in the start order: it restarts at a version >= the one it was admitted at
        self._submit(self.data_source.fresh_group(key), attempt + 1)

    def _answered_behind(self, key, attempt: int, group, before) -> bool:
        """An engine behind the weights every healthy engine holds answered (engine_faults): its tokens
        are never trained; the group is regenerated from its prompt, keeping its place and attempt."""
        submitted = _metadata(group[0]).get("epic_call_version", self.engine_version)
        reported = self.faults.behind_version(group, before, submitted)
        if reported is None:
            return False
        self.aborts.pop(key, None)
        error = self.faults.behind_error(key, reported, submitted)
        if error is not None:
            self.failures.append(error)
            return True

        async def later():
            await asyncio.sleep(self.faults.behind_delay_s)
            self._submit(self.data_source.fresh_group(key), attempt)

        self._hold_active(later(), key, attempt, [])
        return True

    def _hold_active(self, coro, key, attempt: int, before) -> None:
        """Run ``coro`` (a fault decision or a delayed resubmission) as one of the group's ``active`` tasks
        until it ends, so the group counts as in flight meanwhile."""
        handler = asyncio.ensure_future(coro)
        self.active[handler] = (key, attempt, before)
        handler.add_done_callback(lambda done: self.active.pop(done, None))

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
        self.budget.discard()

    def requeue(self, group) -> bool:
        """A finished group too stale to train: regenerate it from its fresh prompt as a new start (at
        most ``max_requeues`` times per group; False: the caller drops it, counted)."""
        key = group_key(group)
        if key in self.order:
            self._discard(key)
        else:  # taken by pop: it leaves the live count all the same
            self.release(group)
            self.budget.discard()
        if self.requeues[key] >= self.max_requeues:
            self.top_up()
            return False
        self.requeues[key] += 1
        self.stale_requeues += 1
        self.record(group, "requeued")
        self.to_start.append(self.data_source.fresh_group(key))
        self.top_up()
        return True

    def drop(self, group) -> None:
        """A taken group the staleness gate dropped: final in the ledger, released, recorded."""
        self.data_source.ledger.drop(group_key(group))
        self.release(group)
        self.record(group, "dropped")

    def pop(self, limit: int) -> list:
        """Up to ``limit`` of the oldest live groups, in start order, as far as they have finished
        (an unfinished oldest group holds the batch: the caller waits for it)."""
        if self.failures:
            first = self.failures[0]
            if isinstance(first, (AbortLoopError, EngineFailedError)):
                raise first  # its own one line (EngineFailedError: the engine and the checkpoint to resume from)
            raise RuntimeError("rollout groups failed after retries: " + "; ".join(map(str, self.failures)))
        out = []
        while self.order and len(out) < limit and self.order[0] in self.finished:
            key = self.order.popleft()
            self.taken.add(key)
            out.append(self.finished.pop(key))
        if out:
            self.top_up()  # the cap (if any) has room again
        return out


def _metadata(sample) -> dict:
    metadata = getattr(sample, "metadata", None)
    if metadata is None:
        metadata = {}
        sample.metadata = metadata
    return metadata
