"""The real GroupStream (epic_slime.slime.stream.group_stream) on slime's global event loop, with slime's
``generate_and_rm_group`` replaced by a fake engine: admission by the budget, batches in start
order, the optional cap, per-sample versions in both push modes, the abort-loop bound."""

from __future__ import annotations

import argparse
import asyncio
from types import SimpleNamespace

import pytest

sglang_rollout = pytest.importorskip("slime.rollout.sglang_rollout", reason="slime is not importable (SLIME_PATH)")
from slime.utils.async_utils import run  # noqa: E402
from slime.utils.types import Sample  # noqa: E402

import epic_slime.slime.stream.group_stream as group_stream  # noqa: E402
import epic_slime.slime.rollout as rollout  # noqa: E402
from epic_slime.slime.stream.gate import StalenessGate, sample_oldest_version  # noqa: E402
from epic_slime.slime.stream.ledger import GroupLedger  # noqa: E402


class DataSource:  # StreamingDataSource's interface for the stream: numbered prompts, a ledger
    def __init__(self):
        self.next, self.ledger = 0, GroupLedger()

    def handed_back(self):  # nothing is given back through add_samples here
        return 0

    def get_samples(self, n):
        groups = [[Sample(index=i, group_index=i, tokens=[1, 2])] for i in range(self.next, self.next + n)]
        for g in groups:
            self.ledger.consume(g[0].group_index, [Sample(index=i, group_index=i, tokens=[1, 2]) for i in [g[0].index]])
        self.next += n
        return groups

    def fresh_group(self, key):
        return [Sample(index=key, group_index=key, tokens=[1, 2])]


class Engine:
    """Answers each group after its gate opens; reports ``version`` (a push changes it)."""

    def __init__(self, slow=lambda key: False):
        self.version, self.started, self.slow = 1, [], slow
        self.release = asyncio.Event()
        self.abort_next: set = set()

    async def generate(self, args, group, sampling_params, evaluation=False):
        key = group[0].group_index
        self.started.append(key)
        await asyncio.sleep(0.001)
        if self.slow(key):
            await self.release.wait()
        mode = "abort" if key in self.abort_next else "stop"
        for sample in group:
            sample.append_response_tokens(
                argparse.Namespace(partial_rollout=False),
                tokens=[7, 8],
                log_probs=[-0.1, -0.2],
                meta_info={"weight_version": str(self.version), "finish_reason": {"type": mode}},
            )
        return group


@pytest.fixture
def engine(monkeypatch):
    monkeypatch.setattr(sglang_rollout, "GenerateState", lambda args: SimpleNamespace(sampling_params={}))
    made = Engine()
    monkeypatch.setattr(sglang_rollout, "generate_and_rm_group", made.generate)
    return made


def _args(**kw):
    values = dict(rollout_batch_size=4, max_staleness=2, n_samples_per_prompt=1, weight_push_mode="abort")
    return SimpleNamespace(**(values | kw))


def _collect(args, stream, trainer_version, rollout_id):
    gate = StalenessGate(args.max_staleness, "drop")
    batch, _, held = run(asyncio.wait_for(rollout._collect(args, stream, trainer_version, gate, rollout_id), 20))
    return [g[0].group_index for g in batch], held, gate


def test_stream_starts_by_the_budget_and_takes_batches_in_start_order(engine):
    engine.slow = lambda key: key == 0  # the oldest group is the slowest: the batch waits for it
    args, data = _args(), DataSource()
    stream = group_stream.GroupStream(args, data)
    stream.loop.call_soon_threadsafe(lambda: stream.loop.call_later(0.3, engine.release.set))
    # rollout 0 (trainer version 1, engines at 1): (1 + 2) * 4 = 12 groups start at once
    batch, held, gate = _collect(args, stream, 1, 0)
    assert batch == [0, 1, 2, 3] and len(engine.started) == 12 and held == 8
    # rollout 1 (trainer version 2): the push of rollout 0 has not landed (engines at 1): no new start
    batch, held, _ = _collect(args, stream, 2, 1)
    assert batch == [4, 5, 6, 7] and len(engine.started) == 12 and held == 4
    # rollout 2: engines at 2, one more batch of room
    engine.version = 2
    batch, held, gate = _collect(args, stream, 3, 2)
    assert batch == [8, 9, 10, 11] and len(engine.started) == 16 and held == 4
    assert gate.dropped_groups == gate.requeued_groups == 0 and gate.histogram == {2: 4}
    assert stream.budget.live == 16


def test_k_one_holds_one_batch_ahead_and_trains_at_lag_at_most_one(engine):
    args, data = _args(max_staleness=1), DataSource()
    stream = group_stream.GroupStream(args, data)
    lags = []
    for rollout_id in range(4):
        engine.version = max(1, rollout_id)  # the push of rollout r - 2 landed before generate(r)
        batch, held, gate = _collect(args, stream, rollout_id + 1, rollout_id)
        assert batch == list(range(4 * rollout_id, 4 * rollout_id + 4))
        lags += list(gate.histogram.elements())
        assert held <= 4
    assert max(lags) == 1 and gate.dropped_groups == 0


def test_a_group_too_stale_to_requeue_is_dropped_final_released_and_recorded(engine):
    """``GroupStream.drop``, the gate's on_drop: 8 finished groups generated at version 1 are 3 stale at
    trainer version 4 (K = 2) and may not be requeued (max_requeues 0): each is final in the ledger,
    no longer taken, recorded as dropped, and its budget slot is free (the accounting check passes)."""
    args, data = _args(), DataSource()
    stream = group_stream.GroupStream(args, data, max_requeues=0)
    batch, held, _ = _collect(args, stream, 1, 0)
    assert batch == [0, 1, 2, 3] and held == 8
    engine.version = 3
    batch, held, gate = _collect(args, stream, 4, 3)
    assert batch == [12, 13, 14, 15] and gate.dropped_groups == 8 and gate.requeued_groups == 0
    assert data.ledger.dropped == 8 and stream.taken == set()
    assert [outcome for _, _, outcome in stream.decile_records].count("dropped") == 8
    # 12 started first, 8 when the engines reached 3, 8 more in the dropped groups' freed slots:
    # live 20 = the limit (3 + 2) * 4, and the 12 not yet taken are held
    assert stream.budget.state() == {"started": 28, "discarded": 8} and stream.budget.room(3) == 0
    assert held == 12 and len(engine.started) == 28


def test_the_cap_limits_groups_held_on_top_of_the_budget(engine):
    args, data = _args(async_groups_in_flight=6), DataSource()
    stream = group_stream.GroupStream(args, data, cap=args.async_groups_in_flight)
    batch, held, _ = _collect(args, stream, 1, 0)
    # 6 started; taking the batch frees 4 places: 4 more start (budget 12 still allows them)
    assert batch == [0, 1, 2, 3] and len(engine.started) == 10 and held == 6


def test_unbounded_staleness_defaults_the_cap_to_one_batch(engine):
    args, data = _args(max_staleness=None), DataSource()
    stream = group_stream.GroupStream(args, data)
    assert stream.cap == 4
    batch, held, _ = _collect(args, stream, 1, 0)
    assert batch == [0, 1, 2, 3] and held == 4 and len(engine.started) == 8


def test_abort_mode_records_each_calls_version_per_token(engine, monkeypatch):
    """Group 0 is aborted by a push after 2 tokens at version 1, resubmitted, and finishes with 2
    more at version 2: its tokens carry [[1, 2], [2, 2]], oldest 1, newest 2, and it stays first."""
    args, data = _args(), DataSource()
    stream = group_stream.GroupStream(args, data)
    engine.abort_next = {0}
    original = engine.generate

    async def generate(args_, group, sampling_params, evaluation=False):
        out = await original(args_, group, sampling_params, evaluation)
        if group[0].group_index == 0 and engine.abort_next:
            engine.abort_next, engine.version = set(), 2  # the push lands after the abort
        return out

    monkeypatch.setattr(sglang_rollout, "generate_and_rm_group", generate)
    gate = StalenessGate(args.max_staleness, "drop")
    # asked as the second rollout (trainer version 2, engines at 1), so answers at version 2 may train
    batch, _, _ = run(asyncio.wait_for(rollout._collect(args, stream, 2, gate, 1), 20))
    assert [g[0].group_index for g in batch] == [0, 1, 2, 3]
    first = batch[0][0]
    assert first.metadata["token_version_spans"] == [[1, 2], [2, 2]]
    assert first.metadata["oldest_weight_version"] == 1 and first.metadata["newest_weight_version"] == 2
    assert first.metadata["epic_policy_version"] == 1  # the gate counted from the oldest
    assert stream.abort_resubmits == 1


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_held_requests_count_staleness_from_the_version_known_at_submission(engine, mode):
    """SGLang reports only the final version in place and after a retraction: a group submitted at
    version 1 that answers after the push to 3 is as old as 1 (not 3), so at trainer version 4 its lag
    is 3 > K = 2."""
    args, data = _args(weight_push_mode=mode), DataSource()
    stream = group_stream.GroupStream(args, data)
    engine.version = 3  # the engines answered after pushes the stream had not been told of
    group = data.get_samples(1)[0]
    stream.order.append(0)
    stream.budget.start()
    run(_submit_and_wait(stream, group))
    sample = stream.finished[0][0]
    assert sample.weight_versions == ["3"]
    assert sample.metadata["oldest_weight_version"] == 1 and sample.metadata["newest_weight_version"] == 3
    assert "token_version_spans" not in sample.metadata
    assert sample_oldest_version(sample) == 1


async def _submit_and_wait(stream, group):
    stream.cap = 1  # nothing else starts
    stream._submit(group, attempt=1)
    while stream.active:
        await asyncio.sleep(0.001)


def test_a_group_aborted_again_and_again_fails_with_its_key_and_count(engine):
    args, data = _args(rollout_batch_size=1, max_staleness=1), DataSource()
    stream = group_stream.GroupStream(args, data, cap=1)
    engine.abort_next = {0}
    with pytest.raises(group_stream.AbortLoopError, match="group 0 was aborted 16 times in a row") as caught:
        _collect(args, stream, 1, 0)
    assert caught.value.group == 0 and caught.value.aborts == group_stream.MAX_CONSECUTIVE_ABORTS
    assert stream.abort_resubmits == group_stream.MAX_CONSECUTIVE_ABORTS - 1


def test_the_abort_limit_leaves_room_for_the_k_plus_1_pushes_a_group_may_meet(engine):
    """Under the budget a group meets at most K + 1 pushes: at K = 16 the limit is 18, not 16 (the
    simulator's K = 16 plan failed groups aborted 16 times that the budget still allowed)."""
    assert [group_stream.abort_limit(k) for k in (None, 0, 14, 15, 16)] == [16, 16, 16, 17, 18]
    args, data = _args(rollout_batch_size=1, max_staleness=16), DataSource()
    stream = group_stream.GroupStream(args, data, cap=1)
    engine.abort_next = {0}
    with pytest.raises(group_stream.AbortLoopError, match="aborted 18 times in a row [(]limit 18[)]") as caught:
        _collect(args, stream, 1, 0)
    assert caught.value.aborts == 18 and stream.abort_resubmits == 17


def test_an_abort_then_a_finish_resets_the_count(engine, monkeypatch):
    args, data = _args(rollout_batch_size=1, max_staleness=1), DataSource()
    stream = group_stream.GroupStream(args, data, cap=1)
    calls = {"n": 0}
    original = engine.generate

    async def generate(args_, group, sampling_params, evaluation=False):
        calls["n"] += 1
        engine.abort_next = {group[0].group_index} if calls["n"] % 10 else set()  # 9 aborts, then a finish
        return await original(args_, group, sampling_params, evaluation)

    monkeypatch.setattr(sglang_rollout, "generate_and_rm_group", generate)
    for rollout_id in range(2):
        batch, _, _ = _collect(args, stream, rollout_id + 1, rollout_id)
        assert batch == [rollout_id]
    assert stream.abort_resubmits == 18 and not stream.aborts


class RetractingEngine:
    """SGLang under a retract pause, as tests/slime_adapter/test_real_sglang_retract.py saw it: the request
    samples ``before`` tokens on the old version, the push lands (retracted, prefilled again), it samples
    the rest on the new one; one answer, finish_reason stop, the final version and num_retractions."""

    def __init__(self, old, new, before, after):
        self.old, self.new, self.before, self.after = old, new, before, after

    async def generate(self, args, group, sampling_params, evaluation=False):
        await asyncio.sleep(0.001)
        for sample in group:
            tokens = [7] * (self.before + self.after)
            sample.append_response_tokens(
                argparse.Namespace(partial_rollout=False),
                tokens=tokens,
                log_probs=[-0.1] * len(tokens),
                meta_info={
                    "weight_version": str(self.new if self.before else self.old),
                    "num_retractions": int(self.before > 0),
                    "finish_reason": {"type": "stop"},
                },
            )
        return group


@pytest.mark.parametrize(
    "submitted, before, oldest, lag, outcome",
    [
        (1, 3, 1, 3, "dropped"),  # tokens sampled on version 1, finished on 3: trained at 4 it is 3 old (> K = 2)
        (2, 3, 2, 2, "kept"),  # submitted when version 2 had landed: at most K = 2 old, trained
        (3, 0, 3, 1, "kept"),  # never retracted (no token before the push): reported version 3 itself
    ],
)
def test_retract_samples_carry_the_version_their_first_tokens_were_sampled_with(
    engine, monkeypatch, submitted, before, oldest, lag, outcome
):
    """Under retract a sample is one answer (no resubmission, no spans) whose reported version is the
    newest; the gate counts its lag from the version known at submission."""
    fake = RetractingEngine(old=submitted, new=3, before=before, after=2)
    monkeypatch.setattr(sglang_rollout, "generate_and_rm_group", fake.generate)
    args, data = _args(weight_push_mode="retract"), DataSource()
    stream = group_stream.GroupStream(args, data, engine_version=submitted)
    group = data.get_samples(1)[0]
    stream.order.append(0)
    stream.budget.start()
    run(_submit_and_wait(stream, group))
    (sample,) = stream.finished[0]
    assert sample.status == Sample.Status.COMPLETED and stream.abort_resubmits == 0
    assert sample.metadata["oldest_weight_version"] == oldest and sample.metadata["newest_weight_version"] == 3
    assert "token_version_spans" not in sample.metadata
    assert 4 - sample_oldest_version(sample) == lag  # at trainer version 4
    gate = StalenessGate(args.max_staleness, "drop")
    assert gate.admit(4 - sample_oldest_version(sample), 1) == (outcome == "kept")


def _two_turn_generate(engine, mask_kept=True):
    """A retool-shaped call: a model turn at the engine's version, a push, tool output (loss mask 0), a
    second model turn at the new version, all inside one generate call."""

    async def generate(args, group, sampling_params, evaluation=False):
        for sample in group:
            meta = {"weight_version": str(engine.version), "finish_reason": {"type": "stop"}}
            sample.append_response_tokens(args, tokens=[7, 8, 9], log_probs=[-0.1] * 3, meta_info=meta)
            engine.version += 1  # a push lands between the turns
            sample.append_response_tokens(args, tokens=[5, 5], trainable=False)
            meta = {"weight_version": str(engine.version), "finish_reason": {"type": "stop"}}
            sample.append_response_tokens(args, tokens=[7, 8], log_probs=[-0.2] * 2, meta_info=meta)
            if not mask_kept:
                sample.loss_mask = None  # a generate function that fills no mask: nothing to split the turns by
        return group

    return generate


def test_a_multi_turn_call_carries_each_turns_version_per_token(engine):
    """Turn 1 (3 tokens) at version 1, tool output (2), turn 2 (2 tokens) at version 2, one call: the
    spans are [[1, 5], [2, 2]] (the tool tokens go with the turn they answer), not the call's last
    version for all seven; the oldest is 1."""
    args, data = _args(), DataSource()
    stream = group_stream.GroupStream(args, data, generate_group=_two_turn_generate(engine))
    group = data.get_samples(1)[0]
    stream.order.append(0)
    stream.budget.start()
    run(_submit_and_wait(stream, group))
    sample = stream.finished[0][0]
    assert sample.weight_versions == ["1", "2"]
    assert sample.metadata["token_version_spans"] == [[1, 5], [2, 2]]
    assert sample.metadata["oldest_weight_version"] == 1 and sample.metadata["newest_weight_version"] == 2
    assert stream.coarse_version_calls == 0


def test_a_multi_turn_call_without_a_mask_gives_its_tokens_the_oldest_version_and_counts_it(engine):
    """Without a loss mask the turns cannot be told apart: all seven tokens carry the call's oldest
    version (never newer than the truth) and the call is counted."""
    args, data = _args(), DataSource()
    stream = group_stream.GroupStream(args, data, generate_group=_two_turn_generate(engine, mask_kept=False))
    group = data.get_samples(1)[0]
    stream.order.append(0)
    stream.budget.start()
    run(_submit_and_wait(stream, group))
    sample = stream.finished[0][0]
    assert sample.metadata["token_version_spans"] == [[1, 7]]
    assert stream.coarse_version_calls == 1
