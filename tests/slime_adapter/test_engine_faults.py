"""GroupStream's engine-fault rules (``epic_slime.slime.stream.engine_faults``, issue 35 items 1-2) on slime's
global loop with an injected engine: the behind-version guard at its boundary, the fault-tolerance
deadline, and the one-line error without fault tolerance that names the dead engine and the checkpoint.
The same rules against real engines: ``test_engine_faults_real.py``."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import time

import pytest

pytest.importorskip("slime.rollout.sglang_rollout", reason="slime is not importable (SLIME_PATH)")
from slime.utils.async_utils import run  # noqa: E402

from epic_slime.slime.stream import engine_faults, group_stream  # noqa: E402
from support.recording_engine import OneTokenEngine as Engine  # noqa: E402
from support.recording_engine import settle  # noqa: E402
from support.stream_data_source import DataSource  # noqa: E402


def _stream(engine, **kw):
    values = dict(rollout_batch_size=2, max_staleness=2, n_samples_per_prompt=1, weight_push_mode="abort")
    args = argparse.Namespace(**(values | kw))
    stream = group_stream.GroupStream(args, DataSource(), cap=2, sampling_params={}, generate_group=engine.generate)
    stream.faults.retry_delay_s = stream.faults.behind_delay_s = 0.01
    return stream


_settle = functools.partial(settle, timeout=20.0, poll_s=0.005)


@pytest.mark.parametrize(
    "served, regenerated", [("0", True), ("default", True), ("1", True), ("2", False), ("3", False)]
)
def test_a_reply_behind_the_landed_version_is_regenerated_never_trained(served, regenerated, caplog):
    """Version 2 has landed (start_rollout(3)): a reply at version 1 or older ("default": a restarted
    engine with its initial weights) is regenerated from the prompt; 2 (the boundary) and newer train."""
    engine = Engine(version=lambda key, call: served if (key == 0 and call == 0) else "2")
    stream = _stream(engine)

    async def go():
        stream.start_rollout(3)  # the engines hold version 2
        await _settle(stream)
        return stream.pop(2)

    with caplog.at_level(logging.WARNING, logger="epic_slime.slime.stream.engine_faults"):
        batch = run(go())
    assert [g[0].group_index for g in batch] == [0, 1]
    assert engine.calls.count(0) == (2 if regenerated else 1)
    counted = stream.faults.metrics()["rollout/faults/behind_version_regenerations"]
    if served in ("0", "default", "1"):
        assert counted == 1 and batch[0][0].weight_versions == ["2"]
        assert "weight version %d, older than version 2" % (1 if served == "1" else 0) in caplog.text
    else:
        assert counted == 0 and batch[0][0].weight_versions == [served]


def test_the_guard_looks_only_at_this_calls_versions():
    """An aborted group resubmitted after a push carries its older tokens' version legitimately: the
    guard compares only what this call reported with the version known when this call was submitted."""
    from slime.utils.types import Sample as S

    stream = _stream(Engine())
    group = [S(index=0, group_index=0)]
    group[0].weight_versions = ["1", "2"]
    assert stream.faults.behind_version(group, [(0, 1)], submitted_version=2) is None
    assert stream.faults.behind_version(group, [(0, 0)], submitted_version=2) == 1


def test_an_engine_that_never_gets_the_push_ends_the_run_with_its_version(monkeypatch):
    monkeypatch.setattr(engine_faults, "MAX_BEHIND_REGENERATIONS", 3)
    engine = Engine(version=lambda key, call: "default" if key == 0 else "1")
    stream = _stream(engine)

    async def go():
        stream.start_rollout(2)
        await _settle(stream)

    run(go())
    assert engine.calls.count(0) == 4
    with pytest.raises(engine_faults.EngineFailedError, match="weight version 0 < 1 [(]4 times in a row[)]"):
        stream.pop(2)


def _ft_args(**kw):
    return (
        dict(
            use_fault_tolerance=True,
            rollout_health_check_first_wait=0.0,
            rollout_health_check_interval=0.2,
            rollout_health_check_timeout=0.2,
        )
        | kw
    )


def test_the_deadline_is_slimes_detection_time_plus_the_margin():
    args = argparse.Namespace(
        **_ft_args(rollout_health_check_first_wait=5, rollout_health_check_interval=30, rollout_health_check_timeout=20)
    )
    assert engine_faults.recovery_deadline_s(args) == 5 + 30 + 20 + engine_faults.FT_MARGIN_S
    assert engine_faults.recovery_deadline_s(argparse.Namespace(use_fault_tolerance=False)) is None


def test_with_fault_tolerance_a_failing_group_is_retried_past_three_tries_until_it_succeeds(monkeypatch):
    """Fault tolerance: slime's monitor needs up to first wait + interval + timeout to take a dead engine
    out of the router; a group failing 5 times in that window (more than MAX_GROUP_ATTEMPTS) trains once."""
    engine = Engine(raises=lambda key, call: key == 0 and call < 5)
    stream = _stream(engine, **_ft_args())

    async def go():
        stream.start_rollout(1)
        await _settle(stream)
        consumed = stream.data_source.next  # the regenerations took no new prompt
        return stream.pop(2), consumed

    batch, consumed = run(go())
    assert [g[0].group_index for g in batch] == [0, 1] and engine.calls.count(0) == 6 and consumed == 2
    assert stream.faults.metrics()["rollout/faults/fault_retries"] == 5


def test_with_fault_tolerance_a_group_failing_past_the_deadline_ends_the_run(monkeypatch, tmp_path):
    monkeypatch.setattr(engine_faults, "FT_MARGIN_S", 0.0)
    engine = Engine(raises=lambda key, call: key == 0)
    stream = _stream(engine, **_ft_args(save=str(tmp_path / "ckpt")))
    stream.faults.probe = lambda router: ["http://127.0.0.1:9/"]

    async def go():
        stream.start_rollout(1)
        await _settle(stream)

    started = time.monotonic()
    run(go())
    assert 0.4 <= time.monotonic() - started < 10
    with pytest.raises(engine_faults.EngineFailedError, match="past the fault-tolerance deadline of 0 s") as caught:
        stream.pop(2)
    assert "unhealthy engines: http://127.0.0.1:9/" in str(caught.value)
    assert "No checkpoint in" in str(caught.value)


def _write_save(save, rollout_id, model_complete):
    import torch

    from epic_slime.slime.stream.checkpoint_marks import mark_model_complete
    from epic_slime.slime.data_source import DATA_STATE_FILE, PENDING_FILE

    os.makedirs(os.path.join(save, "rollout"), exist_ok=True)
    torch.save({"groups": [], "model_marker": True}, os.path.join(save, PENDING_FILE.format(rollout_id=rollout_id)))
    torch.save({}, os.path.join(save, DATA_STATE_FILE.format(rollout_id=rollout_id)))
    if model_complete:
        mark_model_complete(save, rollout_id)


def _rollout_with_a_dead_engine(engine, **kw):
    """One rollout whose fault probe finds 127.0.0.1:30001 dead: (stream, the routers probed)."""
    stream = _stream(engine, **kw)
    probed = []
    stream.faults.probe = lambda router: probed.append(router) or ["http://127.0.0.1:30001"]

    async def go():
        stream.start_rollout(1)
        await _settle(stream)

    run(go())
    return stream, probed


def test_without_fault_tolerance_a_dead_engine_ends_the_run_naming_it_and_the_checkpoint(tmp_path):
    """One line: the engine that does not answer /health, and the latest checkpoint whose data state and
    model are complete (rollout 3's model write was cut short: rollout 1)."""
    save = str(tmp_path / "ckpt")
    _write_save(save, 1, model_complete=True)
    _write_save(save, 3, model_complete=False)
    engine = Engine(raises=lambda key, call: key == 0)
    stream, probed = _rollout_with_a_dead_engine(engine, save=save)
    assert engine.calls.count(0) == 1 and len(probed) == 1  # no retry: nothing would replace the engine
    with pytest.raises(engine_faults.EngineFailedError) as caught:
        stream.pop(2)
    message = str(caught.value)
    assert "\n" not in message
    assert "SGLang engine http://127.0.0.1:30001 does not answer /health" in message
    assert "resume from it with --ckpt-step 1" in message and f"--load {save}" in message
    assert stream.faults.metrics()["rollout/faults/engines_found_dead"] == 1


def test_a_dead_engine_found_by_several_failed_groups_is_counted_once():
    """Every group in flight fails on the dead engine and each probes: one engine, counted once (the real
    engine-fault test met two groups failing at once on an idle CPU and counted it twice)."""
    engine = Engine(raises=lambda key, call: True)
    stream, probed = _rollout_with_a_dead_engine(engine)
    assert len(probed) >= 2  # both groups failed and probed
    assert stream.faults.metrics()["rollout/faults/engines_found_dead"] == 1
    assert stream.faults.counts["failed_calls"] == len(probed)


def test_without_fault_tolerance_a_transient_failure_with_every_engine_healthy_is_retried():
    engine = Engine(raises=lambda key, call: key == 0 and call == 0)
    stream = _stream(engine)
    stream.faults.probe = lambda router: []

    async def go():
        stream.start_rollout(1)
        await _settle(stream)
        return stream.pop(2)

    assert [g[0].group_index for g in run(go())] == [0, 1] and engine.calls.count(0) == 2


def test_groups_a_failed_rollout_had_taken_stay_accounted_for():
    """Group 0 finishes and the collector takes it; then group 1's engine is found dead and the rollout
    raises before delivering. Group 0 is consumed and undelivered: the ledger still owes it (a save
    regenerates it), and the stream's count must say so, or the accounting check calls it lost (a
    clean-clone CI run of the real engine-fault test failed this way)."""
    from epic_slime.slime import rollout
    from epic_slime.slime.stream.gate import StalenessGate

    engine = Engine(raises=lambda key, call: key == 1)
    original = engine.generate

    async def generate(args, group, sampling_params, evaluation=False):
        if group[0].group_index == 1:
            await asyncio.sleep(0.3)  # group 0 is taken first
        return await original(args, group, sampling_params, evaluation)

    stream = _stream(engine)
    stream.generate_group = generate
    stream.faults.probe = lambda router: ["http://127.0.0.1:30001"]
    gate = StalenessGate(stream.args.max_staleness, "drop")
    with pytest.raises(engine_faults.EngineFailedError):
        run(asyncio.wait_for(rollout._collect(stream.args, stream, 1, gate, 0), 20))
    assert stream.taken == {0}
    ledger = stream.data_source.ledger
    assert ledger.undelivered() == ledger.consumed >= 2 and not ledger.delivered
    ledger.check(worker_in_flight=stream.accounted())
    assert stream.accounted() != stream.held() + stream.data_source.handed_back()


def test_a_success_restarts_the_fault_clock_of_its_group(monkeypatch):
    """The deadline runs from the first failure *in a row*: a group that failed, then succeeded, and is
    regenerated long after (here: requeued as too stale) gets the whole deadline again when it fails
    once more. A clock kept from the earlier failure would end a healthy run."""
    monkeypatch.setattr(engine_faults, "FT_MARGIN_S", 0.0)  # deadline 0 + 0.2 + 0.2 = 0.4 s
    engine = Engine(raises=lambda key, call: key == 0 and call in (0, 2))
    stream = _stream(engine, **_ft_args())
    assert stream.faults.deadline_s == pytest.approx(0.4)

    async def go():
        stream.start_rollout(1)
        await _settle(stream)
        first = stream.pop(2)
        assert [g[0].group_index for g in first] == [0, 1] and stream.faults.first_failure == {}
        await asyncio.sleep(0.6)  # past the deadline since group 0's first failure
        assert stream.requeue(first[0])  # regenerated once the cap has room: call 2 fails, call 3 succeeds
        stream.release(first[1])
        await _settle(stream)
        later = stream.pop(2)  # groups 2 and 3 (started while 0 and 1 were taken) make room for 0
        await _settle(stream)
        return later + stream.pop(1)

    again = run(go())
    assert [g[0].group_index for g in again] == [2, 3, 0] and engine.calls.count(0) == 4
    assert stream.faults.metrics()["rollout/faults/fault_retries"] == 2
