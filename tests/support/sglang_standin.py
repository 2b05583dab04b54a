"""A loopback SGLang stand-in: SGLang's HTTP interface as slime 624b824a calls it, backed by the
embedded runtime's tiny Qwen3-MoE on CPU (so behaviour log-probs are real).

Endpoints: ``POST /generate`` (``input_ids``, ``sampling_params`` with temperature / top_p /
max_new_tokens / stop_token_ids, ``return_logprob``; answers ``text``, ``output_ids`` and
``meta_info`` with ``output_token_logprobs`` ``[[logprob, token, None], ...]``, ``finish_reason``
``{"type": "stop" | "length" | "abort"}``, ``weight_version``, token counts), ``POST
/pause_generation`` (SGLang's default abort mode, ``abort_request(abort_all=True)``: every
request it holds ends now with finish_reason abort, the running batch with the tokens generated
so far, waiting ones with none; requests that arrive while paused wait until
``/continue_generation``), ``GET /flush_cache``, ``POST /update_weights_from_disk``
(``model_path``: a torch state dict), slime's distributed push (``POST /init_weights_update_group``
joins a gloo group with the trainer's rank 0 from ``master_address`` / ``master_port`` /
``rank_offset`` / ``world_size``; ``POST /update_weights_from_distributed`` receives one bucket:
``names`` / ``dtypes`` / ``shapes`` as metadata, the tensors by broadcast from rank 0, and sets
``weight_version`` when given, as SGLang does per bucket; ``POST /destroy_weights_update_group``),
``POST /update_weight_version`` (``new_version``; aborts every request first unless
``abort_all_requests`` is false, SGLang's default),
``POST /abort_request`` (``abort_all``, as slime's synchronous rollout ends a batch), ``GET
/v1/loads`` (running and waiting requests), ``GET /health_generate``, ``GET /workers`` (router
view), ``GET /stats`` (counters for tests).

Batching: continuous, as SGLang's scheduler: each decode step advances every running request by
one token (requests with equal (temperature, top_p), up to ``max_batch``; a request joins at the
next step and leaves when it finishes), so a short request started after a long one finishes
first. Each step recomputes the running sequences (no KV cache: the model is tiny).
log-prob convention: log_softmax(logits / T)[token], over the logits the token was drawn from.

Response-length spread (``--long-every N --long-min-new-tokens M``): a prompt whose crc32 (prompt =
the tokens up to its first "=") is divisible by N cannot stop (end-of-sequence and stop tokens are
masked, like SGLang's ``min_new_tokens``) before its response has M tokens, counting the partial
response of a resubmitted request: a fraction of groups much longer than the rest, which other
groups overtake.

A slow request on demand (``--hold-max-new-tokens N``): whether a weight push meets requests in
flight depends on how fast this CPU decodes against how fast the trainer steps (on a 2-core CI
machine generation finished before every push, so no push met a request). To make that case
certain, after each ``/continue_generation`` (and at start) the first request with
``max_new_tokens == N`` and a prompt never seen before is held, not decoded, until the next
pause aborts it: a request still running when the weights arrive, as on a busy cluster.
Resubmissions (a prompt seen before) and other requests (eval, with another length) are never held,
so nothing waits on a pause that waits on them.

Run: ``python tests/support/sglang_standin.py --port-file F --weights W`` (binds 127.0.0.1 on a free port,
writes it to F).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import zlib
from collections import Counter
from datetime import timedelta
from concurrent.futures import ThreadPoolExecutor

import torch

STOP, LENGTH, ABORT = "stop", "length", "abort"


def build_model(weights_path: str | None):
    from epic_slime.runtime.model import ModelConfig, build_policy
    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    model = build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=0)
    if weights_path:
        model.load_state_dict(torch.load(weights_path, weights_only=True))
    model.eval()
    return model, tok


class Request:
    def __init__(self, payload: dict, future: asyncio.Future):
        params = payload.get("sampling_params") or {}
        if "input_ids" not in payload:
            raise ValueError("this stand-in takes input_ids only (slime sends them for text prompts)")
        self.input_ids = [int(t) for t in payload["input_ids"]]
        self.held = False
        self.temperature = float(params.get("temperature", 1.0))
        self.top_p = float(params.get("top_p", 1.0))
        self.max_new_tokens = int(params.get("max_new_tokens", 16))
        self.stop_ids = set(params.get("stop_token_ids") or [])
        self.min_new_tokens = 0           # set by the engine for the long prompts
        self.future = future
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.finish: str | None = None

    @property
    def key(self):
        return (self.temperature, self.top_p)


class Engine:
    def __init__(self, model, tokenizer, max_batch: int, hold_max_new_tokens: int | None = None,
                 long_every: int | None = None, long_min_new_tokens: int = 0):
        self.model, self.tok, self.max_batch = model, tokenizer, max_batch
        self.hold_max_new_tokens = hold_max_new_tokens
        self.hold_armed = hold_max_new_tokens is not None
        self.long_every, self.long_min_new_tokens = long_every, long_min_new_tokens
        self.equals_id = tokenizer.token_to_id["="]
        self.seen_prompts: set[tuple[int, ...]] = set()
        self.pending: list[Request] = []
        self.running: list[Request] = []
        self.paused = False
        self.version = "default"
        self.wakeup = asyncio.Event()
        self.step_lock = asyncio.Lock()   # a decode step and an abort never interleave
        self.stats = Counter()
        self.groups: dict = {}            # weight-update group name -> gloo process group
        self.pool = ThreadPoolExecutor(1)   # one compute thread: decoding and weight loads serialise
        self.generator = torch.Generator().manual_seed(1234)

    def _prompt_part(self, input_ids: list[int]) -> tuple[list[int], int]:
        """(prompt up to its first "=", response tokens already in input_ids)."""
        end = input_ids.index(self.equals_id) + 1 if self.equals_id in input_ids else len(input_ids)
        return input_ids[:end], len(input_ids) - end

    async def generate(self, payload: dict) -> dict:
        req = Request(payload, asyncio.get_running_loop().create_future())
        if self.long_every:
            prompt, answered = self._prompt_part(req.input_ids)
            if zlib.crc32(bytes(prompt)) % self.long_every == 0:
                req.min_new_tokens = max(self.long_min_new_tokens - answered, 0)
                self.stats["long_requests"] += 1
        if self.hold_max_new_tokens is not None:   # prompts are remembered only for the hold
            prompt = tuple(req.input_ids)
            if self.hold_armed and req.max_new_tokens == self.hold_max_new_tokens and prompt not in self.seen_prompts:
                req.held, self.hold_armed = True, False
                self.stats["held"] += 1
            self.seen_prompts.add(prompt)
        self.pending.append(req)
        self.stats["requests"] += 1
        self.stats["max_waiting"] = max(self.stats["max_waiting"], len(self.pending))
        self.wakeup.set()
        return await req.future

    def _answer(self, req: Request) -> dict:
        return {
            "text": self.tok.decode(req.tokens, stop_at_eos=False),
            "output_ids": req.tokens,
            "meta_info": {
                "finish_reason": {"type": req.finish},
                "prompt_tokens": len(req.input_ids),
                "completion_tokens": len(req.tokens),
                "cached_tokens": 0,
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(req.logprobs, req.tokens)],
                "weight_version": self.version,
            },
        }

    def _finish(self, req: Request) -> None:
        if req.finish == ABORT:
            self.stats["aborted"] += 1
            if req.held:
                self.stats["held_aborted"] += 1
        if not req.future.done():
            req.future.set_result(self._answer(req))

    def _admit(self) -> None:
        """Waiting requests join the running batch (same sampling key, up to max_batch)."""
        ready = [r for r in self.pending if not r.held]
        if not ready:
            return
        key = self.running[0].key if self.running else ready[0].key
        for r in ready:
            if len(self.running) >= self.max_batch:
                break
            if r.key == key:
                self.pending.remove(r)
                if r.max_new_tokens <= 0:
                    r.finish = LENGTH
                    self._finish(r)
                else:
                    self.running.append(r)

    async def scheduler(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            async with self.step_lock:
                if not self.paused:
                    self._admit()
                batch = list(self.running) if not self.paused else []
                if batch:
                    self.stats["max_batch_seen"] = max(self.stats["max_batch_seen"], len(batch))
                    try:
                        await loop.run_in_executor(self.pool, self._step, batch)
                    except Exception as exc:  # noqa: BLE001 - answer every request, never hang a client
                        for r in batch:
                            r.finish = r.finish or ABORT
                            if not r.future.done():
                                r.future.set_exception(exc)
                    for r in batch:
                        if r.finish is not None:
                            self.running.remove(r)
                            self._finish(r)
            if not batch:
                self.wakeup.clear()
                await self.wakeup.wait()
            else:
                await asyncio.sleep(0)   # let HTTP handlers (new requests, pause) in between steps

    @torch.no_grad()
    def _step(self, batch: list[Request]) -> None:
        """One token for every request of the batch (left-padded full sequences)."""
        pad = self.tok.pad_id
        seqs = [r.input_ids + r.tokens for r in batch]
        B, P = len(seqs), max(len(q) for q in seqs)
        ids = torch.full((B, P), pad, dtype=torch.long)
        attn = torch.zeros((B, P), dtype=torch.long)
        for i, q in enumerate(seqs):
            ids[i, P - len(q):] = torch.tensor(q)
            attn[i, P - len(q):] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits[:, -1].float()
        temperature, top_p = batch[0].temperature, batch[0].top_p
        for i, r in enumerate(batch):
            if len(r.tokens) < r.min_new_tokens:   # SGLang's min_new_tokens: no stop yet
                logits[i, [self.tok.eos_id, *r.stop_ids]] = float("-inf")
        logp = torch.log_softmax(logits / temperature, dim=-1)
        draw = logp
        if top_p < 1.0:
            from epic_slime.runtime.model import _top_p_filter

            draw = _top_p_filter(logp, top_p)
        tok = torch.multinomial(draw.exp(), 1, generator=self.generator).squeeze(-1)
        for i, r in enumerate(batch):
            t = int(tok[i])
            r.tokens.append(t)
            r.logprobs.append(float(logp[i, t]))
            if t == self.tok.eos_id or t in r.stop_ids:
                r.finish = STOP
            elif len(r.tokens) >= r.max_new_tokens:
                r.finish = LENGTH
        self.stats["decode_steps"] += 1

    async def pause(self) -> None:
        self.paused = True
        await self.abort_all(counter="pauses")

    def resume(self) -> None:
        self.paused = False
        self.hold_armed = self.hold_max_new_tokens is not None
        self.wakeup.set()

    async def abort_all(self, counter: str = "abort_requests") -> None:
        """SGLang's ``/abort_request`` with ``abort_all``: waiting requests end with no tokens, the
        running batch with the tokens generated so far (after the step in progress), all with
        finish_reason abort."""
        async with self.step_lock:
            for r in self.pending + self.running:
                r.finish = ABORT
                self._finish(r)
            self.pending.clear()
            self.running.clear()
        self.stats[counter] += 1

    def load(self) -> dict:
        return {"num_running_reqs": len(self.running), "num_waiting_reqs": len(self.pending)}

    async def load_weights(self, path: str) -> None:
        state = torch.load(path, weights_only=True)
        await asyncio.get_running_loop().run_in_executor(self.pool, self.model.load_state_dict, state)
        self.stats["weight_loads"] += 1

    async def join_update_group(self, payload: dict) -> None:
        """slime's ``connect_rollout_engines_from_distributed``, the engine side: rank
        ``rank_offset`` of a gloo group whose rank 0 is the trainer (NCCL on a cluster)."""
        import torch.distributed as dist

        def join():
            store = dist.TCPStore(payload["master_address"], int(payload["master_port"]), int(payload["world_size"]),
                                  is_master=False, timeout=timedelta(seconds=120))
            return dist.ProcessGroupGloo(dist.PrefixStore(payload["group_name"], store), int(payload["rank_offset"]),
                                         int(payload["world_size"]), timedelta(seconds=120))

        if payload.get("backend") not in (None, "gloo", "nccl"):
            raise ValueError(f"backend {payload.get('backend')!r}: the stand-in joins with gloo")
        self.groups[payload["group_name"]] = await asyncio.get_running_loop().run_in_executor(None, join)
        self.stats["update_groups"] += 1

    async def receive_bucket(self, payload: dict) -> None:
        """One bucket of ``update_weights_from_distributed``: tensors by broadcast from rank 0, in
        the order of ``names``, loaded into the model; then the bucket's ``weight_version``."""
        import torch.distributed as dist

        group = self.groups.get(payload["group_name"])
        if group is None:
            raise ValueError(f"group_name {payload['group_name']!r} was never initialised (/init_weights_update_group)")
        params = dict(self.model.named_parameters())
        unknown = [n for n in payload["names"] if n not in params]
        if unknown:
            raise ValueError(f"names not in the model: {unknown[:3]}")

        def receive():
            for name, dtype, shape in zip(payload["names"], payload["dtypes"], payload["shapes"], strict=True):
                tensor = torch.empty(shape, dtype=getattr(torch, dtype))
                opts = dist.BroadcastOptions()
                opts.rootRank, opts.rootTensor = 0, 0
                group.broadcast([tensor], opts).wait()
                with torch.no_grad():
                    params[name].copy_(tensor)

        await asyncio.get_running_loop().run_in_executor(self.pool, receive)
        if payload.get("weight_version") is not None:
            self.version = str(payload["weight_version"])
        self.stats["weight_buckets"] += 1


def make_app(engine: Engine):
    from aiohttp import web

    async def generate(request):
        payload = await request.json()
        try:
            return web.json_response(await engine.generate(payload))
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)

    async def pause(request):
        await engine.pause()
        return web.json_response({"status": "ok"})

    async def resume(request):
        engine.resume()
        return web.json_response({"status": "ok"})

    async def flush(request):
        # SGLang refuses to flush while requests run: say so, as it does (slime retries)
        if engine.running:
            return web.Response(status=400, text="pending requests")
        return web.Response(text="Cache flushed.")

    async def update_from_disk(request):
        payload = await request.json()
        await engine.load_weights(payload["model_path"])
        if payload.get("weight_version") is not None:
            engine.version = str(payload["weight_version"])
        return web.json_response({"success": True, "message": "ok"})

    def weight_update_route(handle):
        """SGLang's answer to a weight-update call: success, or 400 with the reason."""
        async def route(request):
            try:
                await handle(await request.json())
            except ValueError as exc:
                return web.json_response({"success": False, "message": str(exc)}, status=400)
            return web.json_response({"success": True, "message": "ok"})
        return route

    init_group = weight_update_route(engine.join_update_group)
    update_distributed = weight_update_route(engine.receive_bucket)

    async def destroy_group(request):
        payload = await request.json()
        engine.groups.pop(payload["group_name"], None)
        return web.json_response({"success": True, "message": "ok"})

    async def update_version(request):
        payload = await request.json()
        if payload.get("abort_all_requests", True):
            await engine.abort_all(counter="version_update_aborts")
        engine.version = str(payload["new_version"])
        engine.stats["version_updates"] += 1
        return web.json_response({"success": True, "new_version": engine.version})

    async def health(request):
        return web.Response(text="ok")

    async def abort_request(request):
        payload = await request.json()
        if not payload.get("abort_all"):
            return web.json_response({"error": "the stand-in aborts only with abort_all"}, status=400)
        await engine.abort_all()
        return web.Response(text="ok")

    async def loads(request):
        return web.json_response(engine.load())

    async def workers(request):
        host = request.host
        return web.json_response({"workers": [{"url": f"http://{host}"}]})

    async def stats(request):
        return web.json_response({**engine.stats, "version": engine.version, "paused": engine.paused})

    app = web.Application(client_max_size=64 * 2**20)
    app.add_routes([
        web.post("/generate", generate),
        web.post("/pause_generation", pause),
        web.post("/continue_generation", resume),
        web.get("/flush_cache", flush),
        web.post("/flush_cache", flush),
        web.post("/update_weights_from_disk", update_from_disk),
        web.post("/update_weight_version", update_version),
        web.post("/init_weights_update_group", init_group),
        web.post("/update_weights_from_distributed", update_distributed),
        web.post("/destroy_weights_update_group", destroy_group),
        web.post("/abort_request", abort_request),
        web.get("/v1/loads", loads),
        web.get("/health_generate", health),
        web.get("/health", health),
        web.get("/workers", workers),
        web.get("/stats", stats),
    ])
    return app


async def _serve(port_file: str, weights: str | None, max_batch: int, hold_max_new_tokens: int | None,
                 long_every: int | None, long_min_new_tokens: int) -> None:
    from aiohttp import web

    torch.set_num_threads(1)
    model, tok = build_model(weights)
    engine = Engine(model, tok, max_batch, hold_max_new_tokens, long_every, long_min_new_tokens)
    runner = web.AppRunner(make_app(engine), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, port_file)
    await engine.scheduler()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--weights", default=None)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--hold-max-new-tokens", type=int, default=None,
                        help="hold one new training request per weight version until the next pause (see above)")
    parser.add_argument("--long-every", type=int, default=None,
                        help="one prompt in about N (by crc32) gets --long-min-new-tokens (see above)")
    parser.add_argument("--long-min-new-tokens", type=int, default=0)
    args = parser.parse_args(argv)
    if args.long_every is not None and args.long_every < 1:
        parser.error(f"--long-every must be >= 1, got {args.long_every}")
    asyncio.run(_serve(args.port_file, args.weights, args.max_batch, args.hold_max_new_tokens,
                       args.long_every, args.long_min_new_tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
