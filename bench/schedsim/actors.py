"""Stand-ins at the interfaces the driver and the real GroupStream call: slime's RolloutManager (one call
at a time, as a Ray actor), its train group (``update_weights`` asks the manager for the engines first,
then pauses them in the preset's push mode), ``generate_and_rm_group`` (each sample to a simulated engine)
and the data source (numbered prompts, the real GroupLedger)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from .engine import Sim


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
        self.trained: dict[int, list[dict]] = {}  # rollout id -> per trained group: key, lags (reported / true)
        self.batches: dict[int, dict] = {}
        for name in (
            "generate",
            "eval",
            "save",
            "offload",
            "onload_weights",
            "onload_kv",
            "get_updatable_engines_and_lock",
            "check_weights",
            "dispose",
        ):
            setattr(self, name, _Remote(self, getattr(self, "_" + name)))

    async def serve(self, fn, *args, **kwargs):
        async with self._lock:
            return await fn(*args, **kwargs)

    async def _generate(self, rollout_id: int):
        from epic_slime.slime import rollout as ro
        from epic_slime.slime.stream.gate import (
            StalenessGate,
            select_groups,
            trainer_version_for_rollout,
            sample_version,
        )

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
            groups, _, _ = await ro._collect(
                args, self.stream, trainer_version, gate, rollout_id, poll_seconds=sim.p.poll_s
            )
        self.gates[rollout_id] = gate
        self.batches[rollout_id] = dict(
            start=t0, end=sim.now(), tokens=sum(s.response_length for g in groups for s in g)
        )
        self.trained[rollout_id] = [_trained_record(g, trainer_version) for g in groups]
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


def _trained_record(group, trainer_version: int) -> dict:
    """A trained group's lag as the gate saw it (the real code's oldest version) and as it was (the
    simulator's record of each call's first-token version)."""
    from epic_slime.slime.stream import gate as staleness

    oldest = getattr(staleness, "sample_oldest_version", None)
    seen = [oldest(s) if oldest else staleness.sample_version(s.weight_versions, s.index) for s in group]
    true = [s.metadata.get("sim_oldest_version", v) for s, v in zip(group, seen)]
    record = dict(key=group[0].group_index, lag=trainer_version - min(seen), true_lag=trainer_version - min(true))
    # samples trained before they finished (aborted or still generating): never, by the stream's rule
    record["unfinished"] = sum(getattr(s.status, "value", s.status) not in ("completed", "truncated") for s in group)
    trajectories = [s.metadata["sim_agent"] for s in group if "sim_agent" in s.metadata]
    if trajectories:  # the agentic workload: per trajectory, its tool calls and the versions its turns ran on
        record["agent"] = [
            dict(
                tool_calls=t["tool_calls"],
                tool_s=t["tool_s"],
                tool_tokens=t["tool_tokens"],
                model_tokens=t["model_tokens"],
                versions=len({c["first_version"] for c in t["calls"] if c["tokens"] and "first_version" in c}),
            )
            for t in trajectories
        ]
    return record


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
            if self.sim.p.push_mode == "abort":
                e.abort_all()  # in_place: running requests keep their KV and continue after the push
            elif self.sim.p.push_mode == "retract":
                e.retract_all()  # back to the queue with their tokens, prefilled again after the push
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
    if sim.p.agent is not None:  # multi-turn trajectories with tool calls between the engine calls
        from .agentic import generate_agentic_group

        return await generate_agentic_group(sim, group)
    pending = []
    for s in group:
        if s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED):
            continue
        target = s.metadata["sim_target"]
        engine = min(sim.engines, key=lambda e: e.load())
        pending.append(
            (
                s,
                engine.submit(
                    sim.p.prompt_len + s.response_length,
                    target - s.response_length,
                    sim.p.max_response_len - s.response_length,
                    partial=s.response_length,
                ),
            )
        )
    for s, fut in pending:
        tokens, version, aborted, oldest = await fut
        s.response_length += tokens
        s.tokens = range(
            max(1, sim.p.prompt_len) + s.response_length
        )  # prompt + response, as the sample checks read it
        s.weight_versions.append(str(version))  # SGLang's meta_info weight_version: the version at response time
        if tokens and oldest is not None:  # the truth, for the report: the version of the call's first token
            s.metadata["sim_oldest_version"] = min(oldest, s.metadata.get("sim_oldest_version", oldest))
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
        from epic_slime.slime.stream.ledger import GroupLedger

        self.sim, self.n_samples = sim, n_samples
        self.ledger = GroupLedger()
        self.dropped_keys: list = []
        real_drop = self.ledger.drop

        def drop(key):
            self.dropped_keys.append(key)
            real_drop(key)

        self.ledger.drop = drop
        self.next = 0

    def _fresh(self, key: int):
        from slime.utils.types import Sample

        self.sim.started_groups[key] += 1
        group = []
        for j in range(self.n_samples):
            target = min(self.sim.draw_length(key), self.sim.p.max_response_len)
            group.append(
                Sample(
                    group_index=key,
                    index=key * self.n_samples + j,
                    response_length=0,
                    tokens=range(
                        max(1, self.sim.p.prompt_len)
                    ),  # the prompt (at least one token); a range: a length, no memory
                    weight_versions=[],
                    metadata={"sim_target": target},
                )
            )
        # the group's length for the per-decile report: its first draw (a requeue draws anew)
        self.sim.group_length.setdefault(key, sum(s.metadata["sim_target"] for s in group) / len(group))
        return group

    def handed_back(self) -> int:  # the simulated stream never gives groups back
        return 0

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
def active(sim: Sim):
    """Makes ``sim`` the engine that ``_generate_group`` (slime's generate_and_rm_group, simulated) sends to."""
    _ACTIVE_SIM.append(sim)
    try:
        yield
    finally:
        _ACTIVE_SIM.pop()


def real_group_stream(sim: Sim, args, data_source, capacity: int):
    """The real GroupStream, on the simulated loop with the simulated engine (both injected)."""
    from epic_slime.slime.stream.group_stream import GroupStream

    return GroupStream(args, data_source, capacity, loop=sim.loop, sampling_params={}, generate_group=_generate_group)
