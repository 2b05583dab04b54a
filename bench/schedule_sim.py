"""The driver's own schedule loops on a simulated clock: what asynchronous training saves at cluster scale.

    SLIME_PATH=... PYTHONPATH=.:$SLIME_PATH python bench/schedule_sim.py [--preset paper|smoke|all] [--rollouts N]
        [--no-sensitivity] [--json out.json]
    python bench/schedule_sim.py measure-runtime [--steps 30] [--out bench/runtime_measurement.json]

What runs for real (imported, called, not copied):
- ``epic_slime.slime.train.async_training_loop`` / ``sync_training_loop`` / ``push_initial_weights``
  with their real signature ``loop(args, rollout_manager, actor_model, num_rollout_per_epoch, get)``;
- the asynchronous rollout: ``epic_slime.slime.rollout.GroupStream`` (top-up to
  ``--async-groups-in-flight``, replacement of what the batch lacks, abort -> resubmission as
  prompt + partial response, stale requeue with its cap, empty-call version removal) and
  ``epic_slime.slime.rollout._collect`` (``collect_admitted_groups``, ``StalenessGate``,
  ``GroupLedger`` with its accounting check), ``trainer_version_for_rollout``,
  ``oversampling.groups_in_flight``; the synchronous rollout passes its batch through the real
  ``select_groups`` with a K = 0 gate as ``generate_on_policy_rollout`` does;
- slime's ``Sample`` class.

What is simulated: every coroutine runs on an asyncio event loop whose clock is virtual (its
selector advances the clock by the wait instead of sleeping), so ``await asyncio.sleep`` in the
real code costs simulated seconds. ``get`` (the loops' ``ray.get``) runs that loop until the
future is done. The RolloutManager is an actor serving one call at a time (an asyncio lock, FIFO,
as a Ray actor's default max_concurrency 1); the train group's ``update_weights`` first asks the
manager for the engines (``get_updatable_engines_and_lock``, queued behind e.g. generate(r+1)),
then pauses the engines (SGLang's abort mode: every in-flight request returns with its partial
response), pushes for ``push_s`` and continues. slime's ``generate_and_rm_group`` is replaced by
a stand-in that sends each sample to a simulated SGLang engine; an engine advances its running
sequences every tick ``dt``: decode step time = t_base + c_tok x batch + c_kv x (sum of contexts),
admission while the KV cache holds the contexts, prefill (prompt, or prompt + partial response
after an abort: the push flushes the cache) at ``prefill_tok_s`` before decoding.
Evaluation and checkpoints are left out of both schedules (the same cost for both).

The collection poll of ``collect_admitted_groups`` is 0.05 s in slime; here it is ``poll_s``
(default 0.5 simulated s: at most that much latency per rollout, to keep the simulation fast).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import math
import random
import selectors
import sys
from collections import Counter, deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# ---------------------------------------------------------------------------------------------
# Inputs. Each default says where it comes from; "assumed" marks a number with no published source.
# ---------------------------------------------------------------------------------------------
PAPER_ROLLOUTS = 300   # paper Table 2 "training steps 300"; launch/qwen3_30b_epic.sh NUM_ROLLOUT=300

# Qwen3-30B-A3B (configs/models/qwen3_30b_a3b.yaml; Qwen3 model card): 48 layers, 32 query heads x 128,
# 4 KV heads x 128, 128 experts top-8, 3.3B activated parameters.
QWEN3_30B = dict(active_params=3.3e9, layers=48, attn_dim=32 * 128, kv_bytes_per_token=48 * 2 * 4 * 128 * 2)
# Qwen2.5-0.5B (configs/models/qwen2.5_0.5b.yaml; HF config): 24 layers, 14 x 64 heads, 2 KV heads x 64,
# 0.49B parameters (0.36B without embeddings).
QWEN25_05B = dict(active_params=0.49e9, layers=24, attn_dim=14 * 64, kv_bytes_per_token=24 * 2 * 2 * 64 * 2)

H100_BF16_FLOPS = 989e12          # NVIDIA H100 SXM datasheet, dense BF16 (the paper's GPU type is not stated: assumed H100)
H100_HBM_BYTES_S = 3.35e12        # NVIDIA H100 SXM datasheet


@dataclasses.dataclass
class Preset:
    name: str
    # --- the run (configs/paper/table2.yaml; launch scripts) ---
    rollout_batch_size: int = 64          # Table 2: 64 prompts per rollout
    n_samples: int = 8                    # Table 2: 8 samples per prompt
    update_depth: int = 8                 # Table 2: D = 8
    oversample_ratio: float = 0.1         # Table 2: 0.1 (-> 72 groups in flight, oversampling.groups_in_flight)
    max_response_len: int = 16384         # Table 2
    prompt_len: int = 250                 # assumed: DAPO-Math-17K prompts with the chat template, a few hundred tokens
    # response lengths: lognormal, capped at max_response_len (a capped sample is TRUNCATED);
    # log L = mu + prompt effect + sample noise, each with half the variance sigma^2 (assumed split).
    mean_response_len: float = 9000.0     # the paper's setting per the issue: mean about 9K (assumed shape: lognormal)
    length_sigma: float = 0.6             # assumed: the long tail (sensitivity table varies it)
    fixed_length: int | None = None       # every response this long (the runtime preset)
    # --- GPUs ---
    total_gpus: int = 32                  # launch/qwen3_30b_epic.sh: 4 nodes x 8
    train_gpus_split: int = 16            # ACTOR_NODES = NUM_NODES / 2 -> 16 Megatron GPUs
    gpus_per_engine: int = 8              # rollout-num-gpus-per-engine 8 (configs/models/qwen3_30b_a3b.yaml)
    # --- SGLang engine (per engine of gpus_per_engine GPUs) ---
    t_base: float = 0.010                 # decode step at batch 1: TPOT 9.6-10.6 ms for Qwen3-30B-A3B on one A100
                                          # (tenstorrent/tt-inference-server#340); assumed the same on a TP/EP-8 engine
                                          # (more bandwidth, all-to-all overhead)
    c_tok: float = 0.0                    # per running sequence per step (compute), set from the model below
    c_kv: float = 0.0                     # per context token per step (KV reads), set from the model below
    hbm_efficiency: float = 0.6           # assumed share of HBM bandwidth decode attention reaches
    decode_mfu: float = 0.2               # assumed MFU of the decode matmuls at large batch
    decode_speed: float = 1.0             # multiplies decode throughput (sensitivity table)
    prefill_tok_s: float = 100_000.0      # assumed per 8-GPU engine (one A100 prefills 25-54K tok/s at 2-4K prompts,
                                          # tenstorrent#340); prompt + partial response after each push (cache flushed)
    kv_capacity_tokens: float = 2.0e6     # per engine: 8 x (80 GB x 0.7 mem fraction - 61 GB / 8 weights) / 98 KB per
                                          # token, halved for KV heads replicated over TP 8 (4 KV heads) - our arithmetic
    # --- Megatron ---
    train_mfu: float = 0.25               # assumed MFU of Megatron MoE training (TP4 EP8, full recompute)
    ref_forward: bool = True              # Table 2 uses a KL loss: one reference forward (2 N per token) per rollout
    optimizer_step_s: float = 1.5         # assumed: CPU Adam (--optimizer-cpu-offload) step, per optimizer step
    # --- weight movement (seconds) ---
    push_s_split: float = 20.0            # "tens of seconds per push for 30B-A3B over NCCL" (issue 20); assumed 20
    push_s_colocated: float = 7.0         # slime's colocated update_weights_from_tensor for Qwen3-30B-A3B: 60 s -> 7 s
                                          # (Biao He, Zilin Zhu, Ji Li, "Optimizing Weight Sync in slime", hebiao064.github.io/rl-weight-sync)
    offload_s: float = 3.0                # assumed: SGLang memory release / resume (torch_memory_saver) per call
    # --- model ---
    model: dict = dataclasses.field(default_factory=lambda: dict(QWEN3_30B))
    peak_flops: float = H100_BF16_FLOPS
    hbm_bytes_s: float = H100_HBM_BYTES_S
    # --- simulation ---
    dt: float = 1.0                       # tick of the engines and the trainer (simulated s)
    poll_s: float = 0.5
    shared_cores: float | None = None     # runtime preset: engines and trainer share this many CPU cores
    train_s_fixed: float | None = None    # runtime preset: measured train step
    seed: int = 0
    paper_rollouts: int = PAPER_ROLLOUTS

    def derived(self) -> "Preset":
        p = dataclasses.replace(self)
        if p.c_kv == 0.0 and p.fixed_length is None:
            p.c_kv = p.model["kv_bytes_per_token"] / (p.gpus_per_engine * p.hbm_bytes_s * p.hbm_efficiency)
        if p.c_tok == 0.0 and p.fixed_length is None:
            p.c_tok = 2 * p.model["active_params"] / (p.gpus_per_engine * p.peak_flops * p.decode_mfu)
        return p


def paper_preset(**kw) -> Preset:
    return Preset(name="paper: Qwen3-30B-A3B, 32 GPUs", **kw).derived()


def smoke_preset(**kw) -> Preset:
    # launch/smoke_1gpu.sh + configs/smoke/one_gpu.yaml: 8 prompts x 8, D = 2, responses capped at 1024,
    # one GPU colocated; Table 2's oversampling 0.1 (no effect at K = 0; the async rows use 9 groups)
    base = dict(rollout_batch_size=8, n_samples=8, update_depth=2, max_response_len=1024, mean_response_len=600.0,
                total_gpus=1, train_gpus_split=1, gpus_per_engine=1, t_base=0.006, prefill_tok_s=20_000.0,
                kv_capacity_tokens=1.0e6, train_mfu=0.15, optimizer_step_s=0.05, push_s_split=1.0,
                push_s_colocated=0.5, offload_s=1.0, model=dict(QWEN25_05B), dt=0.05, poll_s=0.05)
    # mean 600 of 1024: assumed (a 0.5B instruct model on DAPO math); t_base 6 ms: assumed for a 0.5B model on one GPU;
    # pushes: assumed (1 GB of bf16 weights)
    base.update(kw)
    return Preset(name="smoke: Qwen2.5-0.5B, 1 GPU", **base).derived()


# ---------------------------------------------------------------------------------------------
# A virtual-time asyncio loop
# ---------------------------------------------------------------------------------------------
class _AdvancingSelector(selectors.SelectSelector):
    """select(timeout) advances the loop's virtual clock by timeout and reports no I/O."""

    def __init__(self):
        super().__init__()
        self.clock: list[float] = [0.0]

    def select(self, timeout=None):
        if timeout is None:
            raise RuntimeError("simulation deadlock: nothing is scheduled and nothing is ready")
        if timeout > 0:
            self.clock[0] += timeout
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self):
        sel = _AdvancingSelector()
        self._clock = sel.clock
        super().__init__(selector=sel)

    def time(self) -> float:
        return self._clock[0]


# ---------------------------------------------------------------------------------------------
# Simulated SGLang engines, trainer, manager
# ---------------------------------------------------------------------------------------------
class _Req:
    __slots__ = ("ctx", "remaining", "done", "fut", "prefill_left")

    def __init__(self, ctx: int, remaining: int, fut):
        self.ctx, self.remaining, self.done, self.fut = float(ctx), float(remaining), 0.0, fut
        self.prefill_left = float(ctx)


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

    def has_work(self) -> bool:
        return not self.paused and not self.offloaded and bool(self.running or self.queue)

    def submit(self, ctx: int, remaining: int):
        fut = self.sim.loop.create_future()
        self.queue.append(_Req(ctx, remaining, fut))
        self.sim.wake()
        return fut

    def abort_all(self) -> None:
        """SGLang's pause in abort mode: every request returns what it produced so far."""
        for req in [*self.running, *self.queue]:
            if not req.fut.done():
                req.fut.set_result((int(req.done), self.version, True))
        self.running, self.queue = [], deque()

    def _admit(self) -> None:
        p = self.sim.p
        used = sum(r.ctx for r in self.running)
        while self.queue and (not self.running or used + self.queue[0].ctx <= p.kv_capacity_tokens):
            req = self.queue.popleft()
            used += req.ctx
            self.running.append(req)

    def advance(self, dt: float) -> None:
        if not self.has_work():
            return
        p = self.sim.p
        self._admit()
        self.busy_s += dt
        left = dt
        for req in self.running:          # prefill first (SGLang schedules prefill before decode)
            if req.prefill_left > 0 and left > 0:
                take = min(left, req.prefill_left / p.prefill_tok_s)
                req.prefill_left -= take * p.prefill_tok_s
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
                adv = min(steps, req.remaining - req.done)
                req.done += adv
                req.ctx += adv
                self.decoded += adv
                if req.done >= req.remaining - 1e-9:
                    req.fut.set_result((int(round(req.remaining)), self.version, False))
                    continue
            keep.append(req)
        self.running = keep


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
        self.engines = [Engine(self, i) for i in range(max(1, rollout_gpus // p.gpus_per_engine))]
        self.train_job: TrainJob | None = None
        self.train_busy_s = 0.0
        self._wake = asyncio.Event()
        self.ticker = self.loop.create_task(self._tick())
        self.rng = random.Random(p.seed)
        self.mu = _solve_mu(p.mean_response_len, p.length_sigma, p.max_response_len) if p.fixed_length is None else 0.0
        self.prompt_effect: dict[int, float] = {}
        self.started_groups: Counter = Counter()    # group key -> times started from its fresh prompt
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
        p = self.p
        if p.fixed_length is not None:
            return p.fixed_length
        s = p.length_sigma / math.sqrt(2)
        if key not in self.prompt_effect:
            self.prompt_effect[key] = self.rng.gauss(0.0, s)
        return max(1, int(math.exp(self.mu + self.prompt_effect[key] + self.rng.gauss(0.0, s))))

    # --- training ---
    def train_seconds(self, groups) -> float:
        p = self.p
        if p.train_s_fixed is not None:
            return p.train_s_fixed
        m = p.model
        flops = 0.0
        for group in groups:
            for s in group:
                t = p.prompt_len + s.response_length
                # 6 N per token (forward + backward) + causal attention 6 L d T (PaLM's 12 L H Q T, halved for the
                # causal mask; Chowdhery et al. 2022, App. B); the reference forward adds a third of that
                per_token = 6 * m["active_params"] + 6 * m["layers"] * m["attn_dim"] * t
                flops += t * per_token * ((8 / 6) if p.ref_forward else 1.0)
        return flops / (self.train_gpus * p.peak_flops * p.train_mfu) + p.update_depth * p.optimizer_step_s

    def train(self, groups):
        job = TrainJob(self, self.train_seconds(groups))
        self.train_job = job
        self.wake()
        return job.fut


def _solve_mu(mean: float, sigma: float, cap: float) -> float:
    """mu of a lognormal whose mean after capping at ``cap`` is ``mean`` (E[min(X, c)], closed form)."""
    from statistics import NormalDist

    phi = NormalDist().cdf

    def capped_mean(mu: float) -> float:
        if sigma == 0:
            return min(math.exp(mu), cap)
        a = (math.log(cap) - mu) / sigma
        return math.exp(mu + sigma ** 2 / 2) * phi(a - sigma) + cap * (1 - phi(a))

    lo, hi = 0.0, math.log(cap) + 5
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if capped_mean(mid) < mean else (lo, mid)
    return (lo + hi) / 2


class _Remote:
    def __init__(self, actor, fn):
        self.actor, self.fn = actor, fn

    def remote(self, *args, **kwargs):
        return self.actor.sim.loop.create_task(self.actor.serve(self.fn, *args, **kwargs))


class SimRolloutManager:
    """slime's RolloutManager as seen by the driver: one call at a time."""

    def __init__(self, sim: Sim, args, stream, data_source):
        self.sim, self.args, self.stream, self.data_source = sim, args, stream, data_source
        self._lock = asyncio.Lock()
        self.gates: dict[int, Any] = {}
        self.batches: dict[int, dict] = {}
        for name in ("generate", "eval", "save", "offload", "onload_weights", "onload_kv",
                     "get_updatable_engines_and_lock", "check_weights", "dispose"):
            setattr(self, name, _Remote(self, getattr(self, "_" + name)))

    async def serve(self, fn, *args, **kwargs):
        async with self._lock:
            return await fn(*args, **kwargs)

    async def _generate(self, rollout_id: int):
        from epic_slime.slime import rollout as ro
        from epic_slime.staleness import StalenessGate, select_groups, trainer_version_for_rollout, sample_version

        args, sim = self.args, self.sim
        t0 = sim.now()
        trainer_version = trainer_version_for_rollout(rollout_id, args.start_rollout_id)
        if args.max_staleness == 0:
            # slime's synchronous rollout: one batch with the engines' weights, checked by the real K = 0 gate
            groups = [g for g in self.data_source.get_samples(args.rollout_batch_size)]
            groups = list(await asyncio.gather(*[_generate_group(args, g) for g in groups]))
            versions = [[sample_version(s.weight_versions, s.index) for s in g] for g in groups]
            gate = StalenessGate(0, "drop")
            admitted, _ = select_groups(groups, versions, trainer_version, gate, target=len(groups))
            if len(admitted) != len(groups):
                raise RuntimeError("synchronous batch off policy: the simulated push order is wrong")
            for g in groups:
                self.data_source.ledger.deliver(ro.group_key(g), rollout_id)
            self.data_source.ledger.close_rollout(rollout_id - 1)
        else:
            gate = StalenessGate(args.max_staleness, args.stale_policy)
            groups, _, _ = await ro._collect(args, self.stream, trainer_version, gate, rollout_id)
        self.gates[rollout_id] = gate
        self.batches[rollout_id] = dict(start=t0, end=sim.now(),
                                        tokens=sum(s.response_length for g in groups for s in g))
        return groups

    async def _get_updatable_engines_and_lock(self):
        return self.sim.engines

    async def _offload(self):
        for e in self.sim.engines:
            e.offloaded = True
        await asyncio.sleep(self.sim.p.offload_s)

    async def _onload_weights(self):
        await asyncio.sleep(self.sim.p.offload_s / 2)

    async def _onload_kv(self):
        await asyncio.sleep(self.sim.p.offload_s / 2)
        for e in self.sim.engines:
            e.offloaded = False
        self.sim.wake()

    async def _eval(self, rollout_id):
        return None

    async def _save(self, rollout_id):
        return None

    async def _check_weights(self, action=None):
        return None

    async def _dispose(self):
        return None


class SimTrainGroup:
    """slime's RayTrainGroup: async_train returns futures; update_weights blocks the driver and each
    train actor first asks the RolloutManager for the engines (queued behind the call in progress)."""

    def __init__(self, sim: Sim, manager: SimRolloutManager, push_s: float, push_waits_for_manager: bool = True):
        self.sim, self.manager, self.push_s = sim, manager, push_s
        self.push_waits_for_manager = push_waits_for_manager
        self.version = 0
        self.pushes: list[tuple[float, float]] = []
        self.trains: list[tuple[float, float]] = []

    def async_train(self, rollout_id: int, data):
        t0 = self.sim.now()
        fut = self.sim.train(data)
        fut.add_done_callback(lambda _f: self.trains.append((t0, self.sim.now())))
        return [fut]

    async def _push(self):
        if self.push_waits_for_manager:
            await self.manager.get_updatable_engines_and_lock.remote()
        t0 = self.sim.now()
        self.version += 1
        for e in self.sim.engines:
            e.paused = True
            e.abort_all()
        await asyncio.sleep(self.push_s)
        for e in self.sim.engines:
            e.version = self.version
            e.paused = False
        self.sim.wake()
        self.pushes.append((t0, self.sim.now()))

    def update_weights(self):
        self.sim.loop.run_until_complete(self._push())

    def save_model(self, rollout_id, force_sync=False):
        return None

    def clear_memory(self):
        return None

    def create(self):
        return None


# The stand-in for slime's generate_and_rm_group (same signature): every unfinished sample of the group
# goes to the least-loaded engine, as prompt + its partial response; the engine's weight_version is
# appended per call (slime's convention; GroupStream removes the version of a call that added no token).
_ACTIVE_SIM: list[Sim] = []


async def _generate_group(args, group, sampling_params=None, evaluation=False):
    from slime.utils.types import Sample

    sim = _ACTIVE_SIM[-1]
    sim.group_calls += 1
    pending = []
    for s in group:
        if s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED):
            continue
        target = s.metadata["sim_target"]
        engine = min(sim.engines, key=lambda e: len(e.running) + len(e.queue))
        pending.append((s, engine.submit(sim.p.prompt_len + s.response_length, target - s.response_length)))
    for s, fut in pending:
        tokens, version, aborted = await fut
        s.response_length += tokens
        s.weight_versions.append(str(version))
        if aborted:
            s.status = Sample.Status.ABORTED
        elif s.response_length >= sim.p.max_response_len:
            s.status = Sample.Status.TRUNCATED
        else:
            s.status = Sample.Status.COMPLETED
    return group


class SimDataSource:
    """StreamingDataSource's interface for the stream: numbered prompts, the real GroupLedger."""

    def __init__(self, sim: Sim, n_samples: int):
        from epic_slime.staleness import GroupLedger

        self.sim, self.n_samples = sim, n_samples
        self.ledger = GroupLedger()
        self._returned: deque = deque()
        self.next = 0

    def _fresh(self, key: int):
        from slime.utils.types import Sample

        self.sim.started_groups[key] += 1
        group = []
        for j in range(self.n_samples):
            target = min(self.sim.draw_length(key), self.sim.p.max_response_len)
            group.append(Sample(group_index=key, index=key * self.n_samples + j, response_length=0,
                                weight_versions=[], metadata={"sim_target": target}))
        return group

    def get_samples(self, n: int):
        out = []
        for _ in range(n):
            key, self.next = self.next, self.next + 1
            group = self._fresh(key)
            self.ledger.consume(key, None)
            out.append(group)
        return out

    def fresh_group(self, key: int):
        return self._fresh(key)


@contextlib.contextmanager
def _patched(sim: Sim, poll_s: float):
    """slime's generate_and_rm_group -> the engine stand-in; the collection poll -> poll_s."""
    import slime.rollout.sglang_rollout as sglang_rollout

    import epic_slime.slime.rollout as ro
    from epic_slime.staleness import collect_admitted_groups

    saved = (sglang_rollout.generate_and_rm_group, ro.collect_admitted_groups)
    sglang_rollout.generate_and_rm_group = _generate_group
    ro.collect_admitted_groups = functools.partial(collect_admitted_groups, poll_seconds=poll_s)
    _ACTIVE_SIM.append(sim)
    try:
        yield
    finally:
        sglang_rollout.generate_and_rm_group, ro.collect_admitted_groups = saved
        _ACTIVE_SIM.pop()


def _real_group_stream(sim: Sim, args, data_source, capacity: int):
    """The real GroupStream, built by its own __init__ on the virtual loop."""
    import slime.rollout.sglang_rollout as sglang_rollout
    import slime.utils.async_utils as async_utils

    import epic_slime.slime.rollout as ro

    class _Now:
        def __init__(self, value):
            self.value = value

        def result(self):
            return self.value

    shim = SimpleNamespace(**{k: getattr(asyncio, k) for k in dir(asyncio) if not k.startswith("__")})
    shim.run_coroutine_threadsafe = lambda coro, loop: _Now(loop.run_until_complete(coro))
    saved = (async_utils.get_async_loop, sglang_rollout.GenerateState, ro.asyncio)
    async_utils.get_async_loop = lambda: SimpleNamespace(loop=sim.loop)
    sglang_rollout.GenerateState = lambda a: SimpleNamespace(sampling_params={})
    ro.asyncio = shim
    try:
        return ro.GroupStream(args, data_source, capacity)
    finally:
        async_utils.get_async_loop, sglang_rollout.GenerateState, ro.asyncio = saved


# ---------------------------------------------------------------------------------------------
# One schedule
# ---------------------------------------------------------------------------------------------
SCHEDULES = {
    "sync colocated": dict(max_staleness=0, colocated=True),
    "sync split": dict(max_staleness=0, colocated=False),
    "async K=1": dict(max_staleness=1, colocated=False),
    "async K=2": dict(max_staleness=2, colocated=False),
    "async K=4": dict(max_staleness=4, colocated=False),
}


def driver_groups_in_flight(batch: int, ratio: float, max_staleness: int) -> int:
    """Groups in flight as the driver sets them (``command_line.oversampling_flags``): the oversampled
    batch at K >= 2, the batch itself at K = 0 and K = 1 (the ratio is not applied there)."""
    from epic_slime.slime.command_line import oversampling_flags, read_command_line

    parsed = read_command_line(["--rollout-batch-size", str(batch), "--oversample-ratio", str(ratio),
                                "--max-staleness", str(max_staleness)], check=False).parsed
    out = oversampling_flags(parsed)
    return int(out[1]) if out else batch


def simulate(p: Preset, schedule: str, rollouts: int = 12, warmup: int = 2, *, push_waits_for_manager: bool = True,
             loop_fn=None) -> dict:
    """Runs the real driver loop of ``schedule`` for ``rollouts`` rollouts; steady state = after ``warmup``."""
    from epic_slime.slime import train

    spec = SCHEDULES[schedule]
    colocated = spec["colocated"] and p.shared_cores is None
    sim = Sim(p, colocated)
    k = spec["max_staleness"]
    args = SimpleNamespace(
        start_rollout_id=0, num_rollout=rollouts, eval_interval=None, save_interval=None,
        rollout_global_dataset=True, offload_rollout=colocated, offload_train=colocated, release_train=False,
        max_staleness=k, stale_policy="drop", rollout_batch_size=p.rollout_batch_size,
        n_samples_per_prompt=p.n_samples, oversample_ratio=p.oversample_ratio,
        async_groups_in_flight=driver_groups_in_flight(p.rollout_batch_size, p.oversample_ratio, k),
        use_rollout_routing_replay=False, use_wandb=False, use_tensorboard=False, check_weight_update_equal=False,
    )
    data_source = SimDataSource(sim, p.n_samples)
    push_s = p.push_s_colocated if colocated else p.push_s_split
    with _patched(sim, p.poll_s):
        stream = _real_group_stream(sim, args, data_source, args.async_groups_in_flight) if k != 0 else None
        manager = SimRolloutManager(sim, args, stream, data_source)
        actor = SimTrainGroup(sim, manager, push_s, push_waits_for_manager)

        def get(ref):
            if isinstance(ref, list):
                return sim.loop.run_until_complete(asyncio.gather(*ref))
            if isinstance(ref, asyncio.Future):
                return sim.loop.run_until_complete(ref)
            return ref

        train.push_initial_weights(args, manager, actor, get)
        t_start = sim.now()
        loop = loop_fn or (train.sync_training_loop if k == 0 else train.async_training_loop)
        trace = loop(args, manager, actor, None, get)
        t_end = sim.now()
        sim.ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            sim.loop.run_until_complete(sim.ticker)
    # steady state: from the end of the warmup-th training to the end of the last one
    ends = [b for _, b in actor.trains]
    steady_s = (ends[-1] - ends[warmup - 1]) / (len(ends) - warmup) if len(ends) > warmup else (t_end - t_start) / rollouts
    hist: Counter = Counter()
    dropped = requeued = 0
    for r, gate in manager.gates.items():
        if r >= warmup:
            hist.update(gate.histogram)
        dropped += gate.dropped_groups
        requeued += gate.requeued_groups
    wall = t_end - t_start
    n_eng = len(sim.engines)
    rollout_util = sum(e.busy_s for e in sim.engines) / (n_eng * wall)
    train_util = sim.train_busy_s / wall
    # GPUs held: all of them colocated; the train GPUs plus the engines' otherwise (the smoke preset's split rows need a 2nd GPU)
    gpus = p.total_gpus if colocated else sim.train_gpus + len(sim.engines) * p.gpus_per_engine
    if colocated:
        pool_util = {"shared pool": (sum(e.busy_s for e in sim.engines) / n_eng + sim.train_busy_s) / wall}
    else:
        pool_util = {"rollout pool": rollout_util, "train pool": train_util}
    return dict(
        schedule=schedule, preset=p.name, rollouts=rollouts, wall_s=wall, s_per_rollout=steady_s,
        utilisation=pool_util, staleness_hist=dict(sorted(hist.items())), dropped_groups=dropped,
        requeued_groups=requeued, abort_resubmits=stream.abort_resubmits if stream else 0,
        stale_requeues=stream.stale_requeues if stream else 0,
        started_groups=sum(sim.started_groups.values()), gpus=gpus,
        gpu_hours_paper_run=steady_s * p.paper_rollouts * gpus / 3600.0,
        mean_response=sum(b["tokens"] for b in manager.batches.values()) / (len(manager.batches) * p.rollout_batch_size * p.n_samples),
        trace=trace, pushes=actor.pushes, trains=actor.trains, batches=manager.batches,
        per_rollout_hist={r: dict(g.histogram) for r, g in manager.gates.items()},
    )


def _split_heading(p: Preset) -> str:
    """The split rows' GPUs; on a preset too small to split, the extra GPU they assume is said."""
    rollout = p.total_gpus - p.train_gpus_split
    if rollout >= p.gpus_per_engine:
        return f"split {rollout} rollout : {p.train_gpus_split} train GPUs"
    return (f"{p.total_gpus} GPU colocated; the split and async rows add {p.gpus_per_engine} rollout GPU "
            f"({p.gpus_per_engine} rollout : {p.train_gpus_split} train, counted in their GPU-h)")


def run_preset(p: Preset, rollouts: int, schedules=tuple(SCHEDULES)) -> list[dict]:
    return [simulate(p, s, rollouts) for s in schedules]


def format_table(rows: list[dict]) -> str:
    out = [f"{'schedule':16s} {'s/rollout':>9s} {'GPU util':28s} {'staleness hist (steady)':26s} {'drop':>4s} "
           f"{'requeue':>7s} {'aborts':>6s} {'GPU-h (300)':>11s}"]
    for r in rows:
        util = ", ".join(f"{k.split()[0]} {v:.0%}" for k, v in r["utilisation"].items())
        hist = " ".join(f"{k}:{v}" for k, v in r["staleness_hist"].items())
        out.append(f"{r['schedule']:16s} {r['s_per_rollout']:9.1f} {util:28s} {hist:26s} {r['dropped_groups']:4d} "
                   f"{r['requeued_groups']:7d} {r['abort_resubmits']:6d} {r['gpu_hours_paper_run']:11.1f}")
    by = {r["schedule"]: r for r in rows}
    if "async K=2" in by and "sync colocated" in by and "sync split" in by:
        out.append(f"async K=2 / sync split: {by['sync split']['s_per_rollout'] / by['async K=2']['s_per_rollout']:.2f}x")
        out.append(f"async K=2 / sync: {by['sync colocated']['s_per_rollout'] / by['async K=2']['s_per_rollout']:.2f}x"
                   "   (sync = colocated on all GPUs, the paper's and verl's baseline)")
    return "\n".join(out)


def sensitivity(rollouts: int = 8, speeds=(0.5, 1.0, 2.0), sigmas=(0.3, 0.6, 0.9)) -> str:
    lines = ["async K=2 / sync colocated (async K=2 / sync split), paper preset",
             f"{'decode x':>8s} | " + " | ".join(f"sigma {s:.1f}".center(15) for s in sigmas)]
    for speed in speeds:
        cells = []
        for sigma in sigmas:
            p = paper_preset(decode_speed=speed, length_sigma=sigma)
            rows = {s: simulate(p, s, rollouts)["s_per_rollout"] for s in ("sync colocated", "sync split", "async K=2")}
            cells.append(f"{rows['sync colocated'] / rows['async K=2']:.2f} ({rows['sync split'] / rows['async K=2']:.2f})".center(15))
        lines.append(f"{speed:8.1f} | " + " | ".join(cells))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The embedded runtime: its measured times as a preset, and the measurement itself
# ---------------------------------------------------------------------------------------------
def runtime_preset(m: dict, **kw) -> Preset:
    """The embedded runtime on its CPU cores: ``num_rollout_workers`` engines, each generating a request of
    ``prompts_per_request`` prompts in the measured ``gen_request_s`` (throughput-bound: a decode step costs
    c_tok per running sequence), the measured ``train_step_s``, all sharing ``cores`` (processor sharing)."""
    workers = m["num_rollout_workers"]
    seqs_per_request = m["rollout_batch_size"] // workers * m["n_samples_per_prompt"]
    length = max(1, round(m["mean_response_len"]))
    base = dict(rollout_batch_size=m["rollout_batch_size"], n_samples=m["n_samples_per_prompt"],
                update_depth=m["update_depth"], oversample_ratio=0.0, max_response_len=10 ** 9, prompt_len=0,
                fixed_length=length, total_gpus=workers, train_gpus_split=1, gpus_per_engine=1,
                c_tok=m["gen_request_s"] / (seqs_per_request * length), prefill_tok_s=1e18, kv_capacity_tokens=1e18,
                push_s_split=m.get("push_s", 0.0), push_s_colocated=0.0, offload_s=0.0,
                shared_cores=m["cores"], train_s_fixed=m["train_step_s"], dt=m["train_step_s"] / 200, poll_s=0.001,
                paper_rollouts=0)
    base.update(kw)
    return Preset(name="embedded runtime (measured times)", **base)


def measure_runtime(steps: int, out: Path, config: str) -> dict:
    """Times one generation request and one train step of the runtime's config in this process (one thread,
    alone), then runs the runtime itself (async, then sync) and records its measured async/sync ratio."""
    import statistics
    import tempfile
    import time

    import torch

    from epic_slime.runtime.config import parse_config
    from epic_slime.runtime.driver import run_training
    from epic_slime.runtime.rollout import PolicyEngine
    from epic_slime.runtime.tasks import train_problem
    from epic_slime.runtime.trainer import PolicyTrainer, group_advantages
    from epic_slime.runtime.warmstart import warm_start_for

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="epic_slime_schedsim_"))
    cfg = parse_config(["--config", config, "--output-dir", str(root / "probe")])
    state, _ = warm_start_for(cfg)
    engine = PolicyEngine(cfg.model, state, 0, dtype=cfg.rollout_dtype, seed=cfg.seed)
    per_request = max(1, cfg.rollout_batch_size // cfg.num_rollout_workers)
    sampling = dict(n_samples=cfg.n_samples_per_prompt, temperature=cfg.rollout_temperature, top_p=cfg.rollout_top_p,
                    max_new_tokens=cfg.rollout_max_response_len, seed=cfg.seed)
    gen_s, groups = [], []
    for i in range(6):
        reqs = [(j, train_problem(j, cfg.seed, cfg.task)) for j in range(i * per_request, (i + 1) * per_request)]
        t = time.perf_counter()
        groups += engine.generate(reqs, **sampling)
        gen_s.append(time.perf_counter() - t)
    trainer = PolicyTrainer(model_cfg=cfg.model, init_state=state, **{
        k: v for k, v in dict(policy_loss=cfg.policy_loss, policy_loss_params=cfg.policy_loss_params,
                              policy_loss_aggregation=cfg.policy_loss_aggregation, update_depth=cfg.update_depth,
                              lr=cfg.lr, weight_decay=cfg.weight_decay, clip_grad=cfg.clip_grad,
                              kl_loss_coef=cfg.kl_loss_coef if cfg.use_kl_loss else 0.0,
                              temperature=cfg.rollout_temperature, seed=cfg.seed, on_bad_tokens=cfg.on_bad_tokens,
                              max_bad_token_frac=cfg.max_bad_token_frac).items()})
    train_s = []
    for i in range(4):
        batch = groups[(i % 3) * cfg.rollout_batch_size // 2:][:cfg.rollout_batch_size]
        if len(batch) < cfg.rollout_batch_size:
            batch = groups[:cfg.rollout_batch_size]
        samples = [{**s, "advantage": a} for g in batch
                   for s, a in zip(g.samples, group_advantages([s["reward"] for s in g.samples]))]
        t = time.perf_counter()
        trainer.train_step(samples)
        train_s.append(time.perf_counter() - t)
    mean_len = statistics.fmean(len(s["response_ids"]) for g in groups for s in g.samples)
    common = ["--config", config, "--num-rollout", str(steps), "--eval-interval", "0", "--no-plots", "--no-progress",
              "--save-interval", "0"]
    rates = {}
    for mode in ("async", "sync"):
        run_training(parse_config([*common, "--rollout-mode", mode, "--output-dir", str(root / mode)]))
        rows = [json.loads(ln) for ln in (root / mode / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        seconds = rows[-1]["time/elapsed_s"] - rows[0]["time/elapsed_s"]
        rates[mode] = (rows[-1]["accounting/trained"] - rows[0]["accounting/trained"]) / seconds
    import os

    result = dict(
        config=str(Path(config).resolve().relative_to(ROOT)) if Path(config).resolve().is_relative_to(ROOT) else config,
        steps=steps, cores=len(os.sched_getaffinity(0)), num_rollout_workers=cfg.num_rollout_workers,
        rollout_batch_size=cfg.rollout_batch_size, n_samples_per_prompt=cfg.n_samples_per_prompt,
        update_depth=cfg.update_depth, max_staleness=cfg.max_staleness,
        gen_request_s=statistics.median(gen_s[1:]), train_step_s=statistics.median(train_s[1:]),
        mean_response_len=mean_len, gen_request_samples=gen_s, train_step_samples=train_s,
        trained_per_s=rates, measured_async_over_sync=rates["async"] / rates["sync"],
        command=f"python bench/schedule_sim.py measure-runtime --steps {steps} --out {out}",
    )
    out.write_text(json.dumps(result, indent=1))
    return result


def runtime_validation(m: dict, rollouts: int = 16) -> dict:
    p = runtime_preset(m)
    sync = simulate(p, "sync split", rollouts)
    asyn = simulate(p, "async K=2" if m.get("max_staleness", 2) >= 2 else "async K=1", rollouts)
    return dict(simulated=sync["s_per_rollout"] / asyn["s_per_rollout"], measured=m["measured_async_over_sync"],
                sync_s=sync["s_per_rollout"], async_s=asyn["s_per_rollout"])


def main(argv=None) -> int:
    logging.getLogger("epic_slime").setLevel(logging.WARNING)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", default="simulate", choices=["simulate", "measure-runtime"])
    ap.add_argument("--preset", default="all", choices=["paper", "smoke", "all"])
    ap.add_argument("--rollouts", type=int, default=12)
    ap.add_argument("--no-sensitivity", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default=str(ROOT / "bench" / "runtime_measurement.json"))
    ap.add_argument("--config", default=str(ROOT / "configs" / "local" / "default.yaml"))
    a = ap.parse_args(argv)
    if a.command == "measure-runtime":
        r = measure_runtime(a.steps, Path(a.out), a.config)
        print(json.dumps({k: v for k, v in r.items() if not k.endswith("_samples")}, indent=1))
        return 0
    report = {}
    presets = {"paper": paper_preset, "smoke": smoke_preset}
    for name in (["paper", "smoke"] if a.preset == "all" else [a.preset]):
        p = presets[name]()
        rows = run_preset(p, a.rollouts)
        print(f"== {p.name}: {p.rollout_batch_size} prompts x {p.n_samples}, D = {p.update_depth}, oversampling "
              f"{p.oversample_ratio}, mean response {rows[0]['mean_response']:.0f} tokens (cap {p.max_response_len}), "
              f"{_split_heading(p)} ==")
        print(format_table(rows))
        report[name] = [{k: v for k, v in r.items() if k not in ("trace", "pushes", "trains", "batches", "per_rollout_hist")}
                        for r in rows]
    measurement = ROOT / "bench" / "runtime_measurement.json"
    if measurement.exists():
        m = json.loads(measurement.read_text())
        v = runtime_validation(m)
        print(f"== validation against the embedded runtime ({measurement.name}): measured async/sync "
              f"{v['measured']:.2f}, simulated {v['simulated']:.2f} ({v['simulated'] / v['measured'] - 1:+.0%}) ==")
        report["validation"] = v
    if not a.no_sensitivity and a.preset in ("paper", "all"):
        s = sensitivity()
        print("== sensitivity ==")
        print(s)
        report["sensitivity"] = s
    if "paper" in report:
        by = {r["schedule"]: r for r in report["paper"]}
        print(f"async K=2 / sync: {by['sync colocated']['s_per_rollout'] / by['async K=2']['s_per_rollout']:.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
