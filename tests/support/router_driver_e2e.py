"""Issue 35 items 3 and 4 on the REAL engines, through the slime e2e harness's session
(``slime_e2e_real.py``: slime's rollout path, the project's ``GroupStream``, slime's own
``update_weights_from_distributed`` into the real SGLang server):

- ``router_outage_run``: mid-run, the router (a real sglang-router of its own, started with slime's flags)
  loses the worker through slime's own ``SGLangEngine.shutdown`` calls and regains it ``down_s`` later
  through slime's ``_register_to_router`` (``slime_worker_calls.py``); the run must train every prompt once.
- ``driver_kill_in_push``: the whole driver is SIGKILLed in the push after training rollout
  ``KILL_IN_PUSH_AFTER`` (between two tensors of its last bucket), on an engine of the caller's own; what
  the engine serves then, and a resumed session from the last checkpoint.
"""

from __future__ import annotations

import os
import threading
import time
import types
from pathlib import Path

import requests

from support import slime_e2e_harness as h
from support import slime_e2e_real as real
from support.fault_probes import SLIME_ROUTER_FLAGS, slime_worker_call
from support.real_sglang import RealRouter

ROLLOUTS = 4
# the worker leaves the router once rollout 0's batch is generated (groups of rollout 1 on in flight): the
# router drops it 7-14 s after slime's call, so most of the run is still ahead on a fast machine too
OUTAGE_AFTER = ("generate", 0)
DOWN_S = 8.0  # seconds without a worker
KILL_IN_PUSH_AFTER = 2  # saves after rollouts 1 and 3: the resume starts from 1, the killed push was 2's
SAVE_INTERVAL = 2
PAUSED_PROBE_S = 10.0  # a generate unanswered this long after the kill: the engine is still paused


def _wait_for_event(trace: str, event: str, rollout_id: int, stop: threading.Event, timeout: float = 600) -> bool:
    deadline = time.monotonic() + timeout
    while not stop.is_set() and time.monotonic() < deadline:
        if os.path.exists(trace) and any(
            e["event"] == event and e["rollout_id"] == rollout_id for e in h.read_trace(trace)
        ):
            return True
        time.sleep(0.2)
    return False


def router_outage_run(engines, workdir: str, down_s: float = DOWN_S) -> dict:
    """One async K = 2 abort-mode session of ``ROLLOUTS`` rollouts through a router of its own in front of
    ``engines.server``; the outage as described above. The run's result (``slime_e2e_real.run``) plus
    ``outage``: when the worker left and came back (seconds from the session's start) and slime's calls."""
    os.makedirs(workdir, exist_ok=True)
    router = RealRouter([engines.server.url], Path(workdir), *SLIME_ROUTER_FLAGS).wait_ready()
    router.wait_workers([engines.server.url])
    own = types.SimpleNamespace(server=engines.server, router=router, model=engines.model, model_dir=engines.model_dir)
    trace, stop, outage = os.path.join(workdir, "trace.jsonl"), threading.Event(), {}

    def fault() -> None:
        if not _wait_for_event(trace, *OUTAGE_AFTER, stop):
            return
        outage["removed_at"] = time.time()
        outage["remove_call"] = slime_worker_call("remove", router.url, engines.server.url)
        router.wait_workers([])
        outage["empty_at"] = time.time()
        time.sleep(down_s)
        # the worker can serve nothing before this call; back_at (below) is when a poll of the router's list
        # saw it, up to 12 s later at load 7-20 (a train came 11 s before that poll, 2026-12-07)
        outage["added_at"] = time.time()
        outage["add_call"] = slime_worker_call("add", router.url, engines.server.url)
        router.wait_workers([engines.server.url])
        outage["back_at"] = time.time()

    watcher = threading.Thread(target=fault, daemon=True)
    watcher.start()
    try:
        result = real.run(own, "async-k2-abort", workdir, num_rollout=ROLLOUTS)
    finally:
        stop.set()
        watcher.join(120)
        router.stop()
    result["outage"] = outage
    return result


def outage_counts(result: dict) -> dict:
    """slime's HTTP retries and GroupStream's regenerated groups over the run, from its trace."""
    events = result["events"]
    last_generate = [e["metrics"] for e in events if e["event"] == "generate"][-1]
    counts = events[-1].get("log_counts", {})
    return {
        "http_retries": counts.get("http_retries", 0),
        "crashed_group_tasks": counts.get("crashed_group_tasks", 0),
        "crash_retries": last_generate.get("rollout/accounting/crash_retries"),
        "dropped_groups": last_generate.get("rollout/staleness/total_dropped_groups"),
    }


def checkpoint_model(workdir: str, rollout_id: int | None, path: str | None = None):
    """The trained model of the harness's checkpoint ``actor_<rollout_id>.pt`` (or of a state dict at ``path``)."""
    import torch

    from epic_slime.runtime.model import ModelConfig, build_policy
    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    model = build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=0).eval()
    if path is not None:
        model.load_state_dict(torch.load(path))
    else:
        model.load_state_dict(
            torch.load(os.path.join(workdir, "ckpt", f"actor_{rollout_id}.pt"), weights_only=False)["model"]
        )
    return model


def driver_kill_in_push(engines, workdir: str) -> dict:
    """Two sessions against ``engines`` (the caller's OWN: the kill leaves them mid-push): the first killed
    in a push, the engine measured, the second resumed from the last checkpoint."""
    from support.served_probe import mean_gap, model_logprobs, served_logprobs, served_weight_version

    os.makedirs(workdir, exist_ok=True)
    h.prepare_workdir(workdir, train_prompts=100, eval_prompts=real.EVAL_PROMPTS)
    server, probe = engines.server, real._probe_ids()
    common = {"port": engines.router.port, "engine_urls": [server.url], "real_engines": True}
    argv = dict(
        num_rollout=ROLLOUTS, save_interval=SAVE_INTERVAL, max_staleness=2, extra=["--weight-push-mode", "abort"]
    )
    first = os.path.join(workdir, "first.jsonl")
    rc_first = h.run_session(
        {
            **common,
            "trace": first,
            "dist_file": os.path.join(workdir, "dist1"),
            "argv": h.standard_argv(workdir, **argv),
            "kill_during_push": KILL_IN_PUSH_AFTER,
        },
        timeout=real.SESSION_TIMEOUT_S,
    )
    killed_at = time.time()
    after_kill: dict = {"alive": server.alive(), "version": served_weight_version(server.url)}
    # the killed push had paused generation (slime pauses before it sends); nothing continued it
    started = time.monotonic()
    try:
        server.post("/generate", {"input_ids": probe, "sampling_params": {"max_new_tokens": 1}}, timeout=PAUSED_PROBE_S)
        after_kill["paused"] = False
    except requests.exceptions.ReadTimeout:
        after_kill["paused"] = True
    after_kill["generate_wait_s"] = round(time.monotonic() - started, 2)
    # to score the probe, this test (not the resumed run) continues the engine
    server.post("/continue_generation", {}).raise_for_status()
    served = served_logprobs(server.url, probe)
    saved = checkpoint_model(workdir, KILL_IN_PUSH_AFTER - 1)
    after_kill["gap_to_last_checkpoint"] = mean_gap(served, model_logprobs(saved, probe))
    after_kill["gap_to_initial"] = mean_gap(served, model_logprobs(engines.model, probe))
    torn = checkpoint_model(workdir, None, os.path.join(workdir, "torn_push_model.pt"))
    after_kill["gap_to_killed_push"] = mean_gap(served, model_logprobs(torn, probe))
    resumed = os.path.join(workdir, "resumed.jsonl")
    rc_resumed = h.run_session(
        {
            **common,
            "trace": resumed,
            "dist_file": os.path.join(workdir, "dist2"),
            "argv": h.standard_argv(workdir, load=os.path.join(workdir, "ckpt"), **argv),
        },
        timeout=real.SESSION_TIMEOUT_S,
    )
    return {
        "rc": (rc_first, rc_resumed),
        "first": h.read_trace(first),
        "resumed": h.read_trace(resumed) if os.path.exists(resumed) else [],
        "after_kill": after_kill,
        "killed_at": killed_at,
        "workdir": workdir,
    }
