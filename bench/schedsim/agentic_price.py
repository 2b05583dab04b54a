"""The agentic preset and its price (``python bench/schedule_sim.py agentic``): for K = 1, 2, 4, 8 the
fastest row over push modes and splits, against the best synchronous setup, with the band of the
calibration's ranges (bench/schedsim/band.py) and the per-response-length-decile staleness, requeues and
drops beside the speed (a speed gain bought with bias is no gain).

The best synchronous setup: the fastest of synchronous colocated on all 32 GPUs with 4- or 8-GPU
engines and synchronous split at every split the asynchronous rows use. Under each varied input the
baseline is simulated again and chosen again, so a band is what a user who doubts that input sees."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .agentic import AgentWorkload
from .band import ranges_text, variations, varied
from .frontier import SYNC_ENGINE_SIZES, split_preset
from .presets import Preset, paper_preset
from .report import best_row, summary
from .schedules import simulate, steady_window

AGENTIC_KS = (1, 2, 4, 8)
AGENTIC_SPLITS = ((8, 4),)  # (train GPUs, GPUs per engine): the launcher's 24 : 8 only, to keep the run short
# (``price(splits=...)`` takes more)
AGENTIC_PUSHES = ("abort", "in_place")
OUT = Path(__file__).resolve().parent / "agentic_frontier.json"

# The workload, every number assumed (no published agentic RL run states them all): a retool-shaped math
# agent on the paper's model and cluster. The lognormal shape of the tool latency is assumed too;
# agentic RL systems report tool calls as long-tailed (Heddle, arXiv 2603.28101) without a fitted law.
AGENTIC_WORKLOAD = AgentWorkload(
    turns=4,  # assumed: 4 engine calls, 3 tool calls per trajectory
    tool_output_tokens=300,  # assumed: a code interpreter's printed output
    tool_latency_median_s=5.0,  # assumed: a sandboxed interpreter call, queueing included
    tool_latency_sigma=1.0,  # assumed: p90 = 3.6 x median, p99 = 10 x median
    prefix_cache="hit",  # SGLang's radix cache keeps the prefix between turns (assumed never evicted)
)
AGENTIC_MEAN_MODEL_TOKENS = 6000.0  # assumed: model tokens per trajectory (lognormal, sigma 0.6 as the paper preset)


def agentic_preset(workload: AgentWorkload = AGENTIC_WORKLOAD, **kw) -> Preset:
    kw.setdefault("mean_response_len", AGENTIC_MEAN_MODEL_TOKENS)
    mean = kw["mean_response_len"]
    kw.setdefault(
        "source",
        "the paper preset's model, GPUs and batch (configs/paper/table2.yaml: 64 x 8, D = 8, 16K cap counting tool "
        f"tokens; 32 H100 assumed) with an assumed agentic workload: {workload.text()}, "
        f"mean {mean:.0f} model tokens per trajectory split evenly over its turns",
    )
    p = paper_preset(agent=workload, **kw)
    return dataclasses.replace(p, name="agentic: Qwen3-30B-A3B, 32 GPUs, tool calls")


def _steady(q: Preset, schedule: str, rollouts: int) -> dict:
    n, warmup = steady_window(schedule, rollouts)
    return simulate(q, schedule, n, warmup=warmup) | {"warmup": warmup}


def _job(job: tuple) -> dict:
    """One simulation (a process pool's unit): a synchronous setup's s/rollout, or an asynchronous row's
    summary (its x sync is filled in once the best synchronous setup is known)."""
    kind, q, schedule, rollouts = job
    r = _steady(q, schedule, rollouts)
    if kind == "sync":
        return dict(s=r["s_per_rollout"])
    return summary(q, r, r["s_per_rollout"], r["warmup"]) | {"agent": r["agent_stats"]}


def _run(jobs: dict, procs: int) -> dict:
    """{name: job} -> {name: result}; the results do not depend on ``procs`` (each simulation is seeded)."""
    names = list(jobs)
    if procs <= 1:
        return {n: _job(jobs[n]) for n in names}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("fork")) as pool:
        return dict(zip(names, pool.map(_job, [jobs[n] for n in names])))


def sync_jobs(p: Preset, rollouts: int, splits=AGENTIC_SPLITS, tag: str = "") -> dict:
    """Every synchronous setup: colocated per engine size, split per split."""
    jobs = {}
    for gpe in SYNC_ENGINE_SIZES:
        q = split_preset(p, p.train_gpus_split, gpe, "abort")
        jobs[f"{tag}sync colocated, {gpe}-GPU engines"] = ("sync", q, "sync colocated", rollouts)
    for train, gpe in splits:
        q = split_preset(p, train, gpe, "abort")
        jobs[f"{tag}sync split {p.total_gpus - train}:{train}, {gpe}-GPU engines"] = ("sync", q, "sync split", rollouts)
    return jobs


LATENCY_FACTORS = (0.25, 4.0)


def price(
    p: Preset,
    rollouts: int = 12,
    ks=AGENTIC_KS,
    splits=AGENTIC_SPLITS,
    pushes=AGENTIC_PUSHES,
    band=True,
    procs: int = 1,
    log=None,
):
    """The frontier of K against s/rollout (each K's fastest row over ``splits`` x ``pushes``) against the
    best synchronous setup; with ``band``: the band of K = 2's and of the fastest K's rows over the
    calibration's ranges (band.py; the baseline under each variation: synchronous colocated at its best
    engine size, re-chosen), and K = 2 at a quarter and four times the tool latency median."""
    say = log or (lambda _line: None)
    jobs = sync_jobs(p, rollouts, splits)
    for train, gpe in splits:
        for push in pushes:
            for k in ks:
                jobs[f"row {k} {push} {train} {gpe}"] = (
                    "row",
                    split_preset(p, train, gpe, push),
                    f"async K={k}",
                    rollouts,
                )
    if band:
        for label, field, value in variations(p):
            jobs |= sync_jobs(varied(p, field, value), rollouts, (), tag=f"{label}|")
        for factor in LATENCY_FACTORS:
            jobs |= sync_jobs(_latency(p, factor), rollouts, splits, tag=f"latency x{factor:g}|")
    say(f"[agentic] phase 1: {len(jobs)} simulations on {procs} process(es)")
    done = _run(jobs, procs)
    sync = {n: r["s"] for n, r in done.items() if n.startswith("sync")}
    best_name = min(sync, key=sync.get)
    rows = []
    for name, row in done.items():
        if name.startswith("row "):
            row["ratio"] = sync[best_name] / row["s"]
            rows.append(row)
    frontier = [dict(k=k, row=best_row([r for r in rows if r["schedule"] == f"async K={k}"])) for k in ks]
    for e in frontier:
        r = e["row"]
        say(f"[agentic] K={e['k']}: {r['push']} {r['split']}x{r['gpe']} {r['s']:.1f} s, {r['ratio']:.2f}x")
    latency = None
    if band:
        fastest = max(frontier, key=lambda e: e["row"]["ratio"])
        banded = [e for e in frontier if e["k"] == 2 or e is fastest]
        (k2,) = [e["row"] for e in frontier if e["k"] == 2]
        jobs = {}
        for e in banded:
            r = e["row"]
            q = split_preset(p, int(r["split"].split(":")[1]), r["gpe"], r["push"])
            for label, field, value in variations(p):
                jobs[f"band {e['k']}|{label}"] = ("sync", varied(q, field, value), f"async K={e['k']}", rollouts)
        q2 = split_preset(p, int(k2["split"].split(":")[1]), k2["gpe"], k2["push"])
        for factor in LATENCY_FACTORS:
            jobs[f"latency x{factor:g}"] = ("sync", _latency(q2, factor), "async K=2", rollouts)
        say(f"[agentic] phase 2: {len(jobs)} simulations on {procs} process(es)")
        done |= _run(jobs, procs)
        for e in banded:
            cells = []
            for label, _field, _value in variations(p):
                base = min(done[n]["s"] for n in done if n.startswith(f"{label}|sync"))
                cells.append([label, base / done[f"band {e['k']}|{label}"]["s"]])
            ratios = [c[1] for c in cells] + [e["row"]["ratio"]]
            e["band"] = dict(lo=min(ratios), hi=max(ratios), cells=cells)
        latency = []
        for factor in LATENCY_FACTORS:
            base = {n.split("|", 1)[1]: done[n]["s"] for n in done if n.startswith(f"latency x{factor:g}|")}
            best = min(base, key=base.get)
            s = done[f"latency x{factor:g}"]["s"]
            latency.append(
                dict(
                    median_s=_latency(p, factor).agent.tool_latency_median_s,
                    best_sync=best,
                    sync_s=base[best],
                    s=s,
                    ratio=base[best] / s,
                )
            )
    return dict(
        preset=p.name,
        source=p.source,
        workload=dataclasses.asdict(p.agent),
        mean_model_tokens=p.mean_response_len,
        length_sigma=p.length_sigma,
        batch=f"{p.rollout_batch_size}x{p.n_samples}",
        max_response_len=p.max_response_len,
        total_gpus=p.total_gpus,
        rollouts=rollouts,
        sync=sync,
        best_sync=dict(name=best_name, s_per_rollout=sync[best_name]),
        band_ranges=ranges_text(p) if band else None,
        frontier=frontier,
        tool_latency_sensitivity=latency,
        rows=rows,
        command="python bench/schedule_sim.py agentic",
    )


def _latency(p: Preset, factor: float) -> Preset:
    return dataclasses.replace(
        p, agent=dataclasses.replace(p.agent, tool_latency_median_s=p.agent.tool_latency_median_s * factor)
    )


def write(result: dict, out: Path = OUT) -> None:
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")


def format_price(result: dict) -> str:
    lines = [
        f"== {result['preset']} ==",
        f"   source: {result['source']}",
        f"   best synchronous setup: {result['best_sync']['name']}, {result['best_sync']['s_per_rollout']:.1f} s/rollout",
        f"{'K':>2s} {'push':8s} {'split':6s} {'s/rollout':>9s} {'x sync':>6s} {'band':>11s} {'drop':>4s} "
        f"{'requeue':>7s} {'over K':>6s} {'lag spread':>10s}",
    ]
    for e in result["frontier"]:
        r, b = e["row"], e.get("band")
        band = f"{b['lo']:.2f}-{b['hi']:.2f}x" if b else ""
        lines.append(
            f"{e['k']:2d} {r['push']:8s} {r['split']:6s} {r['s']:9.1f} {r['ratio']:6.2f} {band:>11s} "
            f"{r['dropped']:4d} {r['requeued']:7d} {r['over_k']:6d} {r['lag_spread']:10.2f}"
        )
    return "\n".join(lines)
