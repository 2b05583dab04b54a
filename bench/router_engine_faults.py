"""Probe: what the real sglang-router 0.3.2 does with a worker that dies (SIGKILL) or hangs (SIGSTOP),
two real SGLang 0.5.15.post1 servers behind it, the router launched as slime 624b824a launches its own
(circuit breaker and health check disabled, slime's request timeout unless ``--request-timeout`` says
otherwise; default policy cache_aware). Feeds docs/cluster.md "When an engine fails".

    EPIC_SLIME_SGLANG_PYTHON=... PYTHONPATH=.:tests python bench/router_engine_faults.py [--requests 8]

The victim serves weight version "99", the survivor "default": each reply's ``meta_info.weight_version``
says which worker answered. For each phase (healthy; victim SIGSTOPped; resumed;
SIGSTOPped and then SIGKILLed during a burst, as slime's health monitor kills a hung engine; dead) it sends
a burst of ``--requests`` distinct prompts at once through each of two routers (slime's default policy
cache_aware, and round_robin) and prints who answered (survivor, victim, or an error status) with the
seconds to the answer, then whether the routers still list the victim (``GET /workers``) over ``--watch``
seconds. One JSON line per phase.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import signal
import tempfile
import threading
import time
from pathlib import Path

import requests

from support.real_sglang import RealRouter, RealServer

VICTIM_VERSION = "99"


def send(router_url: str, prompt: list[int], timeout: float) -> dict:
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 1.0}}
    started = time.monotonic()
    try:
        reply = requests.post(router_url + "/generate", json=body, timeout=timeout)
        seconds = time.monotonic() - started
        who = None
        if reply.status_code == 200:
            who = "victim" if str(reply.json()["meta_info"].get("weight_version")) == VICTIM_VERSION else "survivor"
        return {
            "status": reply.status_code,
            "s": round(seconds, 2),
            "by": who,
            "body": None if reply.status_code == 200 else reply.text[:160],
        }
    except requests.RequestException as exc:
        return {"status": None, "s": round(time.monotonic() - started, 2), "by": None, "error": type(exc).__name__}


def burst(router_url: str, n: int, timeout: float, offset: int) -> list[dict]:
    """``n`` distinct prompts at once (slime keeps many requests in flight), the replies in order."""
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(send, router_url, [1, 5 + (offset + i) % 40, 7, 9 + i % 7], timeout) for i in range(n)]
        return [f.result() for f in futures]


def summary(replies: list[dict]) -> dict:
    by = {}
    for r in replies:
        key = r["by"] or f"status {r['status'] or r.get('error')}"
        by.setdefault(key, []).append(r["s"])
    return {k: {"n": len(v), "s_min": min(v), "s_max": max(v)} for k, v in by.items()}


def phase(
    name: str, routers: dict, victim: RealServer, n: int, timeout: float, watch: float, offset: int, during=None
) -> dict:
    out = {"phase": name}
    for policy, router in routers.items():
        if during is not None:  # an action while the burst is in flight (a kill of the hung victim)
            timer = threading.Timer(during[0], during[1])
            timer.start()
        replies = burst(router.url, n, timeout, offset)
        out[policy] = summary(replies)
        out[policy + "_errors"] = sorted(
            {r.get("body") or r.get("error") or "" for r in replies if r["status"] != 200}
        )[:3]
        if during is not None:
            timer.join()
            during = None  # once: the second router meets the state it left
    listed, t0 = {p: [] for p in routers}, time.monotonic()
    while time.monotonic() - t0 < watch:
        for policy, router in routers.items():
            listed[policy].append(victim.url in router.workers())
        time.sleep(1.0)
    out["victim_listed_throughout_watch"] = {p: all(v) for p, v in listed.items()} if watch else None
    out["watched_s"] = watch
    print(json.dumps(out), flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=8, help="requests in flight at once per burst")
    parser.add_argument("--timeout", type=float, default=20.0, help="the client's timeout per request (s)")
    parser.add_argument("--request-timeout", type=int, default=14400, help="the router's --request-timeout-secs")
    parser.add_argument("--watch", type=float, default=15.0, help="seconds to watch /workers after a fault phase")
    parser.add_argument("--kill-after", type=float, default=5.0, help="hung victim: SIGKILL this long into a burst")
    a = parser.parse_args()
    from epic_slime.runtime.hf_export import export_initial_checkpoint

    workdir = Path(tempfile.mkdtemp(prefix="router_engine_faults_"))
    model_dir, _ = export_initial_checkpoint(workdir / "tiny")
    survivor = RealServer(model_dir, workdir)
    victim = RealServer(model_dir, workdir, weight_version=VICTIM_VERSION)
    routers = {}
    try:
        survivor.wait_healthy()
        victim.wait_healthy()
        for policy in ("cache_aware", "round_robin"):  # slime's default policy, and the even spread
            routers[policy] = RealRouter(
                [survivor.url, victim.url],
                workdir,
                "--policy",
                policy,
                "--disable-circuit-breaker",
                "--disable-health-check",
                "--request-timeout-secs",
                str(a.request_timeout),
            ).wait_ready()
            routers[policy].wait_workers([survivor.url, victim.url])
        n, t = a.requests, a.timeout
        phase("healthy", routers, victim, n, t, 0, 0)
        victim.process.signal(signal.SIGSTOP)
        phase("victim SIGSTOP", routers, victim, n, t, a.watch, 100)
        victim.process.signal(signal.SIGCONT)
        time.sleep(3)
        phase("victim SIGCONT (resumed)", routers, victim, n, t, 0, 200)
        victim.process.signal(signal.SIGSTOP)
        phase(
            f"victim SIGSTOP, then SIGKILL {a.kill_after:.0f} s into the burst",
            routers,
            victim,
            n,
            120,
            0,
            300,
            during=(a.kill_after, lambda: victim.process.signal(signal.SIGKILL)),
        )
        time.sleep(0.5)
        phase("victim dead (SIGKILL)", routers, victim, n, t, a.watch, 400)
    finally:
        for part in (*routers.values(), victim, survivor):
            part.stop()
    print(json.dumps({"logs": str(workdir)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
