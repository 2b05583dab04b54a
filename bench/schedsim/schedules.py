"""One simulated run: the real driver loop of a schedule (sync colocated / sync split / async K=k)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
from collections import Counter
from types import SimpleNamespace

from . import actors
from .engine import Sim
from .presets import Preset

SCHEDULES = {
    "sync colocated": dict(max_staleness=0, colocated=True),
    "sync split": dict(max_staleness=0, colocated=False),
    "async K=1": dict(max_staleness=1, colocated=False),
    "async K=2": dict(max_staleness=2, colocated=False),
    "async K=4": dict(max_staleness=4, colocated=False),
}


def schedule_spec(schedule: str) -> dict:
    """``SCHEDULES[schedule]``, or any ``async K=<k>``."""
    if schedule in SCHEDULES:
        return SCHEDULES[schedule]
    m = re.fullmatch(r"async K=(\d+)", schedule)
    if not m:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)} or 'async K=<k>', got {schedule!r}")
    return dict(max_staleness=int(m.group(1)), colocated=False)


def stream_has_budget() -> bool:
    """Whether the GroupStream admits by the staleness budget (``epic_slime.admission.AdmissionBudget``;
    its cap on groups held is optional) or tops up to a fixed capacity (the stream before the budget)."""
    import inspect

    import epic_slime.slime.rollout as ro

    return "cap" in inspect.signature(ro.GroupStream.__init__).parameters


def driver_groups_in_flight(batch: int, ratio: float, max_staleness: int) -> int | None:
    """``--async-groups-in-flight`` as the driver sets it (``command_line.oversampling_flags``): the
    oversampled batch at K >= 2 with a ratio; otherwise no flag, which the budget stream takes as no cap
    (None) and the stream before it as one batch."""
    from epic_slime.slime.cli.command_line import oversampling_flags, read_command_line

    parsed = read_command_line(
        ["--rollout-batch-size", str(batch), "--oversample-ratio", str(ratio), "--max-staleness", str(max_staleness)],
        check=False,
    ).parsed
    out = oversampling_flags(parsed)
    if out:
        return int(out[1])
    return None if stream_has_budget() else batch


def simulate(
    p: Preset, schedule: str, rollouts: int = 12, warmup: int = 2, *, push_waits_for_manager: bool = True, loop_fn=None
) -> dict:
    """Runs the real driver loop of ``schedule`` for ``rollouts`` rollouts; steady state = after ``warmup``."""
    from epic_slime.slime import train

    spec = schedule_spec(schedule)
    colocated = spec["colocated"] and p.shared_cores is None
    if colocated and p.push_mode != "abort":
        p = dataclasses.replace(
            p, push_mode="abort"
        )  # colocated: the engines are idle at the push (no in_place / retract)
    sim = Sim(p, colocated)
    k = spec["max_staleness"]
    args = SimpleNamespace(
        start_rollout_id=0,
        num_rollout=rollouts,
        eval_interval=None,
        save_interval=None,
        rollout_global_dataset=True,
        offload_rollout=colocated,
        offload_train=colocated,
        release_train=False,
        max_staleness=k,
        stale_policy="drop",
        rollout_batch_size=p.rollout_batch_size,
        n_samples_per_prompt=p.n_samples,
        oversample_ratio=p.oversample_ratio,
        async_groups_in_flight=driver_groups_in_flight(p.rollout_batch_size, p.oversample_ratio, k),
        use_rollout_routing_replay=False,
        use_wandb=False,
        use_tensorboard=False,
        check_weight_update_equal=False,
        weight_push_mode=p.push_mode if not colocated else "abort",
    )
    data_source = actors.SimDataSource(sim, p.n_samples)
    push_s = p.push_s_colocated if colocated else p.push_s_split
    with actors.active(sim):
        stream = actors.real_group_stream(sim, args, data_source, args.async_groups_in_flight) if k != 0 else None
        manager = actors.SimRolloutManager(sim, args, stream, data_source)
        actor = actors.SimTrainGroup(sim, manager, push_s, push_waits_for_manager)

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
        # the run is over: end the groups still generating (and the engines' clock) on the virtual loop
        pending = [t for t in asyncio.all_tasks(sim.loop) if not t.done()]
        for t in pending:
            if stream is not None:
                t.remove_done_callback(stream._on_done)  # not a failure of the group: the run ended
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            sim.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    # steady state: from the end of the warmup-th training to the end of the last one
    ends = [b for _, b in actor.trains]
    steady_s = (
        (ends[-1] - ends[warmup - 1]) / (len(ends) - warmup) if len(ends) > warmup else (t_end - t_start) / rollouts
    )
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
        schedule=schedule,
        preset=p.name,
        rollouts=rollouts,
        wall_s=wall,
        s_per_rollout=steady_s,
        utilisation=pool_util,
        staleness_hist=dict(sorted(hist.items())),
        dropped_groups=dropped,
        requeued_groups=requeued,
        abort_resubmits=stream.abort_resubmits if stream else 0,
        stale_requeues=stream.stale_requeues if stream else 0,
        started_groups=sum(sim.started_groups.values()),
        gpus=gpus,
        gpu_hours_paper_run=steady_s * p.paper_rollouts * gpus / 3600.0,
        mean_response=sum(b["tokens"] for b in manager.batches.values())
        / (len(manager.batches) * p.rollout_batch_size * p.n_samples),
        trace=trace,
        pushes=actor.pushes,
        trains=actor.trains,
        batches=manager.batches,
        per_rollout_hist={r: dict(g.histogram) for r, g in manager.gates.items()},
        push_mode=p.push_mode,
        split=f"{sim.rollout_gpus}:{sim.train_gpus}",
        gpus_per_engine=p.gpus_per_engine,
        engines=n_eng,
        retractions=sum(e.retractions for e in sim.engines),
        push_retractions=sum(e.push_retractions for e in sim.engines),
        reprefill_tokens=sum(e.reprefilled for e in sim.engines),
        peak_kv_share=max(e.peak_kv for e in sim.engines) / p.kv_capacity_tokens,
        groups=_group_records(sim, manager, stream, data_source, warmup, k),
        trained_keys={r: [rec["key"] for rec in recs] for r, recs in manager.trained.items()},
        trained_unfinished=sum(rec["unfinished"] for recs in manager.trained.values() for rec in recs),
        agent_stats=_agent_stats(manager, warmup) if p.agent is not None else None,
    )


def _agent_stats(manager, warmup: int) -> dict:
    """Means per trained trajectory after the warm-up: tool calls, tool seconds, tool and model tokens, and
    the weight versions its model tokens came from (a trajectory spans versions when a push lands between
    or during its turns)."""
    per = [t for r, recs in manager.trained.items() if r >= warmup for rec in recs for t in rec.get("agent", [])]
    n = max(1, len(per))
    spanning = sum(t["versions"] > 1 for t in per)
    return dict(
        trajectories=len(per),
        tool_calls=sum(t["tool_calls"] for t in per) / n,
        tool_s=sum(t["tool_s"] for t in per) / n,
        tool_tokens=sum(t["tool_tokens"] for t in per) / n,
        model_tokens=sum(t["model_tokens"] for t in per) / n,
        spanning_share=spanning / n,
        max_versions=max((t["versions"] for t in per), default=0),
    )


def _group_records(sim, manager, stream, data_source, warmup: int, k: int) -> list[dict]:
    """Per group started: its length (mean drawn response), how often it was requeued, whether it was
    dropped, and if trained after the warm-up its lag as the gate saw it and its true lag."""
    requeues = stream.requeues if stream is not None else Counter()
    trained = {rec["key"]: (r, rec) for r, recs in manager.trained.items() for rec in recs}
    dropped = set(data_source.dropped_keys)
    out = []
    for key, length in sim.group_length.items():
        r, rec = trained.get(key, (None, None))
        out.append(
            dict(
                key=key,
                length=length,
                requeued=requeues.get(key, 0),
                dropped=key in dropped,
                steady=r is not None and r >= warmup,
                lag=rec["lag"] if rec else None,
                true_lag=rec["true_lag"] if rec else None,
                over_k=bool(rec and k and rec["true_lag"] > k),
            )
        )
    return out


def split_heading(p: Preset) -> str:
    """The split rows' GPUs; on a preset too small to split, the extra GPU they assume is said."""
    rollout = p.total_gpus - p.train_gpus_split
    if rollout >= p.gpus_per_engine:
        return f"split {rollout} rollout : {p.train_gpus_split} train GPUs"
    return (
        f"{p.total_gpus} GPU colocated; the split and async rows add {p.gpus_per_engine} rollout GPU "
        f"({p.gpus_per_engine} rollout : {p.train_gpus_split} train, counted in their GPU-h)"
    )


def steady_window(schedule: str, rollouts: int) -> tuple[int, int]:
    """(rollouts to simulate, warm-up rollouts) of ``schedule``: the steady state starts after K + 2 rollouts (at
    least 2), past the start-up in which the admission budget runs up to K batches ahead, and at least 10 rollouts
    are measured. One rule for every table, so that one setting has one price (the default command once measured
    K = 2 from rollout 2 and priced it 222.1 s where the frontier and the launcher said 229.6 s)."""
    warmup = max(2, schedule_spec(schedule)["max_staleness"] + 2)
    return max(rollouts, warmup + 10), warmup


def simulate_steady(p: Preset, schedule: str, rollouts: int = 12, **kwargs) -> dict:
    """``simulate`` over ``steady_window``'s window."""
    n, warmup = steady_window(schedule, rollouts)
    return simulate(p, schedule, n, warmup=warmup, **kwargs)


def run_preset(p: Preset, rollouts: int, schedules=tuple(SCHEDULES)) -> list[dict]:
    return [simulate_steady(p, s, rollouts) for s in schedules]
