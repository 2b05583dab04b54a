"""A loopback stand-in for SGLang's router (sglang-router 0.3.2, the image's ``sgl-router``), at
the HTTP interface slime 624b824a uses in front of its engines.

What slime calls (``slime/backends/sglang_utils/sglang_engine.py``, ``slime/rollout/sglang_rollout.py``):

- ``POST /workers`` ``{"url", "worker_type"}``: an engine registers itself when it starts (node
  rank 0 of each engine); answers 202 ``{"status": "accepted", "worker_id": ...}``;
- ``GET /workers``: ``{"workers": [{"id", "url", "worker_type", "is_healthy", "load"}], "total"}``
  (slime's ``abort`` reads the URLs and aborts each engine directly; an engine's shutdown finds
  its id here);
- ``DELETE /workers/{id}``: an engine leaving;
- ``POST /generate``: the request, forwarded unchanged (body, and the routing-key header) to one
  worker's ``/generate``; the worker's status and JSON come back as they are.

The policy is the router's default, ``cache_aware`` (``--router-cache-threshold 0.3
--router-balance-abs-threshold 64 --router-balance-rel-threshold 1.5``): while the in-flight
loads are balanced, a request goes to the worker whose approximate prefix tree matches the
largest fraction of its ``input_ids`` if that fraction exceeds the threshold, otherwise to the
worker with the smallest tree; when they are imbalanced (max - min > abs and max > rel * min) it
goes to the least loaded worker. Every routed request's ``input_ids`` are inserted into its
worker's tree. So the samples of one group (one prompt) share an engine's prefix cache, and new
prompts spread over the engines. ``round_robin`` is there too (``--policy``). No eviction, no
health checks (slime disables them), no retries.

**What the real router does instead** (tests/slime_adapter/test_router_conformance.py, sglang-router
0.3.2 in front of two SGLang stand-ins): its cache-aware tree keys on the request's ``text``. slime
sends ``input_ids`` only, so every such request matches nothing and goes to the smallest tree, the
same (first) worker each time, while the loads stay within the balance thresholds: one engine serves
all, groups and new prompts alike. ``--route-by text`` does the same; the default (``input_ids``)
keeps the per-prompt spread the e2e runs (tests/slime_adapter/test_slime_e2e.py) were written
against, which the real router does not give.

``GET /stats``: per-worker routed requests, the decisions taken, and ``inputs_on_several_workers``
(identical ``input_ids``, e.g. the samples of one group, sent to more than one worker) for tests.

Run: ``python tests/support/router_standin.py --port-file F`` (binds 127.0.0.1 on a free port).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
from collections import Counter

POLICIES = ("cache_aware", "round_robin")
ROUTE_BY = ("input_ids", "text")
FORWARDED_HEADERS = ("x-smg-routing-key", "content-type")


class PrefixTree:
    """Token prefixes routed to one worker (the router's approximate view of its KV cache)."""

    def __init__(self):
        self.root: dict = {}
        self.size = 0

    def insert(self, tokens) -> None:
        node = self.root
        for t in tokens:
            if t not in node:
                node[t] = {}
                self.size += 1
            node = node[t]

    def match(self, tokens) -> int:
        node, length = self.root, 0
        for t in tokens:
            if t not in node:
                break
            node, length = node[t], length + 1
        return length


class Router:
    def __init__(
        self,
        policy: str = "cache_aware",
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        route_by: str = "input_ids",
    ):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.policy, self.cache_threshold = policy, cache_threshold
        if route_by not in ROUTE_BY:
            raise ValueError(f"route_by must be one of {ROUTE_BY}, got {route_by!r}")
        self.route_by = route_by
        self.balance_abs, self.balance_rel = balance_abs_threshold, balance_rel_threshold
        self.workers: dict[str, dict] = {}  # id -> {"url", "worker_type"}
        self.trees: dict[str, PrefixTree] = {}
        self.load: Counter = Counter()  # id -> requests in flight through the router
        self.ids = itertools.count()
        self.turn = itertools.count()
        self.stats = Counter()
        self.workers_of_input: dict[tuple, set] = {}  # identical input_ids (a group's samples) -> workers

    def add(self, url: str, worker_type: str = "regular") -> str:
        if not url.startswith("http://"):
            raise ValueError(f"url must be http://host:port, got {url!r}")
        if any(w["url"] == url for w in self.workers.values()):
            raise ValueError(f"worker {url} is already registered")
        worker_id = f"worker-{next(self.ids)}"
        self.workers[worker_id] = {"url": url, "worker_type": worker_type}
        self.trees[worker_id] = PrefixTree()
        return worker_id

    def remove(self, worker_id: str) -> None:
        if worker_id not in self.workers:
            raise KeyError(worker_id)
        del self.workers[worker_id], self.trees[worker_id]
        self.load.pop(worker_id, None)

    def choose(self, input_ids) -> str:
        """The worker for a request (see the module docstring); counts the decision."""
        ids = list(self.workers)
        if not ids:
            raise LookupError("no worker registered")
        if self.policy == "round_robin":
            chosen, why = ids[next(self.turn) % len(ids)], "round_robin"
        else:
            loads = [self.load[i] for i in ids]
            if max(loads) - min(loads) > self.balance_abs and max(loads) > self.balance_rel * min(loads):
                chosen, why = min(ids, key=lambda i: self.load[i]), "shortest_queue"
            else:
                best = max(ids, key=lambda i: self.trees[i].match(input_ids))
                rate = self.trees[best].match(input_ids) / max(len(input_ids), 1)
                if rate > self.cache_threshold:
                    chosen, why = best, "prefix_match"
                else:
                    chosen, why = min(ids, key=lambda i: self.trees[i].size), "smallest_tree"
            self.trees[chosen].insert(input_ids)
        self.stats[why] += 1
        self.stats[f"requests_{chosen}"] += 1
        seen = self.workers_of_input.setdefault(tuple(input_ids), set())
        if len(seen) == 1 and chosen not in seen:
            self.stats["inputs_on_several_workers"] += 1
        seen.add(chosen)
        return chosen


def make_app(router: Router):
    import aiohttp
    from aiohttp import web

    client: dict = {}

    async def session():
        if "s" not in client:
            client["s"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), trust_env=False)
        return client["s"]

    async def add_worker(request):
        payload = await request.json()
        try:
            worker_id = router.add(payload.get("url", ""), payload.get("worker_type", "regular"))
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"status": "accepted", "worker_id": worker_id, "url": payload["url"]}, status=202)

    async def list_workers(request):
        workers = [{"id": i, **w, "is_healthy": True, "load": router.load[i]} for i, w in router.workers.items()]
        return web.json_response({"workers": workers, "total": len(workers)})

    async def delete_worker(request):
        try:
            router.remove(request.match_info["worker_id"])
        except KeyError:
            return web.json_response({"error": f"no worker {request.match_info['worker_id']}"}, status=404)
        return web.json_response({"status": "accepted"}, status=202)

    async def generate(request):
        payload = await request.json()
        try:
            key = (payload.get("text") or "") if router.route_by == "text" else (payload.get("input_ids") or [])
            worker_id = router.choose(key)
        except LookupError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        url = router.workers[worker_id]["url"]
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}
        router.load[worker_id] += 1
        try:
            async with (await session()).post(f"{url}/generate", json=payload, headers=headers) as reply:
                body = await reply.read()
                return web.Response(body=body, status=reply.status, content_type="application/json")
        except aiohttp.ClientError as exc:
            router.stats["worker_errors"] += 1
            return web.json_response({"error": f"worker {url}: {exc}"}, status=502)
        finally:
            router.load[worker_id] -= 1

    async def health(request):
        return web.Response(text="ok")

    async def stats(request):
        return web.json_response({**router.stats, "workers": {i: w["url"] for i, w in router.workers.items()}})

    async def close(app):
        if "s" in client:
            await client["s"].close()

    app = web.Application(client_max_size=64 * 2**20)
    app.add_routes(
        [
            web.post("/workers", add_worker),
            web.get("/workers", list_workers),
            web.delete("/workers/{worker_id}", delete_worker),
            web.post("/generate", generate),
            web.get("/health", health),
            web.get("/stats", stats),
        ]
    )
    app.on_cleanup.append(close)
    return app


async def _serve(port_file: str, router: Router) -> None:
    from aiohttp import web

    runner = web.AppRunner(make_app(router), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, port_file)
    await asyncio.Event().wait()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--policy", choices=POLICIES, default="cache_aware")
    parser.add_argument("--cache-threshold", type=float, default=0.3)
    parser.add_argument("--balance-abs-threshold", type=int, default=64)
    parser.add_argument("--balance-rel-threshold", type=float, default=1.5)
    parser.add_argument(
        "--route-by",
        choices=ROUTE_BY,
        default="input_ids",
        help="the prefix the cache_aware tree keys on; the real router 0.3.2 keys on text (see above)",
    )
    args = parser.parse_args(argv)
    router = Router(
        args.policy, args.cache_threshold, args.balance_abs_threshold, args.balance_rel_threshold, args.route_by
    )
    asyncio.run(_serve(args.port_file, router))
    return 0


if __name__ == "__main__":
    sys.exit(main())
