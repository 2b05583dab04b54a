"""Issue 35 item 5: the hand-back path. Groups that slime gives back through the data source's
``add_samples`` are served again by ``get_samples``, with the project's real ``StreamingDataSource``
over slime's real ``RolloutDataSourceWithBuffer``.

Where slime hands groups back (624b824a): its synchronous ``sglang_rollout.generate_rollout``
aborts the groups left over when the batch is full (more than one batch in flight with
``--over-sampling-batch-size``) and, with ``--partial-rollout``, returns them through
``add_samples``; the fully-async worker returns aborted groups the same way. No supported
configuration reaches it: K = 0 refuses ``--partial-rollout`` and every schedule refuses
``--over-sampling-batch-size``; the streaming schedule never calls slime's rollout. These tests
drive the path anyway, in the state where a slip shows:

- more groups handed back than one ``get_samples`` asks for (the stream asks for one at a time);
- handed back, then served across several rollouts of slime's own rollout and abort code;
- handed back while a save is made (a resume must regenerate each once, not twice);
- the accounting check while groups wait in the hand-back queue.

The slips they were tried on (each fails here): serving one group more than asked, ``<`` for
``<=`` in any of the three sources, the newest handed-back group first, handed-back groups counted
as consumed again, the rollout's ledger check ignoring the hand-back queue, a save that writes the
hand-back queue on top of the ledger.
"""

from __future__ import annotations

import argparse
import asyncio

import pytest

sglang_rollout = pytest.importorskip("slime.rollout.sglang_rollout", reason="slime is not importable (SLIME_PATH)")
from slime.utils.async_utils import run  # noqa: E402
from slime.utils.types import Sample  # noqa: E402

import epic_slime.slime.rollout as rollout  # noqa: E402
from epic_slime.slime.stream.checkpoint_marks import mark_model_complete  # noqa: E402
from epic_slime.slime.data_source import StreamingDataSource, group_key  # noqa: E402
from epic_slime.slime.cli.command_line import read_command_line  # noqa: E402
from epic_slime.slime.cli.dry_run import check_argv  # noqa: E402
from epic_slime.slime.cli.flags import ProjectFlagError  # noqa: E402
from epic_slime.slime.stream.group_stream import GroupStream  # noqa: E402
from epic_slime.slime.stream.gate import StalenessGate  # noqa: E402
from support.hand_back_engine import ENGINE, EngineHttp  # noqa: E402


def _source(tmp_path, n=1, load=None, **kw) -> StreamingDataSource:
    """The real data source (slime's inner one numbers empty prompts: no --prompt-data)."""
    args = argparse.Namespace(
        rollout_global_dataset=True,
        prompt_data=None,
        n_samples_per_prompt=n,
        buffer_filter_path=None,
        rollout_shuffle=False,
        save=str(tmp_path),
        load=load,
        **kw,
    )
    return StreamingDataSource(args)


def _keys(groups) -> list[int]:
    return [group_key(g) for g in groups]


# ---------------------------------------------------------------- get_samples after add_samples


def test_get_samples_serves_exactly_as_many_as_asked_handed_back_first_oldest_first(tmp_path):
    source = _source(tmp_path)
    out = source.get_samples(4)
    source.add_samples(out[:3])
    assert _keys(source.get_samples(1)) == [0]  # one asked, one served (the stream asks for one)
    assert _keys(source.get_samples(1)) == [1]  # the oldest handed back first
    assert _keys(source.get_samples(2)) == [2, 4]  # the last handed back, then a fresh prompt
    assert source.inner.sample_group_index == 5  # no prompt consumed that was not served
    source.add_samples([out[3]])
    assert _keys(source.get_samples(1)) == [3] and source.inner.sample_group_index == 5
    # exactly as many handed back as asked: no fresh prompt taken
    source.add_samples(source.get_samples(2))
    assert _keys(source.get_samples(2)) == [5, 6] and source.inner.sample_group_index == 7
    assert source.ledger.consumed == 7  # each prompt once, however often handed back
    assert source.ledger.metrics()["rollout/accounting/consumed_groups"] == 7.0


def test_a_save_with_groups_handed_back_resumes_each_once_and_a_later_hand_back_goes_first(tmp_path):
    source = _source(tmp_path)
    first = source.get_samples(5)
    for key in (0, 1):
        source.ledger.deliver(key, 0)
    source.add_samples([first[3], first[2]])  # 4 stays in flight (generating)
    source.save(0)  # rollout 0 (groups 0, 1) trained
    mark_model_complete(str(tmp_path), 0)
    resumed = _source(tmp_path, load=str(tmp_path))
    resumed.load(0)
    assert sorted(_keys(resumed._restored)) == [2, 3, 4]  # each untrained prompt once, none twice
    served = resumed.get_samples(1)
    assert _keys(served) == [2]
    resumed.add_samples(served)  # handed back right after the resume
    # the handed-back group, then the other restored ones, then fresh prompts: exactly as many as asked
    assert _keys(resumed.get_samples(2)) == [2, 3]
    assert _keys(resumed.get_samples(3)) == [4, 5, 6]
    assert resumed.ledger.consumed == 5 and resumed.inner.sample_group_index == 7


def test_restored_and_handed_back_groups_fill_one_call_without_an_extra_prompt(tmp_path):
    source = _source(tmp_path)
    first = source.get_samples(3)
    source._restored.extend([[Sample(group_index=10)], [Sample(group_index=11)]])  # a resumed run's
    source.add_samples([first[1]])
    assert _keys(source.get_samples(2)) == [1, 10]  # handed back, then restored: two asked, two served
    assert _keys(source.get_samples(1)) == [11]
    assert source.inner.sample_group_index == 3  # no fresh prompt yet
    assert _keys(source.get_samples(2)) == [3, 4]
    assert source.ledger.consumed == 7


def test_add_samples_refuses_a_group_it_never_handed_out_or_one_already_handed_back(tmp_path):
    source = _source(tmp_path)
    groups = source.get_samples(2)
    with pytest.raises(ValueError, match="group 7 was never handed out"):
        source.add_samples([[Sample(group_index=7)]])
    source.add_samples([groups[0]])
    with pytest.raises(ValueError, match="group 0 is already waiting to be handed out again"):
        source.add_samples([groups[0]])
    assert _keys(source.get_samples(3)) == [0, 2, 3]


# ---------------------------------------------------------------- slime's own rollout and abort


def _sync_args(tmp_path, port: int) -> argparse.Namespace:
    """What slime's synchronous rollout reads, with --partial-rollout and one batch of oversampling
    (B = 3, 5 groups submitted per rollout)."""
    return argparse.Namespace(
        rollout_global_dataset=True,
        prompt_data=None,
        buffer_filter_path=None,
        rollout_shuffle=False,
        save=str(tmp_path),
        load=None,
        rollout_batch_size=3,
        over_sampling_batch_size=5,
        n_samples_per_prompt=2,
        partial_rollout=True,
        mask_offpolicy_in_partial_rollout=False,
        max_staleness=0,
        stale_policy="drop",
        dynamic_sampling_filter_path=None,
        rollout_sample_filter_path=None,
        rollout_all_samples_process_path=None,
        custom_generate_function_path="support.hand_back_engine.generate",
        rollout_sample_hook_path=None,
        group_rm=False,
        sglang_enable_deterministic_inference=False,
        sglang_dp_size=None,
        sglang_server_concurrency=8,
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        use_distributed_post=False,
        sglang_router_ip="127.0.0.1",
        sglang_router_port=port,
        hf_checkpoint=None,
        rollout_temperature=1.0,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        rollout_max_response_len=8,
        rollout_stop=None,
        rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False,
        rollout_seed=1,
        use_rollout_routing_replay=False,
        weight_push_mode="abort",
    )


@pytest.fixture
def slime_sync(monkeypatch):
    """slime's GenerateState without a tokenizer (none here; the rollout never tokenizes with a
    custom generate function), its HTTP client, and a fresh singleton before and after."""
    from slime.utils import http_utils

    monkeypatch.setattr(sglang_rollout, "load_tokenizer", lambda *a, **k: None)
    monkeypatch.setattr(sglang_rollout, "load_processor", lambda *a, **k: None)
    monkeypatch.setattr(rollout, "_first_rollout_id", None)
    sglang_rollout.GenerateState.clear_instances()
    ENGINE.__init__()  # a fresh engine per test (calls and abort counts)
    with EngineHttp() as http:
        monkeypatch.setattr(http_utils, "_http_client", None)
        yield http
    sglang_rollout.GenerateState.clear_instances()


def test_groups_slime_aborts_and_hands_back_are_served_next_rollout_and_trained_once(tmp_path, slime_sync):
    from slime.utils.http_utils import init_http_client

    args = _sync_args(tmp_path, slime_sync.port)
    init_http_client(args)
    source = _source(tmp_path, n=2)
    source.args = args
    trained = []
    # each rollout submits 5 groups; the last two are still queued when the batch is full: slime
    # aborts them and hands them back (no token, no version), and the next rollout serves them first
    for rollout_id, slow in enumerate(({3, 4}, {6, 7}, {9, 10}, {12, 13})):
        ENGINE.next_rollout(version=rollout_id + 1, slow=slow)
        out = rollout.generate_rollout(args, rollout_id, source)  # K = 0: slime's own rollout, then the ledger check
        trained.append(_keys(out.samples))
        assert sorted(_keys(source._returned)) == sorted(slow)  # in the order slime's abort collected them
        assert ENGINE.abort_requests == rollout_id + 1
    assert trained == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    # 14 prompts consumed, each once: 12 delivered, the last two waiting to be handed out again
    assert source.inner.sample_group_index == 14 and source.ledger.consumed == 14
    metrics = source.ledger.metrics()
    assert metrics["rollout/accounting/consumed_groups"] == 14.0
    assert metrics["rollout/accounting/in_flight_groups"] == 2.0 + 3.0  # handed back + rollout 3 (not trained yet)
    assert sorted(ENGINE.calls.count(k) for k in (3, 4)) == [4, 4]  # 2 samples x (aborted, then finished)
    source.save(3)
    mark_model_complete(str(tmp_path), 3)
    resumed = _source(tmp_path, n=2, load=str(tmp_path))
    resumed.load(3)
    assert _keys(resumed.get_samples(5)) == [12, 13, 14, 15, 16]  # the handed-back two once, then fresh


def test_the_rollouts_ledger_check_counts_the_groups_waiting_to_be_handed_out(tmp_path, slime_sync):
    """After slime hands groups back, the check's 'worker holds' is the hand-back queue: a group
    aborted without --partial-rollout (slime discards it) fails the rollout, naming the loss."""
    from slime.utils.http_utils import init_http_client

    args = _sync_args(tmp_path, slime_sync.port)
    args.partial_rollout = False
    init_http_client(args)
    source = _source(tmp_path, n=2)
    source.args = args
    ENGINE.next_rollout(version=1, slow={3, 4})
    with pytest.raises(RuntimeError, match="holds 0 groups, the ledger 2 consumed and not yet delivered"):
        rollout.generate_rollout(args, 0, source)


# ---------------------------------------------------------------- the streaming schedule


def test_the_stream_takes_handed_back_groups_one_per_call_in_order_and_trains_each_once(tmp_path):
    """More groups handed back than the budget lets start: they wait in the hand-back queue across
    rollouts (the ledger check counts them) and each starts once, oldest first, before any fresh one."""
    source = _source(tmp_path)
    engine = {"version": 1, "calls": []}

    async def generate_group(args, group, sampling_params, evaluation=False):
        engine["calls"].append(group_key(group))
        await asyncio.sleep(0.001)
        for sample in group:
            sample.tokens = sample.tokens or [3]  # the prompt, as slime's generate sets it
            sample.append_response_tokens(
                argparse.Namespace(partial_rollout=False),
                tokens=[7],
                log_probs=[-0.1],
                meta_info={"weight_version": str(engine["version"]), "finish_reason": {"type": "stop"}},
            )
        return group

    source.add_samples(source.get_samples(6))  # slime's rollout took six and gave them all back
    args = argparse.Namespace(rollout_batch_size=2, max_staleness=1, n_samples_per_prompt=1, weight_push_mode="abort")
    stream = GroupStream(args, source, sampling_params={}, generate_group=generate_group)
    batches, waiting = [], []
    for rollout_id in range(4):
        trainer_version = rollout_id + 1
        engine["version"] = max(1, trainer_version - 1)
        gate = StalenessGate(1, "drop")
        batch, metrics, _ = run(asyncio.wait_for(rollout._collect(args, stream, trainer_version, gate, rollout_id), 20))
        batches.append(_keys(batch))
        waiting.append(source.handed_back())
    assert batches == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert waiting == [2, 2, 0, 0]  # the budget (2 batches ahead) held two back for two rollouts
    assert sorted(engine["calls"]) == list(range(8))  # each generated once
    assert source.ledger.consumed == 8 and source.inner.sample_group_index == 8
    assert metrics["rollout/accounting/consumed_groups"] == 8.0


# ---------------------------------------------------------------- the paths refused up front


BASE = [
    "--loss-type",
    "custom_loss",
    "--custom-loss-function-path",
    "epic_slime.slime.loss.policy_loss",
    "--rollout-function-path",
    "epic_slime.slime.rollout.generate_rollout",
    "--rollout-batch-size",
    "4",
    "--n-samples-per-prompt",
    "2",
]


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--over-sampling-batch-size", "8"], "--over-sampling-batch-size"),  # aborts: lost without it
        (["--dynamic-sampling-filter-path", "m.f"], "--dynamic-sampling-filter-path"),  # filtered groups: lost
        (["--rollout-all-samples-process-path", "m.f"], "--rollout-all-samples-process-path"),  # gets the data source
        (["--buffer-filter-path", "m.f"], "--buffer-filter-path"),  # picks the handed-back groups
    ],
)
def test_each_unsupported_hand_back_path_is_refused_naming_its_flag(extra, flag):
    with pytest.raises(ProjectFlagError) as info:
        read_command_line(BASE + extra)
    message = str(info.value)
    assert message.startswith(f"{flag} is not supported") and "\n" not in message


def test_partial_rollout_is_refused_where_slimes_rollout_would_hand_groups_back():
    """K = 0 runs slime's synchronous rollout, whose abort hands partial groups back."""
    with pytest.raises(ProjectFlagError, match="drop --partial-rollout$"):
        check_argv(BASE + ["--max-staleness", "0", "--partial-rollout"])
