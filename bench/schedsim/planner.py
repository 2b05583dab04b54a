"""The planner: for a model, a GPU count and type, a batch and a response-length distribution, the
split (train GPUs : rollout GPUs, whole nodes) and engine size that the simulator finds fastest at a
staleness bound K and push mode, with its predicted s/rollout and speedup over sync colocated at its
own best engine size (``frontier.best_sync``). The pick is the fastest STEADY row (at most
``report.STEADY_SHARE_MAX`` of its throughput bound: a row faster than its bound is a window too short,
docs/cluster.md) with nothing dropped or requeued. Arithmetic on a model: no slime needed."""

from __future__ import annotations

import dataclasses
import time

from .bound import throughput_bound
from .frontier import MIN_TRAIN_GPUS, best_sync, split_preset
from .presets import GPUS, MODELS, Preset, kv_capacity
from .report import STEADY_SHARE_MAX
from .schedules import simulate, steady_window

ENGINE_SIZES = (4, 8)


def parse_batch(text: str) -> tuple[int, int]:
    """'64x8' -> (64 prompts, 8 samples each)."""
    try:
        prompts, samples = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--batch must be PROMPTSxSAMPLES (e.g. 64x8), got {text!r}") from None
    if prompts < 1 or samples < 1:
        raise ValueError(f"--batch must have positive counts, got {text!r}")
    return prompts, samples


def parse_lengths(text: str) -> tuple[float, float, int]:
    """'9000,0.6,16384' -> (mean response, lognormal sigma, cap)."""
    try:
        mean, sigma, cap = text.split(",")
        out = float(mean), float(sigma), int(cap)
    except ValueError:
        raise ValueError(f"--lengths must be MEAN,SIGMA,CAP (e.g. 9000,0.6,16384), got {text!r}") from None
    if not (0 < out[0] <= out[2]) or out[1] < 0:
        raise ValueError(f"--lengths needs 0 < mean <= cap and sigma >= 0, got {text!r}")
    return out


def candidates(p: Preset, gpus_per_node: int) -> list[tuple[int, int]]:
    """(train GPUs, GPUs per engine): whole nodes for training (at least MIN_TRAIN_GPUS), at least one
    rollout node, engines whose weights fit."""
    gpu = GPUS[p.gpu]
    out = []
    for train in range(gpus_per_node, p.total_gpus, gpus_per_node):
        if train < MIN_TRAIN_GPUS:
            continue
        for gpe in ENGINE_SIZES:
            if gpe <= gpus_per_node and kv_capacity(p.model, gpu["hbm_bytes"], gpe, p.mem_fraction) > 0:
                out.append((train, gpe))
    return out


def plan(p: Preset, k: int, push_mode: str, gpus_per_node: int = 8, rollouts: int = 10, log=None) -> dict:
    """``log``: called with one line per simulation as it ends (its result and seconds), after a first
    line that says how many there are: the whole plan takes minutes, and a silent one looks hung."""
    say = log or (lambda line: None)
    splits = candidates(p, gpus_per_node)
    total = 1 + len(splits)
    say(f"[plan] {total} simulations of {rollouts}+ rollouts: the sync colocated baseline, then {len(splits)} splits")
    t0 = time.monotonic()
    sync = best_sync(p, rollouts)
    say(
        f"[plan] 1/{total} sync colocated: {sync['s_per_rollout']:.1f} s/rollout at its best engine size "
        f"({sync['gpus_per_engine']} GPUs) ({time.monotonic() - t0:.0f} s)"
    )
    rows = []
    for i, (train, gpe) in enumerate(splits, start=2):
        t0 = time.monotonic()
        q = split_preset(p, train, gpe, push_mode)
        n, warmup = steady_window(f"async K={k}", rollouts)  # the frontier's window: one setting, one price
        r = simulate(q, f"async K={k}", n, warmup=warmup)
        b = throughput_bound(q, p.total_gpus - train, train, q.push_s_split)
        rows.append(
            dict(
                train_gpus=train,
                rollout_gpus=p.total_gpus - train,
                gpus_per_engine=gpe,
                s_per_rollout=r["s_per_rollout"],
                speedup=sync["s_per_rollout"] / r["s_per_rollout"],
                bound_s=b["bound_s"],
                share=b["bound_s"] / r["s_per_rollout"],
                dropped=r["dropped_groups"],
                requeued=r["requeued_groups"],
            )
        )
        say(
            f"[plan] {i}/{total} train {train} GPUs, {gpe}-GPU engines: {r['s_per_rollout']:.1f} s/rollout "
            f"({time.monotonic() - t0:.0f} s)"
        )
    if not rows:
        raise ValueError(f"no split of {p.total_gpus} GPUs leaves {MIN_TRAIN_GPUS}+ train GPUs and a rollout node")
    steady = [r for r in rows if r["share"] <= STEADY_SHARE_MAX and r["dropped"] == 0 and r["requeued"] == 0]
    best = min(steady, key=lambda r: r["s_per_rollout"]) if steady else None
    return dict(
        k=k,
        push_mode=push_mode,
        sync_colocated_s=sync["s_per_rollout"],
        sync_colocated_gpus_per_engine=sync["gpus_per_engine"],
        sync_colocated_by_engine=sync["by_engine"],
        rows=rows,
        pick=best,
    )


def preset_for(model: str, gpus: int, gpu: str, batch: str, lengths: str, base: Preset) -> Preset:
    if model not in MODELS:
        raise ValueError(f"--model must be one of {sorted(MODELS)}, got {model!r}")
    if gpu not in GPUS:
        raise ValueError(f"--gpu must be one of {sorted(GPUS)}, got {gpu!r}")
    prompts, samples = parse_batch(batch)
    mean, sigma, cap = parse_lengths(lengths)
    return dataclasses.replace(
        base,
        name=f"plan: {model}, {gpus} {gpu}",
        model=dict(MODELS[model]),
        total_gpus=gpus,
        gpu=gpu,
        rollout_batch_size=prompts,
        n_samples=samples,
        mean_response_len=mean,
        length_sigma=sigma,
        max_response_len=cap,
        peak_flops=0.0,
        hbm_bytes_s=0.0,
        prefill_tok_s=0.0,
        c_tok=0.0,
        c_kv=0.0,
        kv_capacity_tokens=0.0,
    ).derived()


def format_plan(result: dict) -> str:
    by = ", ".join(f"{g}: {t:.1f} s" for g, t in result["sync_colocated_by_engine"].items())
    out = [
        f"plan at K={result['k']} push={result['push_mode']}: sync colocated at its best engine size "
        f"({result['sync_colocated_gpus_per_engine']} GPUs) {result['sync_colocated_s']:.1f} s/rollout ({by})",
        f"{'train':>5s} {'rollout':>7s} {'GPU/eng':>7s} {'s/rollout':>9s} {'x sync':>6s} {'bound':>6s} {'of bnd':>6s} "
        f"{'drop':>4s} {'requeue':>7s}",
    ]
    for r in result["rows"]:
        mark = "" if r["share"] <= STEADY_SHARE_MAX else "  not steady (past its bound: window too short)"
        out.append(
            f"{r['train_gpus']:5d} {r['rollout_gpus']:7d} {r['gpus_per_engine']:7d} {r['s_per_rollout']:9.1f} "
            f"{r['speedup']:6.2f} {r['bound_s']:6.1f} {r['share']:6.0%} {r['dropped']:4d} {r['requeued']:7d}{mark}"
        )
    b = result["pick"]
    if b is None:
        out.append(
            f"pick: none (no row steady, at most {STEADY_SHARE_MAX:.0%} of its bound, with nothing dropped or "
            "requeued: rerun with more --rollouts)"
        )
    else:
        out.append(
            f"pick: train_gpus={b['train_gpus']} rollout_gpus={b['rollout_gpus']} gpus_per_engine={b['gpus_per_engine']} "
            f"push={result['push_mode']} K={result['k']}: {b['s_per_rollout']:.1f} s/rollout, {b['speedup']:.2f}x "
            f"sync colocated at its best engine size ({b['share']:.0%} of bound)"
        )
    return "\n".join(out)
