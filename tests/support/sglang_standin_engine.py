"""The SGLang stand-in's engine (``sglang_standin.py`` is its HTTP server and describes the
behaviour): the waiting queue, the running batch and its decode steps, the pause modes, the flush
rules, the prefix cache and the weight loads, on the tiny Qwen3-MoE."""

from __future__ import annotations

import asyncio
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import torch

import sglang_standin_routing as routing  # this folder is sys.path[0] (sglang_standin.py runs as a script)
from sglang_standin_weights import WeightLoads

STOP, LENGTH, ABORT = "stop", "length", "abort"
PAUSE_MODES = ("abort", "retract", "in_place")
FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
    "requests, the operation will not be performed.)\n"
)
FLUSH_FAILED = "Flush cache failed.\n"
UPDATE_FLUSH_ASSERT = "Cache flush failed after updating weights"


def build_model(weights_path: str | None):
    from epic_slime.runtime.model import ModelConfig, build_policy
    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    model = build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=0)
    if weights_path:
        model.load_state_dict(torch.load(weights_path, weights_only=True))
    # SGLang's Qwen3-MoE ignores tie_word_embeddings: its output head is a weight of its own, loaded
    # only under the name lm_head.weight (a push of the tied trainer's parameters leaves it as it was)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    model.eval()
    return model, tok


def finish_reason(req) -> dict:
    """SGLang's ``finish_reason`` dicts (``managers/schedule_batch.py``: FINISH_LENGTH,
    FINISH_MATCHED_TOKEN, FINISH_ABORT ``to_json``)."""
    if req.finish == LENGTH:
        return {"type": LENGTH, "length": len(req.tokens)}
    if req.finish == STOP:
        return {"type": STOP, "matched": req.matched}
    return {"type": ABORT, "message": "Aborted", "status_code": None, "err_type": None}


class Request:
    def __init__(self, payload: dict, future: asyncio.Future, weights: int, version: str):
        params = payload.get("sampling_params") or {}
        if "input_ids" not in payload:
            raise ValueError("this stand-in takes input_ids only (slime sends them for text prompts)")
        self.input_ids = [int(t) for t in payload["input_ids"]]
        self.extra_key = payload.get("extra_key")
        self.held = False
        self.temperature = float(params.get("temperature", 1.0))
        self.top_p = float(params.get("top_p", 1.0))
        self.max_new_tokens = int(params.get("max_new_tokens", 16))
        self.stop_ids = set(params.get("stop_token_ids") or [])
        self.ignore_eos = bool(params.get("ignore_eos", False))  # SGLang: no stop token ends it
        self.min_new_tokens = 0  # set by the engine for the long prompts
        self.future = future
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.finish: str | None = None
        self.matched: int | None = None  # the stop token that ended it
        self.arrived_weights, self.arrived_version = weights, version  # what the submission saw
        self.computed_weights: int | None = None  # the oldest weights any of its KV was computed with
        self.cached_tokens = 0
        self.retractions = 0
        self.want_routing = bool(payload.get("return_routed_experts"))
        self.routing: list[torch.Tensor] = []  # sglang_standin_routing: rows per computed position
        self.kv_segments: list[tuple[int, int]] = []  # (weights, up to position): KV kept across loads


class PrefixCache:
    """Radix trees of token prefixes, one per extra_key; each node keeps the weights it was first
    computed with (SGLang keeps the first copy of a prefix and frees duplicates)."""

    def __init__(self):
        self.trees: dict = {}
        self.opened: dict = {}  # extra_key -> weights when its first request arrived

    def open(self, req: Request) -> None:
        if req.extra_key is not None:
            self.opened.setdefault(req.extra_key, req.arrived_weights)

    def insert(self, key, tokens: list[int], weights: int) -> None:
        node = self.trees.setdefault(key, {})
        for t in tokens:
            node = node.setdefault(t, [weights, {}])[1]

    def match(self, key, tokens: list[int]) -> tuple[int, int | None]:
        """(length of the longest cached prefix, the oldest weights along it)."""
        node, oldest, length = self.trees.get(key, {}), None, 0
        for t in tokens:
            if t not in node:
                break
            weights, node = node[t]
            oldest = weights if oldest is None else min(oldest, weights)
            length += 1
        return length, oldest

    def clear(self) -> None:
        self.trees.clear()


class Engine(WeightLoads):
    def __init__(
        self,
        model,
        tokenizer,
        max_batch: int,
        hold_max_new_tokens: int | None = None,
        long_every: int | None = None,
        long_min_new_tokens: int = 0,
        long_max_new_tokens: int | None = None,
        step_seconds: float = 0.0,
        hold_max_seconds: float | None = None,
        abort_poll_seconds: float = 1.0,
    ):
        self.model, self.tok, self.max_batch = model, tokenizer, max_batch
        self.abort_poll_seconds = abort_poll_seconds  # an abort pause with requests in flight answers after this
        self.step_seconds = step_seconds  # a slower engine on demand (tests that must meet a request mid-decode)
        self.hold_max_new_tokens = hold_max_new_tokens
        self.hold_armed = hold_max_new_tokens is not None
        # a real engine finishes every request: a held one that no pause meets decodes after this long
        # (a batch taken in start order may wait for it, and the next pause waits for that batch)
        self.hold_max_seconds = hold_max_seconds
        self.long_every, self.long_min_new_tokens = long_every, long_min_new_tokens
        self.long_max_new_tokens = long_max_new_tokens
        self.equals_id = tokenizer.token_to_id["="]
        self.seen_prompts: set[tuple[int, ...]] = set()
        self.pending: list[Request] = []  # the scheduler's waiting queue
        self.running: list[Request] = []
        self.paused: str | None = None  # the pause mode, None while generating
        self.unpaused = asyncio.Event()
        self.unpaused.set()
        self.version = "default"
        self.weights = 0  # counts weight loads: which weights computed a prefix
        self.cache = PrefixCache()
        self.wakeup = asyncio.Event()
        self.step_lock = asyncio.Lock()  # a decode step and a pause / abort never interleave
        self.stats = Counter()
        self.groups: dict = {}  # weight-update group name -> gloo process group
        self.pool = ThreadPoolExecutor(1)  # one compute thread: decoding and weight loads serialise
        self.generator = torch.Generator().manual_seed(1234)

    def _prompt_part(self, input_ids: list[int]) -> tuple[list[int], int]:
        """(prompt up to its first "=", response tokens already in input_ids)."""
        end = input_ids.index(self.equals_id) + 1 if self.equals_id in input_ids else len(input_ids)
        return input_ids[:end], len(input_ids) - end

    def _mark_long(self, req: Request) -> None:
        prompt, answered = self._prompt_part(req.input_ids)
        if req.max_new_tokens + answered != self.long_max_new_tokens:
            return  # not a training request (an evaluation has its own response cap)
        if zlib.crc32(bytes(prompt)) % self.long_every == 0:
            req.min_new_tokens = max(self.long_min_new_tokens - answered, 0)
            self.stats["long_requests"] += 1

    async def generate(self, payload: dict) -> dict:
        req = Request(payload, asyncio.get_running_loop().create_future(), self.weights, self.version)
        await self.unpaused.wait()  # paused: the request waits before the scheduler
        self.cache.open(req)
        if self.long_every:
            self._mark_long(req)
        if self.hold_max_new_tokens is not None:  # prompts are remembered only for the hold
            prompt = tuple(req.input_ids)
            if self.hold_armed and req.max_new_tokens == self.hold_max_new_tokens and prompt not in self.seen_prompts:
                req.held, self.hold_armed = True, False
                self.stats["held"] += 1
                if self.hold_max_seconds is not None:
                    asyncio.get_running_loop().call_later(self.hold_max_seconds, self._hold_timed_out, req)
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
                "finish_reason": finish_reason(req),
                "prompt_tokens": len(req.input_ids),
                "completion_tokens": len(req.tokens),
                "cached_tokens": req.cached_tokens,
                "num_retractions": req.retractions,
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(req.logprobs, req.tokens)],
                "weight_version": self.version,  # read now, at answer time
                **routing.answer_field(req),
            },
        }

    def _finish(self, req: Request) -> None:
        if req.finish == ABORT:
            self.stats["aborted"] += 1
            if req.held:
                self.stats["held_aborted"] += 1
        elif self.version != req.arrived_version:
            self.stats["spanning_answers"] += 1  # submitted under one version, answered under another
        if req.computed_weights is not None:
            self.cache.insert(req.extra_key, req.input_ids + req.tokens, req.computed_weights)
        if not req.future.done():
            req.future.set_result(self._answer(req))

    def _prefill(self, req: Request) -> None:
        """Joining the running batch: reuse the longest cached prefix, cache the rest of the prompt."""
        seq = req.input_ids + req.tokens  # a retracted request is prefilled with its output too
        length, oldest = self.cache.match(req.extra_key, seq[:-1])
        if req.retractions == 0:
            req.cached_tokens = length
        if length:
            self.stats["prefix_hits"] += 1
            self.stats["cached_tokens"] += length
            submitted = (
                self.cache.opened.get(req.extra_key, req.arrived_weights)
                if req.extra_key is not None
                else req.arrived_weights
            )
            if oldest < submitted:
                self.stats["stale_prefix_hits"] += 1
                self.stats["stale_prefix_tokens"] += length
            if oldest < self.weights:  # SGLang reuses that KV as it is: the prefix stays on its old weights
                req.kv_segments = [(oldest, length)]
        if req.retractions:
            self.stats["reprefill_tokens"] += len(seq) - length
        req.computed_weights = self.weights if req.computed_weights is None else min(req.computed_weights, self.weights)
        self.cache.insert(req.extra_key, req.input_ids, req.computed_weights)

    def _admit(self) -> None:
        """Waiting requests join the running batch, whatever their sampling settings, up to max_batch."""
        for r in [r for r in self.pending if not r.held]:
            if len(self.running) >= self.max_batch:
                break
            self.pending.remove(r)
            if r.max_new_tokens <= len(r.tokens):
                r.finish = LENGTH
                self._finish(r)
                continue
            self._prefill(r)
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
            else:  # let HTTP handlers (new requests, pause) in between steps
                await asyncio.sleep(self.step_seconds)

    @torch.no_grad()
    def _step(self, batch: list[Request]) -> None:
        """One token for every request of the batch (left-padded full sequences), each drawn with its
        own temperature and top_p."""
        from epic_slime.runtime.model import _top_p_filter

        logits = self.last_logits(batch)  # sglang_standin_weights: old-weight KV of in-place requests
        for i, r in enumerate(batch):
            if len(r.tokens) < r.min_new_tokens:  # SGLang's min_new_tokens: no stop yet
                logits[i, [self.tok.eos_id, *r.stop_ids]] = float("-inf")
            logp = torch.log_softmax(logits[i : i + 1] / r.temperature, dim=-1)
            t = int(torch.multinomial(_top_p_filter(logp, r.top_p).exp(), 1, generator=self.generator))
            r.tokens.append(t)
            r.logprobs.append(float(logp[0, t]))
            if not r.ignore_eos and (t == self.tok.eos_id or t in r.stop_ids):
                r.finish, r.matched = STOP, t
            elif len(r.tokens) >= r.max_new_tokens:
                r.finish = LENGTH
        self.stats["decode_steps"] += 1

    def batch_logits(self, batch: list[Request]) -> torch.Tensor:
        """The next-token logits of each request, one forward over the left-padded full sequences."""
        pad = self.tok.pad_id
        seqs = [r.input_ids + r.tokens for r in batch]
        B, P = len(seqs), max(len(q) for q in seqs)
        ids = torch.full((B, P), pad, dtype=torch.long)
        attn = torch.zeros((B, P), dtype=torch.long)
        for i, q in enumerate(seqs):
            ids[i, P - len(q) :] = torch.tensor(q)
            attn[i, P - len(q) :] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        want_routing = any(r.want_routing for r in batch)
        out = self.model(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False, output_router_logits=want_routing
        )
        if want_routing:
            routing.record(batch, [len(q) for q in seqs], out.router_logits, self.model.config.num_experts_per_tok)
        return out.logits[:, -1].float()

    # -- pause, continue, flush

    def idle(self) -> bool:
        """``Scheduler.is_fully_idle``: nothing running, nothing waiting (requests held before the
        scheduler by a pause do not count)."""
        return not self.running and not self.pending

    async def pause(self, mode: str) -> None:
        if mode not in PAUSE_MODES:
            raise ValueError(f"mode must be one of {PAUSE_MODES}, got {mode!r}")
        self.paused = mode
        self.unpaused.clear()
        if mode == "abort":
            in_flight = bool(self.running or self.pending)
            await self.abort_all(counter="pauses_abort")
            if in_flight:  # SGLang sees them gone only at its next once-a-second check
                await asyncio.sleep(self.abort_poll_seconds)
            return
        async with self.step_lock:  # takes effect after the step in progress
            if mode == "retract":
                for r in self.running:
                    r.retractions += 1
                    r.kv_segments = []  # prefilled again on the weights of the day
                self.stats["retracted"] += len(self.running)
                self.pending.extend(self.running)
                self.running.clear()
            released = [r for r in self.pending if r.held]
            for r in released:  # a held request waits for the next pause only
                r.held = False
            self.stats["held_released"] += len(released)
        self.stats[f"pauses_{mode}"] += 1

    def _hold_timed_out(self, req: Request) -> None:
        if req.held:
            req.held = False
            self.stats["held_timed_out"] += 1
            self.wakeup.set()

    def resume(self) -> None:
        self.paused = None
        self.unpaused.set()
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

    async def flush(self, timeout: float = 0.0) -> bool:
        self.stats["flush_calls"] += 1
        if self.running:
            self.stats["flush_calls_while_running"] += 1
        deadline = asyncio.get_running_loop().time() + timeout
        while not self.idle() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        if not self.idle():
            self.stats["flush_failed"] += 1
            return False
        self.cache.clear()
        self.stats["flushes"] += 1
        return True

    def after_update(self, payload: dict) -> None:
        """The update's own flush (``flush_cache``, default true); a failed one ends the server."""
        self.weights += 1
        if payload.get("flush_cache", True):
            if not self.idle():
                self.stats["update_flush_crashes"] += 1
                raise AssertionError(UPDATE_FLUSH_ASSERT)
            self.cache.clear()
            self.stats["flushes"] += 1
        if payload.get("weight_version") is not None:
            self.version = str(payload["weight_version"])

    def load(self) -> dict:
        """``GET /v1/loads``: one entry per DP rank under ``loads`` (the core fields; a request held
        before the scheduler by a pause is in neither count)."""
        core = {"dp_rank": 0, "num_running_reqs": len(self.running), "num_waiting_reqs": len(self.pending)}
        return {"version": "0.5.15.post1-standin", "loads": [core]}
