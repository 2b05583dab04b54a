"""The SGLang engines, the trainer and the clock of one simulated run.

An engine advances its running requests every tick ``dt``: decode step time = t_base + c_tok x batch +
c_kv x (sum of contexts). Prefill (the prompt; after an abort or a retraction, prompt + partial
response: their KV was freed) runs at the engine's prefill rate before decoding. Admission keeps the
contexts plus a ``new_token_ratio`` share of each running request's remaining max_new_tokens within the
KV capacity (SGLang's scheduler reserves the same way); a context that outgrows the cache while
decoding is retracted, as SGLang's ``retract_decode`` does: the request with the fewest decoded tokens
goes back to the front of the queue, its KV freed, to be re-prefilled.

A weight push pauses every engine. ``abort``: every request returns its partial output (the driver
resubmits prompt + partial, which re-prefills). ``in_place``: requests keep their KV and decode on
after the push. ``retract``: the running requests go back to the end of the queue with their
tokens, their output's KV freed; after the push the output is prefilled again on the new weights (the
prompt's KV is matched in the radix tree) and they decode on, unanswered in between (the driver
resubmits nothing). In place and retract, the engine
reports the version at response time only (SGLang 0.5.15), while the simulator keeps each request's
true oldest version beside it (``oldest``) for the report."""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter, deque

from .clock import VirtualLoop
from .presets import Preset


class _Req:
    __slots__ = ("ctx", "remaining", "done", "fut", "prefill_left", "max_new", "oldest", "cached", "record")

    def __init__(self, ctx: int, remaining: int, max_new: int, fut, prefill=None, cached=None, record=None):
        self.ctx, self.remaining, self.done, self.fut = float(ctx), float(remaining), 0.0, fut
        self.prefill_left = float(ctx if prefill is None else prefill)
        self.max_new = float(max_new)
        self.oldest: int | None = None  # engine version of this call's first token
        self.cached = cached  # context tokens the radix tree holds (None: the prompt); what a retract keeps
        self.record = record  # a dict the first decoded token fills (version, time): the agentic stand-in's


class Engine:
    def __init__(self, sim: "Sim", idx: int):
        self.sim, self.idx = sim, idx
        self.version = 0
        self.paused = False
        self.offloaded = False
        self.queue: deque = deque()
        self.running: list[_Req] = []
        self.busy_s = 0.0
        self.decoded = 0.0
        self.prefilled = 0.0
        self.reprefilled = 0.0  # tokens prefilled again: aborted partials and retracted contexts
        self.retractions = 0  # by KV pressure (retract_decode)
        self.push_retractions = 0  # by a push in retract mode
        self.peak_kv = 0.0

    def has_work(self) -> bool:
        return not self.paused and not self.offloaded and bool(self.running or self.queue)

    def load(self) -> int:
        return len(self.running) + len(self.queue)

    def submit(
        self, ctx: int, remaining: int, max_new: int, partial: float = 0, prefill=None, cached=None, record=None
    ):
        """``prefill``: the context tokens to compute before decoding (default: all of ``ctx``); ``partial``:
        how many of them were computed before (counted as re-prefilled)."""
        fut = self.sim.loop.create_future()
        self.queue.append(_Req(ctx, remaining, max_new, fut, prefill, cached, record))
        self.reprefilled += partial
        self.sim.wake()
        return fut

    def abort_all(self) -> None:
        """SGLang's pause in abort mode: every request returns what it produced so far (KV freed)."""
        for req in [*self.running, *self.queue]:
            if not req.fut.done():
                req.fut.set_result((int(req.done), self.version, True, req.oldest))
        self.running, self.queue = [], deque()

    def retract_all(self) -> None:
        """SGLang's pause in retract mode (``ScheduleBatch.retract_all``): every running request goes back
        to the end of the waiting queue (``Scheduler._add_request_to_queue``; the default fcfs policy does
        not sort it), in order, keeping its tokens; its output's KV is freed and prefilled again after the
        push. Its prompt's KV stays in the radix tree (never flushed under retract: the
        waiting requests keep /flush_cache refused) and is matched again, as the real server does
        (tests/slime_adapter/test_real_sglang_retract.py): only the output is re-prefilled. A later turn of
        an agentic trajectory keeps what its submission found cached (``cached``: the earlier turns' prefix)."""
        for req in self.running:
            cached = float(self.sim.p.prompt_len if req.cached is None else req.cached)
            left = max(req.prefill_left, req.ctx - cached)
            self.reprefilled += left - req.prefill_left
            req.prefill_left = left
            self.push_retractions += 1
            self.queue.append(req)
        self.running = []

    def _reserved(self, req: _Req) -> float:
        return req.ctx + self.sim.p.new_token_ratio * max(0.0, req.max_new - req.done)

    def _admit(self) -> None:
        cap = self.sim.p.kv_capacity_tokens
        used = sum(self._reserved(r) for r in self.running)
        while self.queue and (not self.running or used + self._reserved(self.queue[0]) <= cap):
            req = self.queue.popleft()
            used += self._reserved(req)
            self.running.append(req)

    def _retract(self) -> None:
        """Contexts that outgrew the cache: retract the fewest-decoded requests until the rest fit."""
        cap = self.sim.p.kv_capacity_tokens
        used = sum(r.ctx for r in self.running)
        self.peak_kv = max(self.peak_kv, min(used, cap))
        if used <= cap or len(self.running) <= 1:
            return
        order = sorted(self.running, key=lambda r: (r.done, -r.ctx))
        while used > cap and len(self.running) > 1:
            req = order.pop(0)
            self.running.remove(req)
            used -= req.ctx
            req.prefill_left = req.ctx
            self.reprefilled += req.ctx
            self.retractions += 1
            self.queue.appendleft(req)

    def advance(self, dt: float) -> None:
        if not self.has_work():
            return
        p = self.sim.p
        self._admit()
        self.busy_s += dt
        left = dt
        rate = p.engine_prefill_tok_s()
        for req in self.running:  # prefill first (SGLang schedules prefill before decode)
            if req.prefill_left > 0 and left > 0:
                take = min(left, req.prefill_left / rate)
                req.prefill_left -= take * rate
                self.prefilled += take * rate
                left -= take
        decoding = [r for r in self.running if r.prefill_left <= 1e-9]
        if left <= 0 or not decoding:
            return
        if p.fixed_length is not None:
            step = p.c_tok * len(decoding)
        else:
            step = p.t_base + p.c_tok * len(decoding) + p.c_kv * sum(r.ctx for r in decoding)
        steps = left / (step / p.decode_speed)
        keep = []
        for req in self.running:
            if req.prefill_left <= 1e-9:
                if req.oldest is None:
                    req.oldest = self.version
                    if req.record is not None:
                        req.record.update(first_version=self.version, first_t=self.sim.now())
                adv = min(steps, req.remaining - req.done)
                req.done += adv
                req.ctx += adv
                self.decoded += adv
                if req.done >= req.remaining - 1e-9:
                    req.fut.set_result((int(round(req.remaining)), self.version, False, req.oldest))
                    continue
            keep.append(req)
        self.running = keep
        self._retract()


class TrainJob:
    def __init__(self, sim: "Sim", work_s: float):
        self.left = work_s
        self.fut = sim.loop.create_future()


class Sim:
    """Engines, trainer and clock of one simulated run."""

    def __init__(self, p: Preset, colocated: bool):
        self.p = p
        self.colocated = colocated
        self.loop = VirtualLoop()
        asyncio.set_event_loop(self.loop)
        if p.shared_cores is not None:
            rollout_gpus, self.train_gpus = p.total_gpus, p.train_gpus_split
        elif colocated:
            rollout_gpus = self.train_gpus = p.total_gpus
        else:
            self.train_gpus = p.train_gpus_split
            rollout_gpus = p.total_gpus - p.train_gpus_split
        self.rollout_gpus = rollout_gpus
        if p.kv_capacity_tokens <= 0:
            raise ValueError(
                f"{p.name}: the weights do not fit an engine of {p.gpus_per_engine} {p.gpu} GPUs "
                f"(KV capacity {p.kv_capacity_tokens:.0f} tokens)"
            )
        self.engines = [Engine(self, i) for i in range(max(1, rollout_gpus // p.gpus_per_engine))]
        self.train_job: TrainJob | None = None
        self.train_busy_s = 0.0
        self._wake = asyncio.Event()
        self.ticker = self.loop.create_task(self._tick())
        self.rng = random.Random(p.seed)
        self.mu = solve_mu(p.mean_response_len, p.length_sigma, p.max_response_len) if p.fixed_length is None else 0.0
        self.prompt_effect: dict[int, float] = {}
        self.started_groups: Counter = Counter()  # group key -> times started from its fresh prompt
        self.group_length: dict[int, float] = {}  # group key -> mean drawn response length (first start)
        self.group_calls = 0

    def now(self) -> float:
        return self.loop.time()

    def wake(self) -> None:
        self._wake.set()

    async def _tick(self) -> None:
        p = self.p
        while True:
            active = any(e.has_work() for e in self.engines) or self.train_job is not None
            if not active:
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(p.dt)
            factor = 1.0
            if p.shared_cores is not None:
                procs = sum(e.has_work() for e in self.engines) + (self.train_job is not None)
                factor = min(1.0, p.shared_cores / max(1, procs))
            for e in self.engines:
                e.advance(p.dt * factor)
            job = self.train_job
            if job is not None:
                self.train_busy_s += p.dt
                job.left -= p.dt * factor
                if job.left <= 1e-12:
                    self.train_job = None
                    job.fut.set_result(None)

    # --- lengths ---
    def draw_length(self, key: int) -> int:
        return draw_length(self.p, self.mu, self.rng, self.prompt_effect, key)

    # --- training ---
    def train_seconds(self, groups) -> float:
        return train_seconds(self.p, self.train_gpus, [s.response_length for g in groups for s in g])

    def train(self, groups):
        job = TrainJob(self, self.train_seconds(groups))
        self.train_job = job
        self.wake()
        return job.fut


def draw_length(p: Preset, mu: float, rng: random.Random, prompt_effect: dict, key: int) -> int:
    """log L = mu + prompt effect (shared by the group) + sample noise, each with half of sigma^2."""
    if p.fixed_length is not None:
        return p.fixed_length
    s = p.length_sigma / math.sqrt(2)
    if key not in prompt_effect:
        prompt_effect[key] = rng.gauss(0.0, s)
    return max(1, int(math.exp(mu + prompt_effect[key] + rng.gauss(0.0, s))))


def train_seconds(p: Preset, train_gpus: int, response_lengths) -> float:
    if p.train_s_fixed is not None:
        return p.train_s_fixed
    m = p.model
    flops = 0.0
    for length in response_lengths:
        t = p.prompt_len + length
        # 6 N per token (forward + backward) + causal attention 6 L d T (PaLM's 12 L H Q T, halved for the
        # causal mask; Chowdhery et al. 2022, App. B); the reference forward adds a third of that
        per_token = 6 * m["active_params"] + 6 * m["layers"] * m["attn_dim"] * t
        flops += t * per_token * ((8 / 6) if p.ref_forward else 1.0)
    mfu = (p.train_mfu_at or {}).get(train_gpus, p.train_mfu)
    return flops / (train_gpus * p.peak_flops * mfu) + p.update_depth * p.optimizer_step_s


def solve_mu(mean: float, sigma: float, cap: float) -> float:
    """mu of a lognormal whose mean after capping at ``cap`` is ``mean`` (E[min(X, c)], closed form)."""
    from statistics import NormalDist

    phi = NormalDist().cdf

    def capped_mean(mu: float) -> float:
        if sigma == 0:
            return min(math.exp(mu), cap)
        a = (math.log(cap) - mu) / sigma
        return math.exp(mu + sigma**2 / 2) * phi(a - sigma) + cap * (1 - phi(a))

    lo, hi = 0.0, math.log(cap) + 5
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if capped_mean(mid) < mean else (lo, mid)
    return (lo + hi) / 2
