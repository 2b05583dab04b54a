"""The engine-fault rules' timing (``epic_slime.slime.stream.engine_faults``, issue 46 patterns 1-2): how far
apart the regenerations of a failed (or behind) group are, not only how many; and a worker whose
``/health`` hangs is found dead within the probe's timeout. The real GroupStream on slime's global loop
with an injected engine (its ``generate_group``), and a real HTTP router and worker (127.0.0.1) for the
health probe. Each test names the mutants (tests/mutation/mutants.yaml) it kills."""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import threading
import time

import pytest

pytest.importorskip("slime.rollout.sglang_rollout", reason="slime is not importable (SLIME_PATH)")
from slime.utils.async_utils import run  # noqa: E402

from epic_slime.slime.stream import engine_faults, group_stream  # noqa: E402
from support.recording_engine import RecordingEngine, settle  # noqa: E402
from support.stream_data_source import DataSource  # noqa: E402


def _stream(engine, **kw):
    values = dict(rollout_batch_size=2, max_staleness=1, n_samples_per_prompt=1, weight_push_mode="abort")
    args = argparse.Namespace(**(values | kw))
    stream = group_stream.GroupStream(args, DataSource(), sampling_params={}, generate_group=engine.generate)
    stream.faults.retry_delay_s = stream.faults.behind_delay_s = 0.01
    return stream


_settle = functools.partial(settle, timeout=30.0, poll_s=0.005)


def _gaps(starts: list[float]) -> list[float]:
    return [b - a for a, b in zip(starts, starts[1:])]


# ---- pacing ----

PACE_S = 0.4


# mutants: ft_retry_paced_by_behind_delay, ft_retry_not_paced
def test_a_failed_group_is_regenerated_retry_delay_apart_under_fault_tolerance():
    engine = RecordingEngine(raises=lambda key, call: key == 0 and call < 2)
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


# mutant: behind_regeneration_paced_by_retry_delay
def test_a_group_a_behind_engine_answered_is_regenerated_behind_delay_apart():
    engine = RecordingEngine(version=lambda key, call: "default" if (key == 0 and call < 2) else "1")
    stream = _stream(engine)
    stream.faults.behind_delay_s = PACE_S  # the retry delay stays 0.01

    async def go():
        stream.start_rollout(2)  # version 1 has landed: "default" (0) is behind
        await _settle(stream)

    run(go())
    starts = engine.starts[0]
    assert len(starts) == 3 and stream.faults.counts["behind_version_regenerations"] == 2
    assert all(gap >= PACE_S for gap in _gaps(starts)), _gaps(starts)


# ---- a probe that hangs ----


class _DelayedJsonServer:
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
        workers = [_DelayedJsonServer({"/health": (d, 200, {})}) for d in health_delays]
        router = _DelayedJsonServer({"/workers": (0.0, 200, {"workers": [{"url": w.url} for w in workers]})})
        servers.extend([*workers, router])
        return router.url, [w.url for w in workers]

    yield make
    for s in servers:
        s.close()


HANG_S = 6.0


# mutants: health_probe_without_timeout, health_probe_error_counts_as_healthy
def test_a_worker_whose_health_hangs_is_named_dead_within_the_probe_timeout(router_with_workers):
    router, (healthy, hung) = router_with_workers([0.0, HANG_S])
    t0 = time.monotonic()
    dead = engine_faults.unhealthy_workers(router, timeout=0.5)
    elapsed = time.monotonic() - t0
    assert dead == [hung] and healthy not in dead
    assert elapsed < HANG_S / 2, f"the probe waited {elapsed:.1f} s on a hung /health"


# mutants: health_probe_without_timeout, health_probe_error_counts_as_healthy
def test_without_fault_tolerance_a_hung_engine_ends_the_run_naming_it(router_with_workers, tmp_path):
    router, (hung,) = router_with_workers([HANG_S])
    host, port = router.removeprefix("http://").split(":")
    engine = RecordingEngine(raises=lambda key, call: key == 0)
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
