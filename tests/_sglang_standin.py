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
(``model_path``: a torch state dict), ``POST /update_weight_version`` (``new_version``),
``POST /abort_request`` (``abort_all``, as slime's synchronous rollout ends a batch), ``GET
/v1/loads`` (running and waiting requests), ``GET /health_generate``, ``GET /workers`` (router
view), ``GET /stats`` (counters for tests).

Batching: requests with equal (temperature, top_p) are decoded together, up to ``max_batch``,
one token per forward with a KV cache. log-prob convention: log_softmax(logits / T)[token].

A slow request on demand (``--hold-max-new-tokens N``): whether a weight push meets requests in
flight depends on how fast this CPU decodes against how fast the trainer steps (on a 2-core CI
machine generation finished before every push, so no push met a request). To make that case
certain, after each ``/continue_generation`` (and at start) the first request with
``max_new_tokens == N`` and a prompt never seen before is held, not decoded, until the next
pause aborts it: a request still running when the weights arrive, as on a busy cluster.
Resubmissions (a prompt seen before) and other requests (eval, with another length) are never held,
so nothing waits on a pause that waits on them.

Run: ``python tests/_sglang_standin.py --port-file F --weights W`` (binds 127.0.0.1 on a free port,
writes it to F).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections import Counter
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
        self.future = future
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.finish: str | None = None

    @property
    def key(self):
        return (self.temperature, self.top_p)


class Engine:
    def __init__(self, model, tokenizer, max_batch: int, hold_max_new_tokens: int | None = None):
        self.model, self.tok, self.max_batch = model, tokenizer, max_batch
        self.hold_max_new_tokens = hold_max_new_tokens
        self.hold_armed = hold_max_new_tokens is not None
        self.seen_prompts: set[tuple[int, ...]] = set()
        self.pending: list[Request] = []
        self.paused = False
        self.version = "default"
        self.wakeup = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()
        self.abort_now = False
        self.stats = Counter()
        self.running = 0
        self.pool = ThreadPoolExecutor(1)   # one compute thread: decoding and weight loads serialise
        self.generator = torch.Generator().manual_seed(1234)

    async def generate(self, payload: dict) -> dict:
        req = Request(payload, asyncio.get_running_loop().create_future())
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

    async def scheduler(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            ready = [r for r in self.pending if not r.held]
            if not ready or self.paused:
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            head = ready[0].key
            batch = [r for r in ready if r.key == head][: self.max_batch]
            for r in batch:
                self.pending.remove(r)
            self.idle.clear()
            self.running = len(batch)
            self.stats["max_batch_seen"] = max(self.stats["max_batch_seen"], len(batch))
            try:
                await loop.run_in_executor(self.pool, self._decode, batch)
            except Exception as exc:  # noqa: BLE001 - answer every request, never hang a client
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(exc)
            finally:
                self.running = 0
                self.idle.set()
            for r in batch:
                if r.finish == ABORT:
                    self.stats["aborted"] += 1
                if not r.future.done():
                    r.future.set_result(self._answer(r))

    @torch.no_grad()
    def _decode(self, batch: list[Request]) -> None:
        from transformers import DynamicCache

        pad = self.tok.pad_id
        B, P = len(batch), max(len(r.input_ids) for r in batch)
        ids = torch.full((B, P), pad, dtype=torch.long)
        attn = torch.zeros((B, P), dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, P - len(r.input_ids):] = torch.tensor(r.input_ids)
            attn[i, P - len(r.input_ids):] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache,
                            use_cache=True).logits[:, -1]
        last = pos[:, -1:]
        temperature, top_p = batch[0].temperature, batch[0].top_p
        for r in batch:
            if r.max_new_tokens <= 0:
                r.finish = LENGTH
        while True:
            if self.abort_now:
                for r in batch:
                    r.finish = r.finish or ABORT
                return
            live = [i for i, r in enumerate(batch) if r.finish is None]
            if not live:
                return
            logp = torch.log_softmax(logits.float() / temperature, dim=-1)
            draw = logp
            if top_p < 1.0:
                from epic_slime.runtime.model import _top_p_filter

                draw = _top_p_filter(logp, top_p)
            tok = torch.multinomial(draw.exp(), 1, generator=self.generator).squeeze(-1)
            for i in live:
                r, t = batch[i], int(tok[i])
                r.tokens.append(t)
                r.logprobs.append(float(logp[i, t]))
                if t == self.tok.eos_id or t in r.stop_ids:
                    r.finish = STOP
                elif len(r.tokens) >= r.max_new_tokens:
                    r.finish = LENGTH
            self.stats["decode_steps"] += 1
            attn = torch.cat([attn, torch.ones((B, 1), dtype=torch.long)], dim=1)
            last = last + 1
            logits = self.model(input_ids=tok.unsqueeze(-1), attention_mask=attn, position_ids=last,
                                past_key_values=cache, use_cache=True).logits[:, -1]

    async def pause(self) -> None:
        self.paused = True
        await self.abort_all(counter="pauses")

    def resume(self) -> None:
        self.paused = False
        self.hold_armed = self.hold_max_new_tokens is not None
        self.wakeup.set()

    async def abort_all(self, counter: str = "abort_requests") -> None:
        """SGLang's ``/abort_request`` with ``abort_all``: waiting requests end with no tokens, the
        running batch with the tokens generated so far, all with finish_reason abort."""
        for r in list(self.pending):
            if r.held:
                self.stats["held_aborted"] += 1
            self.pending.remove(r)
            r.finish = ABORT
            self.stats["aborted"] += 1
            if not r.future.done():
                r.future.set_result(self._answer(r))
        if self.running:
            self.abort_now = True
            await self.idle.wait()
            self.abort_now = False
        self.stats[counter] += 1

    def load(self) -> dict:
        return {"num_running_reqs": self.running, "num_waiting_reqs": len(self.pending)}

    async def load_weights(self, path: str) -> None:
        state = torch.load(path, weights_only=True)
        await asyncio.get_running_loop().run_in_executor(self.pool, self.model.load_state_dict, state)
        self.stats["weight_loads"] += 1


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

    async def update_version(request):
        payload = await request.json()
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
        web.post("/abort_request", abort_request),
        web.get("/v1/loads", loads),
        web.get("/health_generate", health),
        web.get("/health", health),
        web.get("/workers", workers),
        web.get("/stats", stats),
    ])
    return app


async def _serve(port_file: str, weights: str | None, max_batch: int, hold_max_new_tokens: int | None) -> None:
    from aiohttp import web

    torch.set_num_threads(1)
    model, tok = build_model(weights)
    engine = Engine(model, tok, max_batch, hold_max_new_tokens)
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
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.port_file, args.weights, args.max_batch, args.hold_max_new_tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
