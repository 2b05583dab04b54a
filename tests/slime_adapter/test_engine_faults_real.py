"""An SGLang engine that hangs, restarts or dies mid-rollout, on REAL engines (issue 35 items 1-2): two real
SGLang 0.5.15.post1 servers (the session's and a victim, ``victim_server``) behind a real sglang-router
0.3.2 launched as slime 624b824a launches its own (circuit breaker and health check off), the project's
rollout path (``rollout._collect``: ``GroupStream`` with slime's own ``generate_and_rm_group``, the
``StreamingDataSource`` ledger, the staleness gate) and slime's own failure detection
(``RolloutHealthMonitor`` over ``SGLangEngine.health_generate`` / ``shutdown``, ``support/slime_health.py``).

The three tests run in order on one rig; each one's engine is the one the previous left:

1. the victim is SIGSTOPped while groups are in flight with ``--use-fault-tolerance``: slime's monitor
   detects it (the time is printed and bounded), kills it and takes it out of the router; the run goes
   on on the other engine, every prompt trained once;
2. slime's recovery: a fresh server at its initial weights (``"default"``) registers with ``POST
   /workers`` (slime's ``_register_to_router``) before the push: the behind-version guard regenerates
   every group it answers, none is trained with version 0; after the push it serves the current version
   and takes work;
3. that engine SIGKILLed mid-rollout without fault tolerance: one line names it and the checkpoint to
   resume from; nothing was trained twice.

Weight pushes are the version step a push makes (``/update_weights_from_disk`` of the initial checkpoint
with the next ``weight_version``): these tests are about versions and routing, not about tensors (the
pushes themselves: ``test_slime_e2e_real.py``, ``test_real_sglang_pushes.py``).
"""

from __future__ import annotations

import importlib.util
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from support import slime_e2e_harness as h

_SLIME = h.slime_path()
if _SLIME and _SLIME not in sys.path:
    sys.path.insert(0, _SLIME)
_MISSING = [m for m in ("slime", "megatron.core", "httpx", "aiohttp") if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(f"the engine-fault tests need slime's source and the slime-contract extra; missing: {_MISSING}",
                allow_module_level=True)

from support.real_sglang import RealRouter, RealServer  # noqa: E402

# how slime 624b824a starts its router (slime/ray/rollout.py): no circuit breaker, no router health
# check, its --sglang-router-request-timeout-secs default; the policy stays the router's default
SLIME_ROUTER_FLAGS = ("--disable-circuit-breaker", "--disable-health-check", "--request-timeout-secs", "14400")
CHECK_INTERVAL_S, CHECK_TIMEOUT_S = 1.0, 3.0   # --rollout-health-check-interval / -timeout here (30 / 30 default)
DETECTION_SLACK_S = 10.0                       # the monitor's own thread, shutdown and a loaded CI machine


class Rig:
    """The router over the two servers, slime's args, the data source and the stream; what each rollout trained."""

    def __init__(self, engines, victim, workdir: Path):
        from slime.utils import http_utils

        from epic_slime.slime.data_source import StreamingDataSource
        from epic_slime.slime.group_stream import GroupStream
        from support.slime_args import build_args

        self.engines, self.server, self.victim, self.workdir = engines, engines.server, victim, workdir
        h.prepare_workdir(str(workdir), train_prompts=200, eval_prompts=1)
        self.version = 1
        self.push(self.server)
        self.router = RealRouter([self.server.url, victim.url], workdir, *SLIME_ROUTER_FLAGS).wait_ready()
        self.router.wait_workers([self.server.url, victim.url])
        argv = h.standard_argv(str(workdir), num_rollout=100, save_interval=None, max_staleness=2) + [
            "--sglang-router-ip", "127.0.0.1", "--sglang-router-port", str(self.router.port),
            "--use-fault-tolerance", "--rollout-health-check-interval", str(CHECK_INTERVAL_S),
            "--rollout-health-check-timeout", str(CHECK_TIMEOUT_S)]
        self.args = build_args(argv)
        if http_utils._http_client is None:
            http_utils.init_http_client(self.args)
        _forget_generate_state()
        self.data_source = StreamingDataSource(self.args)
        self.stream = GroupStream(self.args, self.data_source, cap=self.args.async_groups_in_flight)
        self.stream.faults.behind_delay_s = 0.2
        self.rollout_id = 0
        self.trained: list[int] = []

    def push(self, *servers) -> None:
        """The version step of a push: each server serves the next ``weight_version`` (idle or not)."""
        for server in servers:
            reply = server.post("/update_weights_from_disk", {"model_path": self.engines.model_dir,
                                                              "weight_version": str(self.version), "flush_cache": False})
            assert reply.status_code == 200 and reply.json().get("success"), reply.text

    def rollout(self, timeout: float = 240) -> list[int]:
        """One rollout on the project's path (trainer version = rollout id + 1: the engines hold rollout id,
        at least 1); the caller then pushes the next version (``push``) to the live engines, as the driver does."""
        import asyncio

        from slime.utils.async_utils import run

        from epic_slime.slime import rollout as project_rollout
        from epic_slime.slime.data_source import group_key
        from epic_slime.staleness import StalenessGate

        gate = StalenessGate(self.args.max_staleness, "drop")
        groups, _, _ = run(asyncio.wait_for(project_rollout._collect(
            self.args, self.stream, self.rollout_id + 1, gate, self.rollout_id), timeout))
        keys = [group_key(g) for g in groups]
        self.trained += keys
        self.last_versions = [v for g in groups for s in g for v in s.weight_versions]
        self.rollout_id += 1
        self.version = max(1, self.rollout_id)
        return keys

    def stop(self) -> None:
        _forget_generate_state()
        self.router.stop()


def _forget_generate_state():
    """slime's ``GenerateState`` is a process singleton: this rig's (its router, its semaphore) is its own."""
    from slime.rollout.sglang_rollout import GenerateState
    from slime.utils.misc import SingletonMeta

    SingletonMeta._instances.pop(GenerateState, None)


def _prefills(server: RealServer) -> int:
    """Batches the server prefilled so far (its log): who took work."""
    return len(re.findall(r"Prefill batch", server.process.log_path.read_text(errors="replace")))


@pytest.fixture(scope="module")
def rig(real_engines, victim_server, tmp_path_factory):
    from epic_slime.slime.served_weights import served_weight_version
    from support.real_push import restore_initial_weights

    found = served_weight_version(real_engines.server.url)
    made = Rig(real_engines, victim_server, tmp_path_factory.mktemp("engine_faults_real"))
    try:
        yield made
    finally:
        made.stop()
        for extra in getattr(made, "restarted", []):
            extra.stop()
        restore_initial_weights(real_engines, found)


def _check_trained_once(rig) -> None:
    from collections import Counter

    twice = [k for k, n in Counter(rig.trained).items() if n > 1]
    assert not twice, f"trained twice: {twice}"
    rig.data_source.ledger.check(worker_in_flight=rig.stream.held() + len(rig.data_source._returned))


def test_a_hung_engine_is_detected_by_slimes_monitor_and_the_run_goes_on(rig, monkeypatch):
    from slime.utils import health_monitor

    from support.slime_health import EngineActor, RayShim, make_engine, server_group, slime_sglang_engine_class

    assert len(rig.rollout()) == rig.args.rollout_batch_size   # both engines healthy
    rig.push(rig.server, rig.victim)
    shim = RayShim()
    killed_at: list[float] = []
    monkeypatch.setattr(health_monitor, "ray", shim)
    monkeypatch.setattr(shim, "kill", lambda handle: (killed_at.append(time.monotonic()), RayShim.kill(shim, handle)))
    with slime_sglang_engine_class() as engine_class:
        # the victim only: a slow /health_generate of the shared server on this loaded CPU would make slime
        # kill the server every other test uses
        group = server_group([EngineActor(make_engine(engine_class, rig.victim.url, rig.router.url,
                                                      rig.victim.process.proc.pid))])
        monitor = health_monitor.RolloutHealthMonitor(group, rig.args)
        monitor.start()
        monitor.resume()
        try:
            before = _prefills(rig.victim)
            stopped_at: list[float] = []

            def hang():   # once the victim has taken work of this rollout
                deadline = time.monotonic() + 60
                while _prefills(rig.victim) == before and time.monotonic() < deadline:
                    time.sleep(0.05)
                rig.victim.process.signal(signal.SIGSTOP)
                stopped_at.append(time.monotonic())

            stopper = threading.Thread(target=hang, daemon=True)
            stopper.start()
            for _ in range(3):
                rig.rollout()
                rig.push(rig.server)
            stopper.join(5)
            wait_until = time.monotonic() + 60
            while not killed_at and time.monotonic() < wait_until:
                time.sleep(0.2)
        finally:
            monitor.stop()
    assert stopped_at and killed_at, "the victim was never stopped, or slime's monitor never killed it"
    detection = killed_at[0] - stopped_at[0]
    bound = rig.args.rollout_health_check_first_wait + CHECK_INTERVAL_S + CHECK_TIMEOUT_S + DETECTION_SLACK_S
    print(f"\nhung engine: slime's monitor killed it {detection:.1f} s after SIGSTOP (interval {CHECK_INTERVAL_S:.0f} s, "
          f"timeout {CHECK_TIMEOUT_S:.0f} s; bound {bound:.0f} s); faults {rig.stream.faults.metrics()}")
    assert detection <= bound
    assert group.all_engines == [None]
    assert rig.router.workers() == [rig.server.url]          # shutdown's DELETE /workers/{id}
    assert not rig.victim.alive()
    _check_trained_once(rig)


def test_a_restarted_engine_is_never_trained_on_before_its_push_then_takes_work(rig):
    from support.slime_health import make_engine, slime_sglang_engine_class

    fresh = RealServer(rig.engines.model_dir, rig.workdir)   # slime's recover: a new engine, initial weights
    rig.restarted = [fresh]
    fresh.wait_healthy()
    with slime_sglang_engine_class() as engine_class:   # slime's own registration, in the engine's init
        make_engine(engine_class, fresh.url, rig.router.url, fresh.process.proc.pid)._register_to_router({})
    rig.router.wait_workers([rig.server.url, fresh.url])
    counts = rig.stream.faults.counts
    behind_before, fresh_before = counts["behind_version_regenerations"], _prefills(fresh)
    rig.rollout()   # the push has not reached the fresh engine: whatever it answers is regenerated
    assert "default" not in rig.last_versions and min(int(v) for v in rig.last_versions) >= 1
    regenerated = counts["behind_version_regenerations"] - behind_before
    print(f"\nrestarted engine before its push: {regenerated} groups it answered regenerated, "
          f"{_prefills(fresh) - fresh_before} prefill batches there")
    assert regenerated >= 1 or _prefills(fresh) == fresh_before
    rig.push(rig.server, fresh)   # recover_updatable_engines, then update_weights: every engine at the version
    taken_before = _prefills(fresh)
    behind_after_push = counts["behind_version_regenerations"]
    for _ in range(2):
        rig.rollout()
        rig.push(rig.server, fresh)
    assert counts["behind_version_regenerations"] == behind_after_push   # nothing behind any more
    assert _prefills(fresh) > taken_before, "the restarted engine took no work after its push"
    _check_trained_once(rig)


def test_without_fault_tolerance_a_killed_engine_ends_the_run_naming_it_and_the_checkpoint(rig):
    from epic_slime.slime.engine_faults import EngineFailedError, EngineFaults

    fresh = rig.restarted[0]
    rig.args.use_fault_tolerance = False
    rig.stream.faults = EngineFaults(rig.args)
    before = _prefills(fresh)

    def kill():
        deadline = time.monotonic() + 60
        while _prefills(fresh) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        fresh.process.signal(signal.SIGKILL)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    trained_before = list(rig.trained)
    started = time.monotonic()
    with pytest.raises(EngineFailedError) as caught:
        for _ in range(6):
            rig.rollout(timeout=400)
            rig.push(rig.server)
    print(f"\nkilled engine without fault tolerance: the run stopped {time.monotonic() - started:.0f} s into the "
          f"rollouts: {caught.value}")
    message = str(caught.value)
    assert fresh.url in message and "\n" not in message and "--use-fault-tolerance" in message
    assert "No checkpoint" in message or "--ckpt-step" in message
    assert rig.trained[:len(trained_before)] == trained_before
    _check_trained_once(rig)
