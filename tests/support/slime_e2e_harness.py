"""End-to-end harness of the slime path on CPU (used by tests/slime_adapter/test_slime_e2e.py).

What is real: slime 624b824a's rollout side (data source, ``GenerateState``, ``generate_and_rm``,
its HTTP client with retries, its eval path, ``call_rollout_fn``, its rollout / eval logging with
the project's eval-record hook), slime's RolloutManager ``_convert_samples_to_train_data`` and
``_split_train_data_by_dp`` (``support/slime_store.py``: 2 DP ranks by default, each fetching its
object by slime's ``process_rollout_data``), slime's ``compute_advantages_and_returns`` and
``loss_function`` with the project's loss, under R3 the project's routing store and train hook
(``support/slime_e2e_r3.py``), the project's rollout function, data source and the driver's training loop (a parameter: ``--loop``, default
``epic_slime.slime.train.async_training_loop``; any loop with its signature
``loop(args, rollout_manager, actor_model, num_rollout_per_epoch, get)`` runs here).

Stand-ins, at the real component's interface: SGLang (``tests/support/sglang_standin.py``, HTTP on
127.0.0.1, the tiny Qwen3-MoE; two of them behind the router stand-in, ``RouterServer``), Ray's
object store (``support/slime_store.py``), the RolloutManager Ray actor (``RolloutManagerStandIn``: one
call at a time on its own thread, ``.remote`` returns a future, slime's own pieces inside) and
the Megatron train group (``CpuTrainGroup``: the tiny model, slime's ``loss_function``, AdamW,
weight pushes as slime's distributed updater makes them: first ask the RolloutManager for the
engines, which queues the push behind its call in progress (so it lands only after
``generate(r + 1)`` returned, as on a cluster), then slime's own
``UpdateWeightFromDistributed.update_weights`` (``support/slime_push.py``: pause, flush in abort
mode, per bucket ``/update_weights_from_distributed`` with its ``weight_version`` and the tensors
broadcast over a gloo group, continue; the push-mode hook around it under ``--weight-push-mode
in_place``); an unserialised push from disk is kept as a stress case only). slime's argument
parser needs SGLang and Megatron-LM's ``megatron.training`` (neither installs on this CPU machine),
so args are slime's own defaults, read from its source (``support/slime_args.py``), overlaid with
the driver's flag layer (``driver_argv``) and checked by ``validate_project_args``.

The parts: ``slime_args.py`` (args), ``slime_e2e_setup.py`` (workdir, prompts, reward, command
line), ``slime_e2e_manager.py`` (the RolloutManager), ``slime_e2e_train.py`` (the train group);
this module runs them: the stand-in server, the trace, the sessions.

A session (``python tests/support/slime_e2e_harness.py session CONFIG.json``) runs one driver process
and writes a JSONL trace (one line per event, flushed, so a killed session leaves its trace).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import torch

# the harness's parts, in their own modules; their names stay importable from here
from support.slime_args import REPO, TESTS, build_args, slime_argument_parser, slime_path  # noqa: F401
from support.slime_e2e_manager import RolloutManagerStandIn  # noqa: F401
from support.slime_e2e_setup import (  # noqa: F401
    EVAL_MAX_RESPONSE_LEN,
    GROUPS_IN_FLIGHT,
    HOLD_MAX_SECONDS,
    LONG_EVERY,
    LONG_MIN_NEW_TOKENS,
    ROLLOUT_MAX_RESPONSE_LEN,
    init_weights,
    prepare_workdir,
    reward,
    standard_argv,
    write_prompts,
    write_tokenizer,
)
from support.slime_e2e_train import PUSH_MODES, CpuTrainGroup, _session  # noqa: F401


# ---------------------------------------------------------------- trace, server, session

DP_SIZE = 2  # train ranks: slime's split gives each its own object and micro-batches


class SaveWindowKill:
    """SIGKILL between the two saves of a checkpoint (data state and model, in whichever order the
    driver makes them): the second save of rollout ``rollout_id`` never starts."""

    def __init__(self, rollout_id: int | None, trace):
        self.rollout_id, self.trace, self.done = rollout_id, trace, []

    def saving(self, what: str, rollout_id: int) -> None:
        if rollout_id != self.rollout_id:
            return
        if self.done:
            self.trace.write("kill", rollout_id, saved=self.done, next_save=what)
            os.kill(os.getpid(), signal.SIGKILL)
        self.done.append(what)


class _CountingHandler(logging.Handler):
    """Counts slime's HTTP retries and crashed group tasks (they only show in its logs)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.counts = Counter()

    def emit(self, record):
        msg = record.getMessage()
        if "retrying" in msg:
            self.counts["http_retries"] += 1
        if "process task raised" in msg:  # slime's worker: a group task crashed, its group is gone
            self.counts["crashed_group_tasks"] += 1
        if record.name == "epic_slime.slime.train" and "perf/driver_rss_mb" in msg:
            self.counts["driver_rss_logs"] += 1
        if "bound to a different event loop" in msg or (record.exc_text and "different event loop" in record.exc_text):
            self.counts["different_loop_errors"] += 1


class Trace:
    def __init__(self, path: str, counter: _CountingHandler | None = None):
        self.path = path
        self._f = open(path, "a")
        self._lock = threading.Lock()
        self.counter = counter

    def write(self, event: str, rollout_id: int, **fields) -> None:
        if self.counter is not None:
            fields["log_counts"] = dict(self.counter.counts)
        with self._lock:
            self._f.write(
                json.dumps({"event": event, "rollout_id": rollout_id, "t": time.time(), **fields}, default=float) + "\n"
            )
            self._f.flush()


def read_trace(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class Server:
    """The SGLang stand-in in its own process, stopped by its pid."""

    def __init__(
        self,
        workdir: str,
        weights: str | None = None,
        hold_max_new_tokens: int | None = None,
        long_every: int | None = LONG_EVERY,
        long_min_new_tokens: int = LONG_MIN_NEW_TOKENS,
        extra_args: list[str] = (),
    ):
        port_file = os.path.join(workdir, "standin.port")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, str(TESTS / "support" / "sglang_standin.py"), "--port-file", port_file]
        if weights:
            cmd += ["--weights", weights]
        if hold_max_new_tokens is not None:
            # the batch is taken in start order: if it waits for the held request, no pause comes
            cmd += ["--hold-max-new-tokens", str(hold_max_new_tokens), "--hold-max-seconds", str(HOLD_MAX_SECONDS)]
        if long_every is not None:  # training requests only (their response cap tells them from eval ones)
            cmd += [
                "--long-every",
                str(long_every),
                "--long-min-new-tokens",
                str(long_min_new_tokens),
                "--long-max-new-tokens",
                str(ROLLOUT_MAX_RESPONSE_LEN),
            ]
        cmd += list(extra_args)
        self.log = open(os.path.join(workdir, "standin.log"), "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"SGLang stand-in did not start; see {self.log.name}")
            time.sleep(0.1)
        self.port = int(Path(port_file).read_text())
        self.url = f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict:
        return _session().get(f"{self.url}/stats", timeout=10).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


class RouterServer:
    """The router stand-in (``support/router_standin.py``) in its own process, with ``engines``
    registered as slime's SGLang engine actors register themselves at start (``POST /workers``)."""

    def __init__(self, workdir: str, engines: list[Server], extra_args: list[str] = ()):
        port_file = os.path.join(workdir, "router.port")
        self.log = open(os.path.join(workdir, "router.log"), "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(TESTS / "support" / "router_standin.py"), "--port-file", port_file, *extra_args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 60
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"router stand-in did not start; see {self.log.name}")
            time.sleep(0.05)
        self.port = int(Path(port_file).read_text())
        self.url = f"http://127.0.0.1:{self.port}"
        for engine in engines:
            _session().post(
                f"{self.url}/workers", json={"url": engine.url, "worker_type": "regular"}, timeout=10
            ).raise_for_status()

    def stats(self) -> dict:
        return _session().get(f"{self.url}/stats", timeout=10).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.log.close()


def session(config: dict) -> None:
    """One driver process: the loop under test against the stand-ins; writes config['trace']."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from slime.utils.misc import load_function

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO)
    counter = _CountingHandler()
    logging.getLogger().addHandler(counter)
    trace = Trace(config["trace"], counter)
    args = build_args(config["argv"] + ["--sglang-router-ip", "127.0.0.1", "--sglang-router-port", str(config["port"])])
    dist.init_process_group("gloo", init_method=f"file://{config['dist_file']}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    from slime.utils.distributed_utils import set_gloo_group
    from support.slime_push import use_ray_stand_in

    from epic_slime.slime.push_mode import install_push_hook

    set_gloo_group(dist.group.WORLD)  # slime's updater barriers on it
    use_ray_stand_in()
    r3 = bool(getattr(args, "use_rollout_routing_replay", False))
    if r3:  # a local Ray (the routing store) and slime's init path on the train ranks (support/slime_e2e_r3.py)
        from support import slime_e2e_r3

        slime_e2e_r3.start(args)
    else:
        install_push_hook(args)  # the push half of --custom-megatron-init-path (its R3 half needs slime's actor module)
    from support.slime_store import ObjectStoreStandIn

    store = ObjectStoreStandIn()  # Ray's object store: slime's per-DP objects, fetched per rank
    manager = RolloutManagerStandIn(args, trace, store)
    window = SaveWindowKill(config.get("kill_between_saves"), trace)
    manager.save_window = window
    actor = CpuTrainGroup(
        args,
        f"http://127.0.0.1:{config['port']}",
        trace,
        config.get("kill_after_train"),
        manager=manager,
        push=config.get("push", "distributed"),
        save_window=window,
        store=store,
        dp_size=config.get("dp_size", DP_SIZE),
        engine_urls=config.get("engine_urls"),
        real_engines=config.get("real_engines", False),
        kill_during_push=config.get("kill_during_push"),
    )
    # slime's train_actor.set_rollout_manager: rank 0 tells the manager the DP layout
    manager.set_train_parallel_config.remote(actor.train_parallel_config).result()
    # slime's create_training_models: the checkpoint sets the start rollout, then the data source loads
    args.start_rollout_id = actor.start_rollout_id
    if args.rollout_global_dataset:
        manager.load.remote(args.start_rollout_id - 1).result()
    num_rollout_per_epoch = len(manager.data_source) // args.rollout_batch_size
    actor.update_weights()
    # the driver's own choice of schedule (--max-staleness 0: synchronous) unless a test names a loop
    from epic_slime.slime.train import training_loop_for

    loop = load_function(config["loop"]) if config.get("loop") else training_loop_for(args)
    started = time.time()
    loop(args, manager, actor, num_rollout_per_epoch, lambda fut: fut.result(timeout=300))
    source = manager.data_source
    consumed = getattr(getattr(source, "inner", source), "sample_group_index", None)
    ledger = getattr(source, "ledger", None)
    pending = [int(g[0].metadata["pid"]) for g in ledger.pending_payloads()] if ledger is not None else None
    trace.write(
        "done",
        args.num_rollout,
        seconds=time.time() - started,
        forwards=dict(actor.forwards),
        prompts_consumed=consumed,
        pending_pids=pending,
        memory_clears=actor.memory_clears,
    )
    manager.dispose.remote().result()
    manager.shutdown()
    if config.get("real_engines"):  # the weights of the last push, for the caller's check that it took effect
        actor.stop_pushing()
        torch.save(actor.last_pushed, os.path.join(os.path.dirname(config["trace"]), "final_model.pt"))
    if r3:
        slime_e2e_r3.stop()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    os._exit(0)  # slime's event-loop thread and HTTP client are daemons: nothing to wait for


def run_session(config: dict, timeout: float = 300) -> int:
    """Run ``session`` in a child process (a kill ends only that child); returns its exit code. On
    timeout its whole process group goes (an R3 session's local Ray included)."""
    workdir = os.path.dirname(config["trace"])
    path = os.path.join(workdir, f"session_{os.path.basename(config['trace'])}.json")
    with open(path, "w") as f:
        json.dump(config, f)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(REPO), str(TESTS), slime_path(), env.get("PYTHONPATH", "")] if p
    )
    with open(config["trace"] + ".log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(TESTS / "support" / "slime_e2e_harness.py"), "session", path],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            raise


def decile_report(events: list[dict]) -> dict:
    """The run's groups by response-length decile (issue 26 item 3), from the last generate event's
    ``rollout/staleness/run_deciles/*`` metrics (``epic_slime.length_deciles``): rows and a table."""
    last = [e["metrics"] for e in events if e["event"] == "generate"][-1]
    prefix = "rollout/staleness/run_deciles/"
    rows = []
    for d in range(10):
        base = f"{prefix}d{d}/"
        if base + "groups" not in last:
            continue
        rows.append(
            {
                "decile": d,
                "groups": int(last[base + "groups"]),
                "mean_staleness": last.get(base + "mean_staleness"),
                "min_length": last[base + "min_length"],
                "max_length": last[base + "max_length"],
                **{o: int(last[base + o]) for o in ("trained", "over_k", "dropped", "requeued")},
            }
        )
    table = "\n".join(
        f"d{r['decile']} len {r['min_length']:.0f}-{r['max_length']:.0f}: {r['groups']} groups, "
        f"{r['trained']} trained, {r['over_k']} over K, {r['dropped']} dropped, {r['requeued']} requeued, "
        f"mean staleness {r['mean_staleness']}"
        for r in rows
    )
    return {"rows": rows, "table": table}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "session":
        with open(argv[1]) as f:
            session(json.load(f))
        return 0
    # standalone measurement: MAX_STALENESS=K PYTHONPATH=tests python tests/support/slime_e2e_harness.py measure [extra driver flags...]
    # (12 rollouts, serialised pushes, oversampling and the length spread of the e2e; prints the
    # staleness histogram of the trained groups and the drop / requeue counts)
    if argv and argv[0] == "measure":
        workdir = tempfile.mkdtemp(prefix="slime_e2e_")
        prepare_workdir(workdir)
        server = Server(workdir, os.path.join(workdir, "init.pt"))
        try:
            trace = os.path.join(workdir, "measure.jsonl")
            rc = run_session(
                {
                    "trace": trace,
                    "port": server.port,
                    "dist_file": os.path.join(workdir, "dist"),
                    "argv": standard_argv(
                        workdir,
                        num_rollout=12,
                        save_interval=None,
                        extra=argv[1:],
                        max_staleness=int(os.environ.get("MAX_STALENESS", "2")),
                    ),
                }
            )
            events = read_trace(trace)
            trained = sum(len(e["pids"]) for e in events if e["event"] == "train")
            done = [e for e in events if e["event"] == "done"]
            staleness = Counter(s for e in events if e["event"] == "train" for s in e["staleness"])
            last = [e["metrics"] for e in events if e["event"] == "generate"][-1]
            print(
                json.dumps(
                    {
                        "rc": rc,
                        "trained_groups": trained,
                        "staleness_histogram": dict(sorted(staleness.items())),
                        "consumed_groups": last["rollout/accounting/consumed_groups"],
                        "dropped_groups": last["rollout/staleness/total_dropped_groups"],
                        "requeued_groups": last.get("rollout/staleness/total_requeued_groups"),
                        "abort_resubmits": last["rollout/accounting/abort_resubmits"],
                        "length_deciles": decile_report(events)["rows"],
                        "done": done[-1] if done else None,
                        "server": server.stats(),
                        "workdir": workdir,
                    },
                    indent=1,
                )
            )
        finally:
            server.stop()
        return 0
    raise SystemExit("usage: slime_e2e_harness.py session CONFIG.json | measure [flags]")


if __name__ == "__main__":
    sys.exit(main())
