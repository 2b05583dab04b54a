"""verl's 30B fully-async experiment on the simulator: the fit of what verl does not state, the phases
simulated against the published ones, and this project's schedule on the preset beside verl's 1.72x.

verl states the batch (512 x 16), D = 4, the 8K cap, the GPUs (128 H20; 96 : 32), the rollout TP (4) and
the phase times; it does not state the response lengths, the trainer's MFU or the decode speed. One is
assumed (the MFU on the 32 train GPUs, presets.VERL_TRAIN_MFU_SPLIT) and the rest fitted, each to one
published number: the mean response length to ref + update_actor of the 96:32 step (256.68 s: training
time is flops / MFU, and the flops follow the tokens), the MFU on 128 GPUs to old_log_prob + ref +
update_actor of the colocated step (135.86 s), the decode speed to its generation phase (348.05 s).
The mean alone cannot meet 348 s at the engine model's decode speed (``mean_alone_reaches``): even near
the 8K cap the batch decodes faster; and a mean of 3.5K would need 87% MFU on 32 H20s to train in
256.68 s. The sensitivity rows refit everything at other assumed MFUs."""

from __future__ import annotations

import dataclasses

from .bound import length_sample, throughput_bound
from .engine import train_seconds
from .presets import (
    VERL_ASYNC_96_32,
    VERL_PUBLISHED_SPEEDUP,
    VERL_PUBLISHED_STEP_SPEEDUP,
    VERL_SYNC_128,
    VERL_SYNC_OTHER_S,
    VERL_SYNC_S_16_16,
    VERL_TRAIN_MFU_SPLIT,
    VERL_TRAIN_S,
    Preset,
    verl_preset,
)
from .schedules import simulate

FIT_ROLLOUTS = 8  # the comparison averages as many colocated batches (the tail varies per batch)


def _batch_train_s(p: Preset, gpus: int) -> float:
    """Seconds to train the expected 512 x 16 batch on ``gpus`` GPUs (the simulator's train model)."""
    lengths = length_sample(p)
    return train_seconds(p, gpus, lengths) * p.rollout_batch_size * p.n_samples / len(lengths)


def fit_mean_response(p: Preset, target: float = VERL_TRAIN_S[32]) -> float:
    """The mean response length whose expected batch trains in ``target`` s on the preset's train GPUs
    at its (assumed) MFU there: bisection, train time rises with the mean."""
    lo, hi = 50.0, p.max_response_len - 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        t = _batch_train_s(dataclasses.replace(p, mean_response_len=mid), p.train_gpus_split)
        lo, hi = (mid, hi) if t < target else (lo, mid)
    return round((lo + hi) / 2, 1)


def fit_colocated_mfu(p: Preset, target: float = VERL_TRAIN_S[128]) -> float:
    """MFU at all GPUs that makes the expected batch train in ``target`` s (time is flops / MFU)."""
    unit = dataclasses.replace(p, train_mfu_at={p.total_gpus: 1.0})
    return _batch_train_s(unit, p.total_gpus) / target


def sync_phases(p: Preset, rollouts: int) -> dict:
    """Mean generation, train and step seconds of the simulated colocated schedule."""
    r = simulate(p, "sync colocated", rollouts, warmup=1)
    gens = [b["end"] - b["start"] for b in r["batches"].values()]
    trains = [b - a for a, b in r["trains"]]
    return dict(gen=sum(gens) / len(gens), train=sum(trains) / len(trains), step=r["s_per_rollout"])


def fit_decode_speed(
    p: Preset, target: float = VERL_SYNC_128["gen"], lo: float = 0.02, hi: float = 2.0, tol: float = 2.0
) -> float:
    """Bisection on decode_speed until the colocated generation phase is within ``tol`` s of ``target``
    (generation time falls as the speed rises)."""
    for _ in range(14):
        mid = (lo + hi) / 2
        gen = sync_phases(dataclasses.replace(p, decode_speed=mid), FIT_ROLLOUTS)["gen"]
        if abs(gen - target) <= tol:
            return round(mid, 4)
        lo, hi = (mid, hi) if gen > target else (lo, mid)
    return round((lo + hi) / 2, 4)


def fit(train_mfu_split: float = VERL_TRAIN_MFU_SPLIT, log=None) -> dict:
    """The fitted inputs, given the assumed MFU at the 32 train GPUs: the mean response (to 256.68 s of
    training there), the MFU at 128 GPUs (to 135.86 s), the decode speed (to 348.05 s of generation)."""
    p = verl_preset(train_mfu=train_mfu_split, train_mfu_at={32: train_mfu_split})
    p = dataclasses.replace(p, mean_response_len=fit_mean_response(p))
    p = dataclasses.replace(p, train_mfu_at={32: train_mfu_split, 128: round(fit_colocated_mfu(p), 4)})
    out = dict(
        mean_response_len=p.mean_response_len,
        train_mfu=train_mfu_split,
        train_mfu_at=p.train_mfu_at,
        decode_speed=fit_decode_speed(p),
    )
    if log:
        log(f"   fit at train MFU {train_mfu_split} on 32 GPUs: {out}")
    return out


def mean_alone_reaches(p: Preset, mean: float = 7500.0, rollouts: int = 2) -> float:
    """The colocated generation phase at decode speed 1 and a mean near the 8K cap."""
    return sync_phases(dataclasses.replace(p, decode_speed=1.0, mean_response_len=mean), rollouts)["gen"]


def async_phases(p: Preset, k: int, push: str, rollouts: int) -> dict:
    """Step, train and the trainer's wait (gap between trainings less the push) of async K=k at 96:32."""
    from .frontier import split_preset

    q = split_preset(p, p.train_gpus_split, p.gpus_per_engine, push)
    warmup = max(2, k + 2)
    r = simulate(q, f"async K={k}", max(rollouts, warmup + 6), warmup=warmup)
    steady = r["trains"][warmup - 1 :]
    waits = [b0 - a1 - q.push_s_split for (_, a1), (b0, _) in zip(steady, steady[1:])]
    trains = [b - a for a, b in steady]
    return dict(
        step=r["s_per_rollout"],
        train=sum(trains) / len(trains),
        wait=sum(waits) / len(waits),
        dropped=r["dropped_groups"],
        requeued=r["requeued_groups"],
        hist=r["staleness_hist"],
    )


def _row(name: str, sim: float, published: float) -> str:
    return f"   {name:34s} sim {sim:7.1f} s   verl {published:7.2f} s   ({sim / published - 1:+.0%})"


def verl_comparison(rollouts: int = 8, ks=(1, 2, 4), log=None, sensitivity=(0.15, 0.4)) -> str:
    """The phases simulated against verl's, then this project's schedule at 96:32 against verl's 1.72x."""
    say = log or (lambda line: None)
    p = verl_preset()
    lines = [
        f"== verl preset: {p.name}, {p.rollout_batch_size} x {p.n_samples}, D = {p.update_depth}, "
        f"{p.max_response_len} cap, {p.total_gpus - p.train_gpus_split}:{p.train_gpus_split} vs "
        f"{p.total_gpus} colocated ==",
        f"   source: {p.source}",
        f"   assumed: train MFU {VERL_TRAIN_MFU_SPLIT} on the 32 train GPUs, length sigma {p.length_sigma}, "
        f"prompt {p.prompt_len}; fitted: mean response {p.mean_response_len:.0f} (to {VERL_TRAIN_S[32]:.2f} s "
        f"of 32-GPU training), MFU {p.train_mfu_at[128]} on 128 GPUs (to {VERL_TRAIN_S[128]:.2f} s), decode "
        f"speed {p.decode_speed} (to {VERL_SYNC_128['gen']:.2f} s of generation), colocated weight update "
        f"{p.push_s_colocated:.2f} s + 3 x {p.offload_s:.0f} s offload (to the step's other {VERL_SYNC_OTHER_S:.2f} s)",
        f"   at decode speed 1 a mean of 7500 would generate in {mean_alone_reaches(p):.0f} s colocated (verl: "
        f"{VERL_SYNC_128['gen']:.0f} s), but the mean is pinned by the training time above: the decode speed is fitted",
    ]
    sync = sync_phases(p, rollouts)
    # the baseline at its own best engine size (the sizes the asynchronous rows may use): verl's TP 4 or 8
    from .frontier import SYNC_ENGINE_SIZES, split_preset

    by_engine = {
        g: (
            sync["step"]
            if g == p.gpus_per_engine
            else sync_phases(split_preset(p, p.train_gpus_split, g, "abort"), rollouts)["step"]
        )
        for g in SYNC_ENGINE_SIZES
    }
    best_gpe = min(by_engine, key=by_engine.get)
    base_step = by_engine[best_gpe]
    lines += [
        "-- colocated sync, 128 GPUs (sim vs verl) --",
        _row("gen", sync["gen"], VERL_SYNC_128["gen"]),
        _row("old_log_prob + ref + update_actor", sync["train"], VERL_TRAIN_S[128]),
        _row("step", sync["step"], VERL_SYNC_128["step"]),
        "   sync colocated by GPUs per engine: "
        + ", ".join(f"{g}: {t:.1f} s" for g, t in by_engine.items())
        + f"; the baseline below is the best, {best_gpe}-GPU engines ({base_step:.1f} s/step)",
    ]
    say("\n".join(lines))
    b = throughput_bound(p, p.total_gpus - p.train_gpus_split, p.train_gpus_split, p.push_s_split)
    lines.append(
        f"   bound at 96:32: {b['bound_s']:.1f} s/step (generation {b['gen_s']:.1f} s, train "
        f"{b['train_s']:.1f} s, push {b['push_s']:.2f} s): at most {base_step / b['bound_s']:.2f}x"
    )
    lines.append("-- this project's schedule, 96:32 (sim vs verl fully async) --")
    best = None
    by_k = {}
    for k in ks:
        for push in ("abort", "in_place"):
            a = async_phases(p, k, push, rollouts)
            ratio = base_step / a["step"]
            by_k.setdefault(k, ratio)
            if best is None or ratio > best[0]:
                best = (ratio, f"K={k} {push}", a["train"])
            lines += [
                f"   async K={k} {push:8s}: step {a['step']:.1f} s, {ratio:.2f}x (verl {VERL_PUBLISHED_STEP_SPEEDUP:.2f}x "
                f"per step, {VERL_PUBLISHED_SPEEDUP:.2f}x total); train {a['train']:.1f} s (verl "
                f"{VERL_TRAIN_S[32]:.1f}), trainer wait {a['wait']:.1f} s (verl {VERL_ASYNC_96_32['gen']:.1f}); "
                f"dropped {a['dropped']}, requeued {a['requeued']}, staleness {a['hist']}"
            ]
            say(lines[-1])
    fast = dataclasses.replace(p, push_s_split=VERL_SYNC_S_16_16["with_checkpoint_engine"])
    a = async_phases(fast, 2, "abort", rollouts)
    lines.append(
        f"   with checkpoint-engine's {fast.push_s_split} s push, K=2 abort: step {a['step']:.1f} s, "
        f"{base_step / a['step']:.2f}x (verl's async step has {VERL_ASYNC_96_32['step'] - VERL_TRAIN_S[32] - VERL_ASYNC_96_32['gen']:.1f} s "
        f"outside ref, update_actor and the wait)"
    )
    say(lines[-1])
    if 1 in by_k and max(ks) in by_k:
        lines.append(
            f"like staleness: verl's staleness_threshold 0.5 lets at most half a batch run ahead; the closest "
            f"bound here is K = 1: {by_k[1]:.2f}x (abort) against verl's {VERL_PUBLISHED_STEP_SPEEDUP:.2f}x per "
            f"step, beside K = {max(ks)}'s {by_k[max(ks)]:.2f}x, which trains every group {max(ks)} versions stale"
        )
    lines.append(
        f"best: {best[1]}: {best[0]:.2f}x against verl's {VERL_PUBLISHED_STEP_SPEEDUP:.2f}x per step "
        f"(its batches trained in {best[2]:.1f} s against the expected batch's {b['train_s']:.1f} s: that "
        f"many fewer tokens put it past the expected-batch bound)"
    )
    if sensitivity:
        lines.append("-- sensitivity to the assumed MFU on 32 GPUs (mean, MFU on 128, decode speed refitted) --")
        for mfu in sensitivity:
            f = fit(mfu)
            q = verl_preset(**f)
            s = sync_phases(q, FIT_ROLLOUTS)
            a = async_phases(q, 2, "abort", rollouts)
            lines.append(
                f"   MFU {mfu}: mean {f['mean_response_len']:.0f}, MFU on 128 {f['train_mfu_at'][128]}, decode "
                f"speed {f['decode_speed']}; sync gen {s['gen']:.1f} s, step {s['step']:.1f} s; async K=2 abort "
                f"step {a['step']:.1f} s, {s['step'] / a['step']:.2f}x (against sync on verl's 4-GPU engines)"
            )
            say(lines[-1])
    return "\n".join(lines)
