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
AGENTIC_SPLITS = ((8, 4), (16, 8))  # (train GPUs, GPUs per engine): the launcher's 24 : 8 and the even 16 : 16
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
    kw.setdefault(
        "source",
        "the paper preset's model, GPUs and batch (configs/paper/table2.yaml: 64 x 8, D = 8, 16K cap counting tool "
        f"tokens; 32 H100 assumed) with an assumed agentic workload: {workload.text()}, "
        f"mean {AGENTIC_MEAN_MODEL_TOKENS:.0f} model tokens per trajectory split evenly over its turns",
    )
    p = paper_preset(agent=workload, **kw)
    return dataclasses.replace(p, name="agentic: Qwen3-30B-A3B, 32 GPUs, tool calls")


def _steady(q: Preset, schedule: str, rollouts: int) -> dict:
    n, warmup = steady_window(schedule, rollouts)
    return simulate(q, schedule, n, warmup=warmup) | {"warmup": warmup}


def sync_setups(p: Preset, rollouts: int, splits=AGENTIC_SPLITS) -> dict:
    """s/rollout of every synchronous setup: colocated per engine size, split per split."""
    out = {}
    for gpe in SYNC_ENGINE_SIZES:
        q = split_preset(p, p.train_gpus_split, gpe, "abort")
        out[f"sync colocated, {gpe}-GPU engines"] = _steady(q, "sync colocated", rollouts)["s_per_rollout"]
    for train, gpe in splits:
        q = split_preset(p, train, gpe, "abort")
        name = f"sync split {p.total_gpus - train}:{train}, {gpe}-GPU engines"
        out[name] = _steady(q, "sync split", rollouts)["s_per_rollout"]
    return out


def price(
    p: Preset, rollouts: int = 12, ks=AGENTIC_KS, splits=AGENTIC_SPLITS, pushes=AGENTIC_PUSHES, band=True, log=None
):
    """The frontier of K against s/rollout, each K's fastest row with its band, against the best sync."""
    say = log or (lambda _line: None)
    sync = sync_setups(p, rollouts, splits)
    best_name = min(sync, key=sync.get)
    say(f"[agentic] best synchronous setup: {best_name}, {sync[best_name]:.1f} s/rollout")
    rows = []
    for train, gpe in splits:
        for push in pushes:
            q = split_preset(p, train, gpe, push)
            for k in ks:
                r = _steady(q, f"async K={k}", rollouts)
                row = summary(q, r, sync[best_name], r["warmup"])
                row["agent"] = r["agent_stats"]
                rows.append(row)
                say(f"[agentic] K={k} {push} {row['split']}x{gpe}: {row['s']:.1f} s, {row['ratio']:.2f}x")
    frontier = []
    for k in ks:
        top = best_row([r for r in rows if r["schedule"] == f"async K={k}"])
        entry = dict(k=k, row=top)
        if band:
            entry["band"] = _band(p, top, k, rollouts, splits, say)
        frontier.append(entry)
    latency = _latency_sensitivity(p, frontier, rollouts, splits, say) if band else None
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


LATENCY_FACTORS = (0.25, 4.0)


def _latency_sensitivity(p: Preset, frontier: list[dict], rollouts: int, splits, say) -> list[dict]:
    """K = 2's fastest row (its split and push mode) at a quarter and at four times the tool latency median,
    against the best synchronous setup at that latency (simulated again)."""
    (top,) = [e["row"] for e in frontier if e["k"] == 2]
    train = int(top["split"].split(":")[1])
    out = []
    for factor in LATENCY_FACTORS:
        agent = dataclasses.replace(p.agent, tool_latency_median_s=p.agent.tool_latency_median_s * factor)
        q = dataclasses.replace(p, agent=agent)
        sync = sync_setups(q, rollouts, splits)
        s = _steady(split_preset(q, train, top["gpe"], top["push"]), "async K=2", rollouts)["s_per_rollout"]
        best = min(sync, key=sync.get)
        out.append(
            dict(median_s=agent.tool_latency_median_s, best_sync=best, sync_s=sync[best], s=s, ratio=sync[best] / s)
        )
        say(f"[agentic] tool latency median {agent.tool_latency_median_s:g} s: K=2 {s:.1f} s, {sync[best] / s:.2f}x")
    return out


def _band(p: Preset, top: dict, k: int, rollouts: int, splits, say) -> dict:
    """The row's speedup over the best sync with one calibrated input at each end of its range."""
    rollout, train = (int(x) for x in top["split"].split(":"))
    cells = []
    for label, field, value in variations(p):
        base = varied(p, field, value)
        key = (field, value)
        if key not in _band.sync_cache:
            _band.sync_cache[key] = min(sync_setups(base, rollouts, splits).values())
        q = varied(split_preset(p, train, top["gpe"], top["push"]), field, value)
        s = _steady(q, f"async K={k}", rollouts)["s_per_rollout"]
        cells.append([label, _band.sync_cache[key] / s])
        say(f"[agentic]   K={k} {label}: {cells[-1][1]:.2f}x")
    ratios = [r for _, r in cells]
    return dict(lo=min(ratios + [top["ratio"]]), hi=max(ratios + [top["ratio"]]), cells=cells)


_band.sync_cache = {}


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
