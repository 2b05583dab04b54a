"""What the REAL sglang-router 0.3.2 and SGLang 0.5.15.post1 server do under the two faults of issue 35
items 3 and 4, measured on engines of the caller's own (never the suite's shared server):

- ``router_probe``: the router loses its worker through slime's own ``SGLangEngine.shutdown`` calls
  (``slime_worker_calls.py``) while a request routed to it is held in flight (``/pause_generation``
  ``in_place``), answers requests while it has zero workers, then regains the worker through slime's
  ``_register_to_router``: what the held request gets, what an empty router answers and how fast, how
  long until a routed request is served again.
- ``push_peer_death_probe``: the trainer side of a distributed weight push (a child process: slime's
  ``init_process_group``, then the bucket's tensors by broadcast) dies by SIGKILL between two tensors of a
  bucket: what the server's ``/update_weights_from_distributed`` answers and when, whether the server
  still serves, whether a new ``/init_weights_update_group`` of the same group name works (without and
  after ``/destroy_weights_update_group``), and what the server's weights and version are meanwhile.

Both return plain dicts of numbers (``python fault_probes.py OUT.json`` runs both and writes them).
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # run as a script: the repository and tests/ on the path
    sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]

from support.real_sglang import REPO, RealRouter, free_port

TESTS = REPO / "tests"
# slime's router: its own health check off, the circuit breaker off (slime/ray/rollout.py, _start_router)
SLIME_ROUTER_FLAGS = ("--disable-health-check", "--disable-circuit-breaker")
PUSH_GROUP = "epic_fault_probe"


def slime_env() -> dict:
    from support.slime_args import slime_path

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(REPO), str(TESTS), slime_path(), env.get("PYTHONPATH", "")] if p
    )
    return env


def slime_worker_call(action: str, router_url: str, engine_url: str) -> dict:
    """slime's own ``shutdown`` ("remove") or ``_register_to_router`` ("add"), in a child process."""
    done = subprocess.run(
        [sys.executable, str(TESTS / "support" / "slime_worker_calls.py"), action, router_url, engine_url],
        env=slime_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"slime_worker_calls {action} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _routed_generate(http, router_url: str, ids: list[int], max_new_tokens: int = 8, timeout: float = 120) -> dict:
    started = time.monotonic()
    try:
        reply = http.post(
            f"{router_url}/generate",
            timeout=timeout,
            json={"input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0}},
        )
        status, body = reply.status_code, reply.text[:300]
    except Exception as exc:  # noqa: BLE001 - what the client sees is the measurement
        status, body = None, repr(exc)[:300]
    return {"status": status, "body": body, "seconds": round(time.monotonic() - started, 3)}


def router_probe(server, workdir: Path, ids: list[int], empty_tries: int = 5) -> dict:
    """See the module docstring. ``server``: a healthy ``RealServer`` of the caller's own."""
    router = RealRouter([server.url], workdir, *SLIME_ROUTER_FLAGS).wait_ready()
    out: dict = {}
    try:
        router.wait_workers([server.url])
        http = server.http
        out["before"] = _routed_generate(http, router.url, ids)
        # a request in flight on the worker when the router forgets it: held by an in-place pause
        server.post("/pause_generation", {"mode": "in_place"}).raise_for_status()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(_routed_generate, http, router.url, ids, 16, 300)
            time.sleep(2.0)
            removed_at = time.monotonic()
            out["remove_call"] = slime_worker_call("remove", router.url, server.url)
            router.wait_workers([])
            out["workers_empty_after_s"] = round(time.monotonic() - removed_at, 3)
            time.sleep(1.0)
            out["held_done_while_removed"] = held.done()
            out["empty"] = [_routed_generate(http, router.url, ids) for _ in range(empty_tries)]
            server.post("/continue_generation", {}).raise_for_status()
            out["held"] = held.result(300)
        added_at = time.monotonic()
        out["add_call"] = slime_worker_call("add", router.url, server.url)
        router.wait_workers([server.url])
        out["workers_back_after_s"] = round(time.monotonic() - added_at, 3)
        out["after"] = _routed_generate(http, router.url, ids)
        out["served_again_after_s"] = round(time.monotonic() - added_at, 3)
    finally:
        server.post("/continue_generation", {})
        router.stop()
    return out


def _pusher(port: int, tensors_path: str, send: int) -> subprocess.Popen:
    """The trainer side of the push in a child process: slime's group set-up, then ``send`` tensors of
    the bucket by broadcast, then SIGKILL of itself (the driver killed between two tensors)."""
    code = (
        "import os, signal, sys, torch, torch.distributed as dist\n"
        "from datetime import timedelta\n"
        "from slime.utils.distributed_utils import init_process_group\n"
        f"g = init_process_group(backend='gloo', init_method='tcp://127.0.0.1:{port}', world_size=2, rank=0,"
        f" group_name='{PUSH_GROUP}', timeout=timedelta(seconds=120))\n"
        f"tensors = torch.load({tensors_path!r})\n"
        f"for i, t in enumerate(list(tensors.values())[:{send}]):\n"
        "    o = dist.BroadcastOptions(); o.rootRank, o.rootTensor = 0, 0\n"
        "    g.broadcast([t.contiguous()], o).wait()\n"
        "print('sent', flush=True)\n"
        f"if {send} < len(tensors): os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], env=slime_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def push_bucket(server, tensors: dict, version: str, send: int | None = None, timeout: float = 300) -> dict:
    """One bucket pushed to ``server``: init the group, post the metadata, the pusher broadcasts
    ``send`` of the tensors (all when None) and is killed if fewer; the server's answers and timings."""
    import torch

    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"fault_probe_{os.getpid()}_{time.monotonic_ns()}.pt")
    torch.save({k: v.detach().contiguous() for k, v in tensors.items()}, path)
    port = free_port()
    send = len(tensors) if send is None else send
    out: dict = {"sent": send, "of": len(tensors)}
    pusher = _pusher(port, path, send)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            init = server.post(
                "/init_weights_update_group",
                {
                    "master_address": "127.0.0.1",
                    "master_port": port,
                    "rank_offset": 1,
                    "world_size": 2,
                    "group_name": PUSH_GROUP,
                    "backend": "gloo",
                },
                timeout=timeout,
            )
            out["init"] = {"status": init.status_code, "body": init.text[:300]}
            if init.status_code != 200 or not init.json().get("success"):
                pusher.kill()
                return out
            names = list(tensors)
            started = time.monotonic()
            answer = pool.submit(
                server.post,
                "/update_weights_from_distributed",
                {
                    "names": names,
                    "dtypes": [str(tensors[n].dtype).replace("torch.", "") for n in names],
                    "shapes": [list(tensors[n].shape) for n in names],
                    "group_name": PUSH_GROUP,
                    "flush_cache": True,
                    "weight_version": version,
                },
                timeout=timeout,
            )
            out["pusher_rc"] = pusher.wait(timeout)
            out["pusher_died_after_s"] = round(time.monotonic() - started, 3)
            try:
                reply = answer.result(timeout)
                out["update"] = {"status": reply.status_code, "body": reply.text[:400]}
            except Exception as exc:  # noqa: BLE001 - the measurement
                out["update"] = {"status": None, "body": repr(exc)[:400]}
            out["update_answered_after_s"] = round(time.monotonic() - started, 3)
    finally:
        if pusher.poll() is None:
            pusher.kill()
        os.unlink(path)
    return out


def destroy_group(server) -> dict:
    reply = server.post("/destroy_weights_update_group", {"group_name": PUSH_GROUP})
    return {"status": reply.status_code, "body": reply.text[:300]}


def push_peer_death_probe(server, model, probe_ids: list[int]) -> dict:
    """See the module docstring. ``model``: the model the server was launched with (served now)."""
    import torch

    from epic_slime.runtime.hf_export import checkpoint_tensors
    from support.served_probe import mean_gap, model_logprobs, served_logprobs, served_weight_version

    trained = copy.deepcopy(model)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tensors = checkpoint_tensors(trained)
    out: dict = {"version_before": served_weight_version(server.url)}
    out["killed_push"] = push_bucket(server, tensors, "killed", send=len(tensors) // 2)
    out["alive"] = server.alive()
    started = time.monotonic()
    health = server.get("/health_generate", timeout=300)
    out["health_after_kill"] = {"status": health.status_code, "seconds": round(time.monotonic() - started, 3)}
    out["version_after_kill"] = served_weight_version(server.url)
    served = served_logprobs(server.url, probe_ids)
    out["probe_gap_to_launched"] = mean_gap(served, model_logprobs(model, probe_ids))
    out["probe_gap_to_pushed"] = mean_gap(served, model_logprobs(trained, probe_ids))
    out["same_name_again"] = push_bucket(server, tensors, "again")
    out["destroy"] = destroy_group(server)
    out["after_destroy"] = push_bucket(server, tensors, "recovered")
    out["destroy_after_recovery"] = destroy_group(server)
    served = served_logprobs(server.url, probe_ids)
    out["final_probe_gap_to_pushed"] = mean_gap(served, model_logprobs(trained, probe_ids))
    out["final_version"] = served_weight_version(server.url)
    return out


def main(argv: list[str]) -> int:
    import tempfile

    from epic_slime.runtime.hf_export import export_initial_checkpoint
    from epic_slime.runtime.task import Tokenizer
    from support.real_sglang import RealServer

    out_path = argv[0] if argv else None
    workdir = Path(tempfile.mkdtemp(prefix="fault_probes_"))
    model_dir, model = export_initial_checkpoint(workdir / "tiny")
    tok = Tokenizer()
    ids = [tok.bos_id] + tok.encode("9-4+8=Answer:13")
    server = RealServer(model_dir, workdir)
    try:
        started = time.monotonic()
        server.wait_healthy()
        result = {"server_start_s": round(time.monotonic() - started, 1)}
        result["router"] = router_probe(server, workdir, ids[:8])
        print(json.dumps(result["router"], indent=1), flush=True)
        result["push"] = push_peer_death_probe(server, model, ids)
        print(json.dumps(result["push"], indent=1), flush=True)
    finally:
        server.stop()
    if out_path:
        Path(out_path).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main(sys.argv[1:]))
