"""Issue 46 patterns 1-5: what a fresh mutation pass over the stream's fault handling and accounting found
unpinned. The real GroupStream on slime's global loop with an injected engine (its ``generate_group``),
the project's real ``StreamingDataSource`` over slime's where the data source matters, and a real HTTP
router and worker (127.0.0.1) for the health probe.

1. how far apart the regenerations of a failed (or behind) group are, not only how many;
2. a worker whose ``/health`` hangs is found dead within the probe's timeout;
3. a group the collector has taken leaves the stream's counts when it is requeued or dropped, not only
   when delivered: through the real collector (``rollout._collect``, its ledger check after each rollout),
   read from what the stream does (which groups start; ``room()``), not from its private counters; a
   group retried after a failure keeps its slot;
4. a group regenerated twice by the collector, with the real data source, reaches the engine each time
   as the ledger's clean stored prompt (a copy), and a save afterwards holds that prompt;
5. with several good saves the resume hint names the newest consistent one.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import threading
import time

import pytest

pytest.importorskip("slime.rollout.sglang_rollout", reason="slime is not importable (SLIME_PATH)")
from slime.utils.async_utils import run  # noqa: E402

from epic_slime.slime import engine_faults, group_stream  # noqa: E402
from epic_slime.slime import rollout  # noqa: E402
from epic_slime.slime.checkpoint_marks import MODEL_DONE_FILE, mark_model_complete  # noqa: E402
from epic_slime.slime.data_source import StreamingDataSource, group_key  # noqa: E402
from support.stream_data_source import DataSource  # noqa: E402


class Engine:
    """Answers each call with ``version(key, call)`` (one token); raises while ``raises(key, call)``.
    Records each call's key, start time and the response length the group already had."""

    def __init__(self, version=lambda key, call: "1", raises=lambda key, call: False):
        self.calls: list[int] = []
        self.starts: dict[int, list[float]] = {}
        self.lengths_given: dict[int, list[int]] = {}
        self.version, self.raises = version, raises

    async def generate(self, args, group, sampling_params, evaluation=False):
        key = group[0].group_index
        call = self.calls.count(key)
        self.calls.append(key)
        self.starts.setdefault(key, []).append(time.monotonic())
        self.lengths_given.setdefault(key, []).append(sum(s.response_length for s in group))
        await asyncio.sleep(0.001)
        if self.raises(key, call):
            raise ConnectionError(f"engine lost while generating group {key}")
        for sample in group:
            if not sample.tokens:  # the prompt's tokens, as slime's generate sets them on a first call
                sample.tokens = [1]
            sample.append_response_tokens(
                argparse.Namespace(partial_rollout=False),
                tokens=[7, 8],
                log_probs=[-0.1, -0.2],
                meta_info={"weight_version": self.version(key, call), "finish_reason": {"type": "stop"}},
            )
        return group


def _stream(engine, data_source=None, **kw):
    values = dict(rollout_batch_size=2, max_staleness=1, n_samples_per_prompt=1, weight_push_mode="abort")
    args = argparse.Namespace(**(values | kw))
    stream = group_stream.GroupStream(
        args, DataSource() if data_source is None else data_source, sampling_params={}, generate_group=engine.generate
    )
    stream.faults.retry_delay_s = stream.faults.behind_delay_s = 0.01
    return stream


async def _settle(stream, timeout=30.0):
    deadline = time.monotonic() + timeout
    while stream.active and time.monotonic() < deadline:
        await asyncio.sleep(0.005)


def _gaps(starts: list[float]) -> list[float]:
    return [b - a for a, b in zip(starts, starts[1:])]


# ---- 1. pacing ----

PACE_S = 0.4


def test_a_failed_group_is_regenerated_retry_delay_apart_under_fault_tolerance():
    engine = Engine(raises=lambda key, call: key == 0 and call < 2)
    stream = _stream(
        engine,
        use_fault_tolerance=True,
        rollout_health_check_first_wait=0.0,
        rollout_health_check_interval=30.0,
        rollout_health_check_timeout=30.0,
    )
    stream.faults.retry_delay_s = PACE_S  # the behind delay stays 0.01: the two must not be confused

    async def go():
        stream.start_rollout(1)
        await _settle(stream)

    run(go())
    starts = engine.starts[0]
    assert len(starts) == 3 and stream.faults.counts["fault_retries"] == 2
    assert all(gap >= PACE_S for gap in _gaps(starts)), _gaps(starts)


def test_a_group_a_behind_engine_answered_is_regenerated_behind_delay_apart():
    engine = Engine(version=lambda key, call: "default" if (key == 0 and call < 2) else "1")
    stream = _stream(engine)
    stream.faults.behind_delay_s = PACE_S  # the retry delay stays 0.01

    async def go():
        stream.start_rollout(2)  # version 1 has landed: "default" (0) is behind
        await _settle(stream)

    run(go())
    starts = engine.starts[0]
    assert len(starts) == 3 and stream.faults.counts["behind_version_regenerations"] == 2
    assert all(gap >= PACE_S for gap in _gaps(starts)), _gaps(starts)


# ---- 2. a probe that hangs ----


class _Http:
    """A real HTTP server on 127.0.0.1 answering GET paths with (status, JSON) after a delay."""

    def __init__(self, routes: dict):
        routes_ = routes

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                delay, status, body = routes_.get(self.path, (0.0, 404, {}))
                time.sleep(delay)
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up first

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def router_with_workers():
    servers = []

    def make(health_delays: list[float]):
        workers = [_Http({"/health": (d, 200, {})}) for d in health_delays]
        router = _Http({"/workers": (0.0, 200, {"workers": [{"url": w.url} for w in workers]})})
        servers.extend([*workers, router])
        return router.url, [w.url for w in workers]

    yield make
    for s in servers:
        s.close()


HANG_S = 6.0


def test_a_worker_whose_health_hangs_is_named_dead_within_the_probe_timeout(router_with_workers):
    router, (healthy, hung) = router_with_workers([0.0, HANG_S])
    t0 = time.monotonic()
    dead = engine_faults.unhealthy_workers(router, timeout=0.5)
    elapsed = time.monotonic() - t0
    assert dead == [hung] and healthy not in dead
    assert elapsed < HANG_S / 2, f"the probe waited {elapsed:.1f} s on a hung /health"


def test_without_fault_tolerance_a_hung_engine_ends_the_run_naming_it(router_with_workers, tmp_path):
    router, (hung,) = router_with_workers([HANG_S])
    host, port = router.removeprefix("http://").split(":")
    engine = Engine(raises=lambda key, call: key == 0)
    stream = _stream(engine, sglang_router_ip=host, sglang_router_port=int(port), save=str(tmp_path))
    stream.faults.probe = lambda url: engine_faults.unhealthy_workers(url, timeout=0.5)
    t0 = time.monotonic()

    async def go():
        stream.start_rollout(1)
        await _settle(stream)

    run(go())
    assert time.monotonic() - t0 < HANG_S / 2
    with pytest.raises(engine_faults.EngineFailedError, match=f"SGLang engine {hung} does not answer /health"):
        stream.pop(2)
    assert engine.calls.count(0) == 1 and stream.faults.counts["engines_found_dead"] == 1


# ---- 3. every exit of a taken group ----
# Through the real collector (``rollout._collect``: pop, the staleness gate, requeue, drop, delivery, and
# its ledger check after each rollout). Counts are read from what the stream does, never from its
# private state: which groups the engine was asked to start (a slot that is not freed starts nothing; a
# slot freed twice starts one group too many) and ``room()``.


def _on_loop(fn):
    """Run ``fn`` on slime's loop (where the collector runs), then let the stream settle."""

    async def go():
        out = fn()
        await _settle(stream_of[0])
        return out

    stream_of = []

    def call(stream):
        stream_of[:] = [stream]
        return run(go())

    return call


def _versioned_stream(max_requeues: int, data_source=None):
    """B = 2, K = 1; the engine answers with the weight version the stream knows has landed."""
    box = {}
    engine = Engine(version=lambda key, call: str(box["stream"].engine_version))
    stream = box["stream"] = _stream(engine, data_source=data_source)
    stream.max_requeues = max_requeues
    return engine, stream


def _collect(stream, trainer_version: int, rollout_id: int):
    """One rollout as slime's driver asks for it; the collector's own ledger check runs at its end."""
    gate = rollout.StalenessGate(stream.args.max_staleness, "drop")
    batch, metrics, _ = run(
        asyncio.wait_for(rollout._collect(stream.args, stream, trainer_version, gate, rollout_id), 20)
    )
    _on_loop(lambda: None)(stream)  # let the groups it started settle
    return [group_key(g) for g in batch], metrics, gate


def _started(engine) -> dict:
    return {key: engine.calls.count(key) for key in sorted(set(engine.calls))}


def _check(stream):
    stream.data_source.ledger.check(worker_in_flight=stream.accounted())


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
    engine = Engine(raises=lambda key, call: key == 0 and call == 0)
    stream = _stream(engine)
    batch, metrics, _ = _collect(stream, 1, 0)
    assert batch == [0, 1] and engine.calls.count(0) == 2 and stream.crash_retries == 1
    assert _started(engine) == {0: 2, 1: 1, 2: 1, 3: 1}, "a retried group must not open a slot"
    assert metrics["rollout/accounting/consumed_groups"] == 4
    _check(stream)


# ---- 4. the real data source's regeneration ----


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


# ---- 5. more than one good save ----


def test_the_resume_hint_names_the_newest_consistent_of_several_saves(tmp_path):
    source = _source(tmp_path)
    source.get_samples(3)
    for rollout_id in (1, 3, 5):
        source.save(rollout_id)
    for rollout_id in (1, 3, 5):
        mark_model_complete(str(tmp_path), rollout_id)
    args = argparse.Namespace(save=str(tmp_path))
    assert "last consistent save is rollout 5: resume from it with --ckpt-step 5" in engine_faults.resume_hint(args)
    # the newest one torn (its model write cut short): the one before it
    (tmp_path / MODEL_DONE_FILE.format(rollout_id=5)).unlink()
    assert "last consistent save is rollout 3: resume from it with --ckpt-step 3" in engine_faults.resume_hint(args)
