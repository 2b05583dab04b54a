"""GroupStream (epic_slime.slime.group_stream) driven through its ``generate_group`` seam: the real stream
on slime's global loop, with an injected engine and the data-source interface it uses (test_slime_stream.py
drives it through slime's generate_and_rm_group instead). The crash-retry bound at its edge, the first
steady rollout of the run's length-decile report, the cap while a requeued prompt waits to start, and a
taken group's exits: tests a fresh-eyes mutation pass showed missing (issue 35 item 6; each names its
mutant, of tests/mutation/mutants.yaml or fresh_pass.yaml)."""

from __future__ import annotations

import argparse
import asyncio

import pytest

pytest.importorskip("slime.rollout.sglang_rollout", reason="slime is not importable (SLIME_PATH)")
from slime.utils.async_utils import run  # noqa: E402
from slime.utils.types import Sample  # noqa: E402

from epic_slime.slime import group_stream  # noqa: E402
from support.stream_data_source import DataSource  # noqa: E402


class Engine:
    def __init__(self, raises=lambda key: False):
        self.calls: list[int] = []
        self.raises = raises

    async def generate(self, args, group, sampling_params, evaluation=False):
        key = group[0].group_index
        self.calls.append(key)
        await asyncio.sleep(0.001)
        if self.raises(key):
            raise ConnectionError(f"engine lost while generating group {key}")
        for sample in group:
            sample.append_response_tokens(
                argparse.Namespace(partial_rollout=False),
                tokens=[7],
                log_probs=[-0.1],
                meta_info={"weight_version": "1", "finish_reason": {"type": "stop"}},
            )
        return group


def _stream(engine, cap=None, **kw):
    values = dict(rollout_batch_size=2, max_staleness=3, n_samples_per_prompt=1, weight_push_mode="abort")
    args = argparse.Namespace(**(values | kw))
    return group_stream.GroupStream(args, DataSource(), cap=cap, sampling_params={}, generate_group=engine.generate)


async def _settle(stream):
    while stream.active:
        await asyncio.sleep(0.002)


# mutant: stream_crash_retries_one_more
def test_a_group_that_always_raises_is_tried_exactly_max_group_attempts_times():
    engine = Engine(raises=lambda key: key == 0)
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
