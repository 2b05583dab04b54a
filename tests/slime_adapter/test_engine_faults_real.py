"""An SGLang engine that hangs, restarts or dies mid-rollout, on REAL engines (issue 35 items 1-2): two real
SGLang 0.5.15.post1 servers (the session's and a victim, ``victim_server``) behind a real sglang-router
0.3.2 launched as slime 624b824a launches its own (circuit breaker and health check off), the project's
rollout path (``rollout._collect``: ``GroupStream`` with slime's own ``generate_and_rm_group``, the
``StreamingDataSource`` ledger, the staleness gate) and slime's own failure detection
(``RolloutHealthMonitor`` over ``SGLangEngine.health_generate`` / ``shutdown``, ``support/slime_health.py``).

The four tests run in order on one rig; each one's engine is the one the previous left:

1. the victim is SIGSTOPped while groups are in flight with ``--use-fault-tolerance``: slime's monitor
   detects it (the time is printed and bounded), kills it and takes it out of the router; the run goes
   on on the other engine, every prompt trained once;
2. slime's recovery: a fresh server at its initial weights (``"default"``) registers with ``POST
   /workers`` (slime's ``_register_to_router``) before the push: the behind-version guard regenerates
   every group it answers, none is trained with version 0; after the push it serves the current version
   and takes work;
3. that engine SIGKILLed mid-rollout: the router moves its requests, the run goes on, every prompt trained once;
4. no engine left alive, no fault tolerance: one line names the dead engine and the checkpoint to resume
   from; nothing was trained twice.

Weight pushes are the version step a push makes (``/update_weights_from_disk`` of the initial checkpoint
with the next ``weight_version``): these tests are about versions and routing, not about tensors (the
pushes themselves: ``test_slime_e2e_real.py``, ``test_real_sglang_pushes.py``).
"""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path

import pytest

from support import slime_e2e_harness as h
from support.preconditions import skip_unless

skip_unless(
    "slime",
    "megatron.core",
    "httpx",
    "aiohttp",
    why="the engine-fault tests need slime's source and the slime-contract extra",
)

from support.real_sglang import RealRouter, RealServer  # noqa: E402

# how slime 624b824a starts its router (slime/ray/rollout.py): no circuit breaker, no router health
# check, its --sglang-router-request-timeout-secs default. Policy round_robin (slime's --router-policy): under
# slime's default cache_aware, at this scale every prompt goes to the engine whose prefix cache matches it,
# so a new engine would take no work; what cache_aware does with a dead or hung worker:
# bench/router_engine_faults.py, docs/cluster.md
SLIME_ROUTER_FLAGS = (
    "--disable-circuit-breaker",
    "--disable-health-check",
    "--request-timeout-secs",
    "14400",
    "--policy",
    "round_robin",
)
CHECK_INTERVAL_S, CHECK_TIMEOUT_S = 1.0, 3.0  # --rollout-health-check-interval / -timeout here (30 / 30 default)
DETECTION_SLACK_S = 10.0  # the monitor's own thread, shutdown and a loaded CI machine


class Rig:
    """The router over the two servers, slime's args, the data source and the stream; what each rollout trained."""

    def __init__(self, engines, victim, workdir: Path):
        from slime.utils import http_utils

        from epic_slime.slime.data_source import StreamingDataSource
        from epic_slime.slime.stream.group_stream import GroupStream
        from support.slime_args import build_args

        self.engines, self.server, self.victim, self.workdir = engines, engines.server, victim, workdir
        h.prepare_workdir(str(workdir), train_prompts=200, eval_prompts=1)
        self.version = 1
        self.push(self.server)
        self.router = RealRouter([self.server.url, victim.url], workdir, *SLIME_ROUTER_FLAGS).wait_ready()
        self.router.wait_workers([self.server.url, victim.url])
        argv = h.standard_argv(str(workdir), num_rollout=100, save_interval=None, max_staleness=2) + [
            "--sglang-router-ip",
            "127.0.0.1",
            "--sglang-router-port",
            str(self.router.port),
            "--use-fault-tolerance",
            "--rollout-health-check-interval",
            str(CHECK_INTERVAL_S),
            "--rollout-health-check-timeout",
            str(CHECK_TIMEOUT_S),
        ]
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
            reply = server.post(
                "/update_weights_from_disk",
                {"model_path": self.engines.model_dir, "weight_version": str(self.version), "flush_cache": False},
            )
            assert reply.status_code == 200 and reply.json().get("success"), reply.text

    def rollout(self, timeout: float = 240) -> list[int]:
        """One rollout on the project's path (trainer version = rollout id + 1: the engines hold rollout id,
        at least 1); the caller then pushes the next version (``push``) to the live engines, as the driver does."""
        import asyncio

        from slime.utils.async_utils import run

        from epic_slime.slime import rollout as project_rollout
        from epic_slime.slime.data_source import group_key
        from epic_slime.slime.stream.gate import StalenessGate

        gate = StalenessGate(self.args.max_staleness, "drop")
        groups, _, _ = run(
            asyncio.wait_for(
                project_rollout._collect(self.args, self.stream, self.rollout_id + 1, gate, self.rollout_id), timeout
            )
        )
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
    from support.served_probe import served_weight_version
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
    rig.data_source.ledger.check(worker_in_flight=rig.stream.accounted())


def test_a_hung_engine_is_detected_by_slimes_monitor_and_the_run_goes_on(rig, monkeypatch):
    from slime.utils import health_monitor

    from support.slime_health import EngineActor, RayShim, make_engine, server_group, slime_sglang_engine_class

    assert len(rig.rollout()) == rig.args.rollout_batch_size  # both engines healthy
    rig.push(rig.server, rig.victim)
    shim = RayShim()
    killed_at: list[float] = []
    monkeypatch.setattr(health_monitor, "ray", shim)
    monkeypatch.setattr(shim, "kill", lambda handle: (killed_at.append(time.monotonic()), RayShim.kill(shim, handle)))
    with slime_sglang_engine_class() as engine_class:
        # the victim only: a slow /health_generate of the shared server on this loaded CPU would make slime
        # kill the server every other test uses
        group = server_group(
            [EngineActor(make_engine(engine_class, rig.victim.url, rig.router.url, rig.victim.process.proc.pid))]
        )
        monitor = health_monitor.RolloutHealthMonitor(group, rig.args)
        monitor.start()
        monitor.resume()
        try:
            before = _prefills(rig.victim)
            stopped_at: list[float] = []

            def hang():  # once the victim has taken work of this rollout
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
    print(
        f"\nhung engine: slime's monitor killed it {detection:.1f} s after SIGSTOP (interval {CHECK_INTERVAL_S:.0f} s, "
        f"timeout {CHECK_TIMEOUT_S:.0f} s; bound {bound:.0f} s); faults {rig.stream.faults.metrics()}"
    )
    assert detection <= bound
    assert group.all_engines == [None]
    assert rig.router.workers() == [rig.server.url]  # shutdown's DELETE /workers/{id}
    assert not rig.victim.alive()
    _check_trained_once(rig)


def test_a_restarted_engine_is_never_trained_on_before_its_push_then_takes_work(rig):
    """slime's order: ``recover_updatable_engines`` starts the new engine, which registers with the router in
    its init, and the push follows while the stream generates; here the push lands once the guard has
    regenerated a group the new engine answered at its initial weights (or after 120 s: then the test fails)."""
    from support.slime_health import make_engine, slime_sglang_engine_class

    fresh = RealServer(rig.engines.model_dir, rig.workdir)  # slime's recover: a new engine, initial weights
    rig.restarted = [fresh]
    fresh.wait_healthy()
    counts = rig.stream.faults.counts
    behind_before, fresh_before = counts["behind_version_regenerations"], _prefills(fresh)
    with slime_sglang_engine_class() as engine_class:  # slime's own registration, in the engine's init
        make_engine(engine_class, fresh.url, rig.router.url, fresh.process.proc.pid)._register_to_router({})
    rig.router.wait_workers([rig.server.url, fresh.url])
    pushed_at: list[float] = []

    def push_once_behind():
        deadline = time.monotonic() + 120
        while counts["behind_version_regenerations"] == behind_before and time.monotonic() < deadline:
            time.sleep(0.05)
        rig.push(fresh)  # the same version as the other engine: every engine now holds it
        pushed_at.append(time.monotonic())

    pusher = threading.Thread(target=push_once_behind, daemon=True)
    pusher.start()
    rig.rollout()
    pusher.join(130)
    regenerated = counts["behind_version_regenerations"] - behind_before
    print(
        f"\nrestarted engine before its push: {regenerated} group replies at its initial weights regenerated, "
        f"{_prefills(fresh) - fresh_before} prefill batches there"
    )
    assert regenerated >= 1, "the restarted engine answered no group before its push"
    assert "default" not in rig.last_versions and min(int(v) for v in rig.last_versions) >= 1
    rig.push(rig.server, fresh)
    taken_before, behind_after_push = _prefills(fresh), counts["behind_version_regenerations"]
    for _ in range(2):
        rig.rollout()
        rig.push(rig.server, fresh)
    assert counts["behind_version_regenerations"] == behind_after_push  # nothing behind any more
    assert _prefills(fresh) > taken_before, "the restarted engine took no work after its push"
    _check_trained_once(rig)


def test_a_killed_engine_mid_rollout_costs_nothing_the_router_moves_its_requests(rig):
    """SIGKILL while groups are in flight there, no health monitor: the router keeps listing the dead engine,
    its retries of a refused request go to the other one (round_robin), and the run goes on; every prompt
    trained once."""
    fresh = rig.restarted[0]
    before = _prefills(fresh)
    killed_at: list[float] = []

    def kill():  # once it has taken work of this rollout
        deadline = time.monotonic() + 60
        while _prefills(fresh) == before and time.monotonic() < deadline:
            time.sleep(0.02)
        fresh.process.signal(signal.SIGKILL)
        killed_at.append(time.monotonic())

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    started = time.monotonic()
    for _ in range(3):
        rig.rollout()
        rig.push(rig.server)
    killer.join(5)
    print(
        f"\nkilled engine: 3 rollouts in {time.monotonic() - started:.0f} s, killed {killed_at[0] - started:.1f} s in; "
        f"faults {rig.stream.faults.metrics()}"
    )
    assert killed_at and not fresh.alive() and _prefills(fresh) > before
    assert fresh.url in rig.router.workers()  # nothing removed it: the router's retries moved its requests
    _check_trained_once(rig)


def test_without_fault_tolerance_a_dead_only_engine_ends_the_run_naming_it_and_the_checkpoint(rig):
    """A run whose engines are all dead (here: the other engine taken out of the router), no fault tolerance:
    slime's client gives up after its retries, the stream probes the router and the engines and stops the
    run with one line naming the dead engine and the checkpoint to resume from."""
    from epic_slime.slime.stream.engine_faults import EngineFailedError, EngineFaults

    fresh = rig.restarted[0]
    listed = rig.router.http.get(rig.router.url + "/workers", timeout=10).json()["workers"]
    other = next(w["id"] for w in listed if w["url"] == rig.server.url)
    rig.router.http.delete(f"{rig.router.url}/workers/{other}", timeout=10).raise_for_status()
    rig.router.wait_workers([fresh.url])
    rig.args.use_fault_tolerance = False
    rig.stream.faults = EngineFaults(rig.args)
    started, rollouts = time.monotonic(), 0
    with pytest.raises(EngineFailedError) as caught:
        for rollouts in range(1, 4):  # the groups that finished before are taken first
            rig.rollout(timeout=400)
    print(
        f"\ndead engine without fault tolerance: the run stopped after {time.monotonic() - started:.0f} s, in rollout "
        f"{rollouts} after it: {caught.value}"
    )
    message = str(caught.value)
    assert f"SGLang engine {fresh.url} does not answer /health" in message and "\n" not in message
    assert "No checkpoint in" in message  # this rig saves none; the named checkpoint: test_engine_faults.py
    assert rig.stream.faults.counts["engines_found_dead"] == 1 and rig.stream.faults.counts["failed_calls"] >= 1
    _check_trained_once(rig)
