"""Probe: what the real sglang-router 0.3.2 does with a worker that dies (SIGKILL) or hangs (SIGSTOP),
two real SGLang 0.5.15.post1 servers behind it, the router launched as slime 624b824a launches its own
(circuit breaker and health check disabled, slime's request timeout unless ``--request-timeout`` says
otherwise; default policy cache_aware). Feeds docs/cluster.md "When an engine fails".

    EPIC_SLIME_SGLANG_PYTHON=... PYTHONPATH=.:tests python bench/router_engine_faults.py [--requests 8]

The victim serves weight version "99", the survivor "default": each reply's ``meta_info.weight_version``
says which worker answered. For each phase (healthy, victim SIGSTOPped, victim SIGKILLed) it sends
``--requests`` distinct prompts one after another through the router and prints, per request, the HTTP
status, the seconds to the answer and who answered, then whether the router still lists the victim
(``GET /workers``) over ``--watch`` seconds. One JSON line per phase.
"""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
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
        return {"status": reply.status_code, "s": round(seconds, 2), "by": who,
                "body": None if reply.status_code == 200 else reply.text[:160]}
    except requests.RequestException as exc:
        return {"status": None, "s": round(time.monotonic() - started, 2), "by": None, "error": type(exc).__name__}


def phase(name: str, router: RealRouter, victim: RealServer, n: int, timeout: float, watch: float, offset: int) -> dict:
    replies = [send(router.url, [1, 5 + (offset + i) % 40, 7, 9 + i % 7], timeout) for i in range(n)]
    listed, t0 = [], time.monotonic()
    while time.monotonic() - t0 < watch:
        listed.append(victim.url in router.workers())
        time.sleep(1.0)
    out = {"phase": name, "replies": replies, "victim_listed_throughout": all(listed) if listed else None,
           "watched_s": watch}
    print(json.dumps(out), flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=30.0, help="the client's timeout per request (s)")
    parser.add_argument("--request-timeout", type=int, default=14400, help="the router's --request-timeout-secs")
    parser.add_argument("--watch", type=float, default=20.0, help="seconds to watch /workers after each phase")
    parser.add_argument("--policy", default="cache_aware")
    a = parser.parse_args()
    from epic_slime.runtime.hf_export import export_initial_checkpoint

    workdir = Path(tempfile.mkdtemp(prefix="router_engine_faults_"))
    model_dir, _ = export_initial_checkpoint(workdir / "tiny")
    survivor = RealServer(model_dir, workdir)
    victim = RealServer(model_dir, workdir, weight_version=VICTIM_VERSION)
    router = None
    try:
        survivor.wait_healthy()
        victim.wait_healthy()
        router = RealRouter([survivor.url, victim.url], workdir, "--policy", a.policy, "--disable-circuit-breaker",
                            "--disable-health-check", "--request-timeout-secs", str(a.request_timeout)).wait_ready()
        router.wait_workers([survivor.url, victim.url])
        phase("healthy", router, victim, a.requests, a.timeout, 0, 0)
        victim.process.signal(signal.SIGSTOP)
        phase("victim SIGSTOP", router, victim, a.requests, a.timeout, a.watch, 100)
        victim.process.signal(signal.SIGCONT)
        time.sleep(2)
        phase("victim SIGCONT", router, victim, a.requests, a.timeout, 0, 200)
        victim.process.signal(signal.SIGKILL)
        time.sleep(0.5)
        phase("victim SIGKILL", router, victim, a.requests, a.timeout, a.watch, 300)
    finally:
        for part in (router, victim, survivor):
            if part is not None:
                part.stop()
    print(json.dumps({"logs": str(workdir)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
