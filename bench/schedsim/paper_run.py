"""The default command (``python bench/schedule_sim.py``): the launcher's own setting simulated, its
headline against synchronous colocated at its own best engine size with the band, the sensitivity table
at that setting, and the best line of the frontier at the planner's split with its band."""

from __future__ import annotations

import dataclasses

from .band import Band, band_text, format_cells, ranges_text
from .frontier import best_sync, frontier, split_preset
from .presets import Preset, paper_preset
from .report import best_row, format_table
from .schedules import run_preset, simulate_steady, split_heading, steady_window

HEADLINE_PREFIX = "headline: async K=2 / sync colocated at its best engine size:"


def launcher_preset(oversample_ratio: float = 0.0) -> Preset:
    """The paper preset as ``launch/qwen3_30b_epic.sh`` runs it by default: the planner's split and engine
    size (launch_predictions.json's pick; 16 : 16 with 8-GPU engines without one), oversampling 0 at K >= 2."""
    from . import launch_table

    p = paper_preset(oversample_ratio=oversample_ratio)
    best = launch_table.pick(4, 8) if launch_table.TABLE.exists() else None
    if best:
        p = split_preset(p, best["actor_nodes"] * 8, best["gpus_per_engine"], p.push_mode)
    return p


def sensitivity(p: Preset, rollouts: int = 8, speeds=(0.5, 1.0, 2.0), sigmas=(0.3, 0.6, 0.9)) -> str:
    """async K=2 over sync colocated at its best engine size (and over sync split) at ``p``'s own split,
    engine size and oversampling, for decode speed x length sigma."""
    lines = [
        f"async K=2 / sync colocated at its best engine size (async K=2 / sync split), at the launcher's "
        f"setting: {split_heading(p)}, {p.gpus_per_engine}-GPU engines, oversampling {p.oversample_ratio}, push {p.push_mode}",
        f"{'decode x':>8s} | " + " | ".join(f"sigma {s:.1f}".center(15) for s in sigmas),
    ]
    for speed in speeds:
        cells = []
        for sigma in sigmas:
            q = dataclasses.replace(p, decode_speed=speed, length_sigma=sigma)
            sync = best_sync(q, rollouts)["s_per_rollout"]
            split = simulate_steady(q, "sync split", rollouts)["s_per_rollout"]
            k2 = simulate_steady(q, "async K=2", rollouts)["s_per_rollout"]
            cells.append(f"{sync / k2:.2f} ({split / k2:.2f})".center(15))
        lines.append(f"{speed:8.1f} | " + " | ".join(cells))
    return "\n".join(lines)


def default_run(rollouts: int, oversample_ratio: float, with_sensitivity: bool, say=print) -> dict:
    """Prints (``say``) and returns the default command's report."""
    p = launcher_preset(oversample_ratio)
    rows = run_preset(p, rollouts)
    by = {r["schedule"]: r for r in rows}
    sync = best_sync(p, rollouts, known=by["sync colocated"])
    say(
        f"== {p.name}: {p.rollout_batch_size} prompts x {p.n_samples}, D = {p.update_depth}, oversampling "
        f"{p.oversample_ratio}, mean response {rows[0]['mean_response']:.0f} tokens (cap {p.max_response_len}), "
        f"{split_heading(p)}, {p.gpus_per_engine}-GPU engines, push {p.push_mode} =="
    )
    say(f"   source: {p.source}")
    say(format_table(p, rows))
    report = {"paper": rows, "sync": sync}
    from .frontier import sync_heading

    say(f"baseline: {sync_heading(sync)}")
    base = paper_preset(oversample_ratio=oversample_ratio)
    band = Band(base, rollouts)
    say(f"== band: each input at each end of its range, the baseline re-simulated under it ({ranges_text(base)}) ==")
    k2 = sync["s_per_rollout"] / by["async K=2"]["s_per_rollout"]
    n, warmup = steady_window("async K=2", rollouts)
    b = band.row(p, "async K=2", warmup=warmup, rollouts=n)
    say(f"   {format_cells(b)}")
    report["headline"] = f"{HEADLINE_PREFIX} {band_text(k2, b)}"
    report["headline_band"] = b
    if with_sensitivity:
        s = sensitivity(p)
        say("== sensitivity ==")
        say(s)
        report["sensitivity"] = s
    # the best line: the frontier at the launcher's split (K x push mode there), against the same baseline
    _, front = frontier(base, rollouts, splits=((p.train_gpus_split, p.gpus_per_engine),), sync=sync)
    top = best_row(front)
    k = int(top["schedule"].split("=")[-1])
    n, warmup = steady_window(top["schedule"], rollouts)
    tb = band.row(split_preset(base, p.train_gpus_split, p.gpus_per_engine, top["push"]), top["schedule"], warmup, n)
    report["best"] = (
        f"best at the launcher's split: K={k} push={top['push']} split={top['split']}x{top['gpe']}: "
        f"{band_text(top['ratio'], tb)} ({top['share']:.0%} of bound)"
    )
    say(report["best"])
    say(report["headline"])
    return report
