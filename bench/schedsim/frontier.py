"""The frontier: K x push mode x split (GPUs rollout : train, GPUs per engine), each row against the
synchronous colocated schedule on all GPUs at ITS OWN best engine size (``best_sync``: the same engine
sizes the asynchronous rows may use, under the same assumptions), with its bound, staleness and
per-decile counts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .presets import Preset
from .report import best_line, best_row, format_deciles, format_frontier, summary
from .schedules import simulate, steady_window

KS = (1, 2, 3, 4, 8)
PUSH_MODES = ("abort", "in_place", "retract")
# (train GPUs, GPUs per engine); the rollout GPUs are the rest
SPLITS = ((16, 8), (8, 8), (16, 4), (8, 4), (12, 4))
MIN_TRAIN_GPUS = 8  # slime trains Qwen3-30B-A3B on one 8-GPU node at the least (CPU Adam, TP4 EP8:
# slime's docs/examples Qwen3-30B-A3B with 8xH100)


def split_preset(p: Preset, train_gpus: int, gpus_per_engine: int, push_mode: str) -> Preset:
    """The preset on another split / engine size / push mode, its engine constants derived again."""
    return dataclasses.replace(
        p,
        train_gpus_split=train_gpus,
        gpus_per_engine=gpus_per_engine,
        push_mode=push_mode,
        c_tok=0.0,
        c_kv=0.0,
        kv_capacity_tokens=0.0,
    ).derived()


def sync_baseline(p: Preset, rollouts: int) -> dict:
    return simulate(p, "sync colocated", rollouts)


SYNC_ENGINE_SIZES = (4, 8)  # the engine sizes the planner gives the asynchronous rows (planner.ENGINE_SIZES)


def best_sync(p: Preset, rollouts: int, known: dict | None = None) -> dict:
    """The baseline: sync colocated on all GPUs at its fastest engine size. With sublinear TP scaling
    (tp_alpha < 1) smaller engines are faster for the synchronous run too, and a speedup that only comes
    from choosing the engine size is not asynchrony. ``known``: a simulated sync colocated row at
    ``p.gpus_per_engine``, reused. Returns s_per_rollout, gpus_per_engine and by_engine {size: s}."""
    from .presets import GPUS, kv_capacity

    by = {}
    for gpe in SYNC_ENGINE_SIZES:
        if kv_capacity(p.model, GPUS[p.gpu]["hbm_bytes"], gpe, p.mem_fraction) <= 0:
            continue
        if known is not None and gpe == p.gpus_per_engine:
            by[gpe] = known["s_per_rollout"]
        else:
            by[gpe] = sync_baseline(split_preset(p, p.train_gpus_split, gpe, "abort"), rollouts)["s_per_rollout"]
    gpe = min(by, key=by.get)
    return dict(s_per_rollout=by[gpe], gpus_per_engine=gpe, by_engine=by)


def sync_heading(sync: dict) -> str:
    """``sync colocated at its best engine size (4 GPUs): 315.9 s/rollout (4: 315.9 s, 8: 346.5 s)``."""
    by = ", ".join(f"{g}: {s:.1f} s" for g, s in sync["by_engine"].items())
    return (
        f"sync colocated at its best engine size ({sync['gpus_per_engine']} GPUs): "
        f"{sync['s_per_rollout']:.1f} s/rollout (by GPUs per engine: {by})"
    )


def frontier(
    p: Preset, rollouts: int = 12, ks=KS, pushes=PUSH_MODES, splits=SPLITS, sync: dict | None = None, log=None
) -> tuple[dict, list[dict]]:
    sync = sync or best_sync(p, rollouts)
    rows = []
    for train, gpe in splits:
        if p.total_gpus - train < gpe:
            continue
        for push in pushes:
            q = split_preset(p, train, gpe, push)
            for k in ks:
                n, warmup = steady_window(f"async K={k}", rollouts)
                r = simulate(q, f"async K={k}", n, warmup=warmup)
                rows.append(summary(q, r, sync["s_per_rollout"], warmup))
                if log:
                    log(format_frontier(rows[-1:]).splitlines()[-1])
    return sync, rows


def write_frontier(p: Preset, sync: dict, rows: list[dict], out: Path) -> str:
    """The frontier as text (table, best line, per-decile counts of the best row and of K = 2) and JSON;
    ``sync`` is ``best_sync``'s baseline, which every x sync divides."""
    best = best_line(rows)
    top = best_row(rows)
    k2 = max((r for r in rows if r["schedule"] == "async K=2"), key=lambda r: r["ratio"])
    text = [
        f"== frontier, {p.name}: {sync_heading(sync)} on {p.total_gpus} GPUs ==",
        f"   source: {p.source}; tp_alpha {p.tp_alpha} (engine speed-up gpus ** tp_alpha); x sync: against "
        f"that baseline",
        format_frontier(rows),
        best,
        f"-- per response-length decile, best row ({top['schedule']}, {top['push']}, {top['split']}x{top['gpe']}) --",
        format_deciles(top["deciles"]),
        f"-- per response-length decile, best K=2 row ({k2['push']}, {k2['split']}x{k2['gpe']}) --",
        format_deciles(k2["deciles"]),
    ]
    body = "\n".join(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".txt").write_text(body + "\n")
    out.with_suffix(".json").write_text(
        json.dumps(
            dict(
                preset=p.name,
                sync_colocated_s=sync["s_per_rollout"],
                sync_colocated_gpus_per_engine=sync["gpus_per_engine"],
                sync_colocated_by_engine=sync["by_engine"],
                tp_alpha=p.tp_alpha,
                rows=rows,
                best=best,
            ),
            indent=1,
            default=str,
        )
    )
    return body
