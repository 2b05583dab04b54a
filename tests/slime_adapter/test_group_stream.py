"""GroupStream (epic_slime.slime.stream.group_stream) driven through its ``generate_group`` seam: the real stream
on slime's global loop, with an injected engine and the data-source interface it uses (test_slime_stream.py
drives it through slime's generate_and_rm_group instead). The crash-retry bound at its edge, the first
steady rollout of the run's length-decile report, the cap while a requeued prompt waits to start, and a
taken group's exits: tests a fresh-eyes mutation pass showed missing (issue 35 item 6; each names its
mutant, of tests/mutation/mutants.yaml or fresh_pass.yaml). Then, through the real collector
(``rollout._collect``), every exit of a taken group and a regeneration's clean prompt with the project's
real ``StreamingDataSource`` over slime's (issue 46 patterns 3-4)."""

from __future__ import annotations

import argparse
import asyncio
import functools

import pytest

pytest.importorskip("slime.rollout.sglang_rollout", reason="slime is not importable (SLIME_PATH)")
from slime.utils.async_utils import run  # noqa: E402
from slime.utils.types import Sample  # noqa: E402

from epic_slime.slime import rollout  # noqa: E402

from epic_slime.slime.stream import group_stream  # noqa: E402
from epic_slime.slime.stream.checkpoint_marks import mark_model_complete  # noqa: E402
from epic_slime.slime.data_source import StreamingDataSource, group_key  # noqa: E402
from support.recording_engine import OneTokenEngine as Engine  # noqa: E402
from support.recording_engine import RecordingEngine, settle  # noqa: E402
from support.stream_data_source import DataSource  # noqa: E402


def _stream(engine, cap=None, **kw):
    values = dict(rollout_batch_size=2, max_staleness=3, n_samples_per_prompt=1, weight_push_mode="abort")
    args = argparse.Namespace(**(values | kw))
    return group_stream.GroupStream(args, DataSource(), cap=cap, sampling_params={}, generate_group=engine.generate)


_settle = functools.partial(settle, timeout=30.0, poll_s=0.002)


# mutant: stream_crash_retries_one_more
def test_a_group_that_always_raises_is_tried_exactly_max_group_attempts_times():
    engine = Engine(raises=lambda key, call: key == 0)
    stream = _stream(engine, cap=1)

    async def go():
        stream.start_rollout(1)
        await _settle(stream)

    run(go())
    assert engine.calls.count(0) == group_stream.MAX_GROUP_ATTEMPTS == 3
    assert stream.crash_retries == group_stream.MAX_GROUP_ATTEMPTS - 1
    with pytest.raises(RuntimeError, match="group 0: 3 attempts, last error ConnectionError"):
        stream.pop(2)


# mutant: stream_steady_deciles_one_rollout_early
@pytest.mark.parametrize("max_staleness, first_steady", [(1, 3), (2, 4), (None, 2)])
def test_the_runs_decile_report_starts_at_trainer_version_k_plus_2(max_staleness, first_steady):
    """Before trainer version K + 2 the budget is still filling up: those rollouts' groups stay out
    of the run's report (they are in the rollout's own)."""
    stream = _stream(Engine(), max_staleness=max_staleness)
    group = [Sample(index=0, group_index=0, response_length=5)]
    for version in range(1, first_steady + 2):
        stream.trainer_version = version
        stream.record(group, "trained", lag=0)
    assert len(stream.decile_records) == first_steady + 1
    assert len(stream.run_decile_records) == 2  # versions first_steady and first_steady + 1 only


# mutant: stream_cap_ignores_waiting_requeues
def test_a_requeued_prompt_waiting_to_start_counts_against_the_cap():
    """--async-groups-in-flight caps the groups held, the requeued prompts waiting to start included
    (the class docstring): none starts while they fill the cap."""
    engine = Engine()
    stream = _stream(engine, cap=4)  # the budget ((1 + 3) * 2 = 8) does not bind

    async def go():
        stream.start_rollout(1)
        await _settle(stream)
        assert sorted(engine.calls) == [0, 1, 2, 3]
        taken = stream.pop(2)  # frees two places: 4 and 5 start
        await _settle(stream)
        assert stream.requeue(taken[0])  # a taken group too stale to train: regenerated
        await _settle(stream)
        waiting_after_requeue = len(stream.to_start)
        stream.pop(1)  # group 2 taken: order 3 + 1 waiting = the cap
        await _settle(stream)
        return waiting_after_requeue

    waiting = run(go())
    assert waiting == 1
    assert len(stream.to_start) == 1 and stream.held() == 4  # the requeued prompt still waits
    assert engine.calls.count(0) == 1 and len(engine.calls) == 6


# mutant: gs_requeue_taken_not_released
def test_a_taken_group_leaves_the_taken_set_on_each_exit_and_is_accounted_once():
    """Issue 46, pattern 3: a group pop() handed to the collector is owed until it leaves: requeued (too
    stale, regenerated), dropped (requeue limit reached) or delivered. On each exit it leaves ``taken``,
    so ``accounted()`` (what the ledger check compares with its undelivered count) names it once, and a
    group handed back to the data source is named too."""
    engine = Engine()
    stream = _stream(engine, cap=4)

    async def go():
        stream.start_rollout(1)
        await _settle(stream)
        taken = stream.pop(3)
        keys = [group_stream.group_key(g) for g in taken]
        assert stream.taken == set(keys) and stream.accounted() == stream.held() + 3
        assert stream.requeue(taken[0])  # exit 1: requeued, a new start
        assert keys[0] not in stream.taken and stream.accounted() == stream.held() + 2
        stream.requeues[keys[1]] = stream.max_requeues
        assert not stream.requeue(taken[1])  # exit 2: dropped at the requeue limit
        assert keys[1] not in stream.taken and stream.accounted() == stream.held() + 1
        stream.release(taken[2])  # exit 3: delivered to its rollout
        assert stream.taken == set() and stream.accounted() == stream.held()
        await _settle(stream)
        handed_back = stream.pop(1)
        stream.release(handed_back[0])
        stream.data_source.add_samples([handed_back[0]])  # slime handed it back: still owed
        assert stream.accounted() == stream.held() + 1

    run(go())


# ---- every exit of a taken group, through the real collector (issue 46 pattern 3) ----
# ``rollout._collect``: pop, the staleness gate, requeue, drop, delivery, and its ledger check after each
# rollout. Counts are read from what the stream does, never from its private state: which groups the
# engine was asked to start (a slot that is not freed starts nothing; a slot freed twice starts one group
# too many) and ``room()``.


def _collector_stream(engine, data_source=None):
    """B = 2, K = 1, no cap: the admission budget alone bounds the groups started."""
    values = dict(rollout_batch_size=2, max_staleness=1, n_samples_per_prompt=1, weight_push_mode="abort")
    stream = group_stream.GroupStream(
        argparse.Namespace(**values),
        DataSource() if data_source is None else data_source,
        sampling_params={},
        generate_group=engine.generate,
    )
    stream.faults.retry_delay_s = stream.faults.behind_delay_s = 0.01
    return stream


def _versioned_stream(max_requeues: int, data_source=None):
    """The engine answers with the weight version the stream knows has landed."""
    box = {}
    engine = RecordingEngine(version=lambda key, call: str(box["stream"].engine_version))
    stream = box["stream"] = _collector_stream(engine, data_source=data_source)
    stream.max_requeues = max_requeues
    return engine, stream


def _collect(stream, trainer_version: int, rollout_id: int):
    """One rollout as slime's driver asks for it; the collector's own ledger check runs at its end."""
    gate = rollout.StalenessGate(stream.args.max_staleness, "drop")
    batch, metrics, _ = run(
        asyncio.wait_for(rollout._collect(stream.args, stream, trainer_version, gate, rollout_id), 20)
    )
    run(_settle(stream))  # let the groups it started settle, on slime's loop
    return [group_key(g) for g in batch], metrics, gate


def _started(engine) -> dict:
    return {key: engine.calls.count(key) for key in sorted(set(engine.calls))}


def _check(stream):
    stream.data_source.ledger.check(worker_in_flight=stream.accounted())


# mutants: taken_group_requeued_stays_taken, taken_group_requeued_keeps_its_live_slot
def test_taken_groups_the_collector_requeues_free_their_slot_once_and_start_again():
    engine, stream = _versioned_stream(max_requeues=3)
    # rollout 0 (trainer 1, engines at 1): (1 + 1) * 2 = 4 groups start; 0 and 1 train
    assert _collect(stream, 1, 0)[0] == [0, 1]
    assert _started(engine) == {0: 1, 1: 1, 2: 1, 3: 1}
    # a rollout at trainer 3 (engines at 2, room for 6): 4 and 5 start at 2; 2 and 3 (version 1, lag 2 > K)
    # are taken, requeued by the gate, and start again at version 2: each freed its slot, once
    batch, metrics, gate = _collect(stream, 3, 2)
    assert batch == [4, 5] and gate.requeued_groups == 2 and gate.dropped_groups == 0
    assert _started(engine) == {0: 1, 1: 1, 2: 2, 3: 2, 4: 1, 5: 1}, "a requeued group keeps (or frees twice) its slot"
    assert stream.room() == 0 and stream.taken == set() and metrics["rollout/accounting/dropped_groups"] == 0
    _check(stream)
    # the regenerations are the ones held: two left for the next batch, none lost or doubled
    assert stream.held() == 2 and stream.data_source.ledger.undelivered() == 2


# mutant: taken_group_requeued_keeps_its_live_slot (a taken group over its requeue limit frees its slot there too)
def test_taken_groups_the_collector_drops_free_their_slot_once_and_leave_the_ledger():
    engine, stream = _versioned_stream(max_requeues=1)
    _collect(stream, 1, 0)
    assert _collect(stream, 3, 2)[0] == [4, 5]  # 2 and 3 requeued once (their limit)
    # trainer 4 (engines at 3, room for 8): 6 and 7 start; 2 and 3 (version 2, lag 2) are taken and over
    # their requeue limit: dropped, counted, out of the ledger, and their slots start fresh prompts 8 and 9
    batch, metrics, gate = _collect(stream, 4, 3)
    assert batch == [6, 7] and gate.dropped_groups == 2 and gate.requeued_groups == 0
    assert metrics["rollout/accounting/dropped_groups"] == 2
    assert _started(engine) == {0: 1, 1: 1, 2: 2, 3: 2, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1}, (
        "a dropped group keeps (or frees twice) its slot"
    )
    assert stream.room() == 0 and stream.taken == set() and stream.held() == 2
    _check(stream)


def test_a_group_regenerated_after_a_failure_keeps_its_slot_and_is_delivered_once():
    """The other regeneration: a failed generate call retries the same group in its place (attempt 2), not
    as a new start: no slot is freed, no prompt is consumed again, and it is delivered once."""
    engine = RecordingEngine(raises=lambda key, call: key == 0 and call == 0)
    stream = _collector_stream(engine)
    batch, metrics, _ = _collect(stream, 1, 0)
    assert batch == [0, 1] and engine.calls.count(0) == 2 and stream.crash_retries == 1
    assert _started(engine) == {0: 2, 1: 1, 2: 1, 3: 1}, "a retried group must not open a slot"
    assert metrics["rollout/accounting/consumed_groups"] == 4
    _check(stream)


# ---- the real data source's regeneration (issue 46 pattern 4) ----


def _source(tmp_path, load=None) -> StreamingDataSource:
    args = argparse.Namespace(
        rollout_global_dataset=True,
        prompt_data=None,
        n_samples_per_prompt=1,
        buffer_filter_path=None,
        rollout_shuffle=False,
        save=str(tmp_path),
        load=load,
    )
    return StreamingDataSource(args)


# mutants: fresh_group_shares_the_stored_prompt, consumed_group_shared_with_the_ledger
def test_regenerating_a_group_twice_starts_each_time_from_the_clean_stored_prompt(tmp_path):
    """The real data source, groups requeued twice by the collector: each regeneration reaches the engine
    with no response (a shared stored prompt would carry the previous attempt's tokens), and a save made
    afterwards holds the clean prompt for a resumed run."""
    source = _source(tmp_path)
    engine, stream = _versioned_stream(max_requeues=3, data_source=source)
    assert _collect(stream, 1, 0)[0] == [0, 1]
    assert _collect(stream, 3, 2)[0] == [4, 5]  # 2 and 3 requeued (lag 2)
    assert _collect(stream, 4, 3)[0] == [6, 7]  # and again (their regenerations, version 2, lag 2)
    assert engine.lengths_given[2] == [0, 0, 0] and engine.lengths_given[3] == [0, 0, 0], engine.lengths_given
    stored = {group_key(g): g for g in source.ledger.pending_payloads()}
    assert stored[2][0].response_length == 0 and stored[2][0].weight_versions == []
    source.save(3)
    resumed = _source(tmp_path, load=str(tmp_path))
    mark_model_complete(str(tmp_path), 3)
    resumed.load(3)
    first = resumed.get_samples(1)[0]
    assert group_key(first) == 2 and first[0].response_length == 0 and first[0].weight_versions == []
