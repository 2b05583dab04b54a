"""The engine model against published decode-throughput measurements of Qwen3-30B-A3B.

Two regimes, the two the schedules live in:
- batch 1 (a schedule's tail: one long response decoding alone): vLLM on one A100,
  tenstorrent/tt-inference-server#340 ("Performance Benchmark Sweeps for Qwen3-30B-A3B on A100"),
  concurrency 1, ISL 128 / 8192, OSL 128: 103.9 / 93.94 tok/s;
- saturated (engines full: the bound's regime): SGLang on H20, sgl-project/sglang#5839 (fused-MoE
  configs for Qwen3 BF16 on H20, output token throughput after the change), TP1 at input-output
  1000-2000 / 5000-1000 / 10000-500: 2634.68 / 974.33 / 357.94 tok/s; TP4 at 1000-2000: 5606.77 tok/s.
  The batch there is what the KV cache holds (bench_serving sends all 1000 prompts at once), so the
  three lengths are three batch sizes (about 120, 43 and 23 running at TP1 by the model's capacity).

Model: a decode step at batch b and mean context c costs t_base + c_tok b + c_kv b c; saturated, the
engine also prefills every input at the prefill rate, so output tok/s = O / (I / P + O / D), with D the
decode rate at b = min(requests, capacity / (I + O / 2)). SGLang's static memory share for a
standalone server is assumed 0.88 (its default on large GPUs; slime sets 0.7 in the presets).

Tensor parallelism: an engine of g GPUs runs c_tok, c_kv and prefill g ** tp_alpha times as fast as one
GPU. ``fit_tp_alpha`` fits tp_alpha to the TP4 point through this model (each point at the batch its KV
cache holds: about 119 at TP1, all 1000 at TP4), with the TP1 constants as calibrated above; the preset's
TP_ALPHA_FITTED is its result, rounded. One TP1/TP4 pair on one GPU type is thin evidence."""

from __future__ import annotations

import dataclasses

from .presets import Preset

SOURCES = {
    "tt#340": "github.com/tenstorrent/tt-inference-server/issues/340 (vLLM, A100, concurrency 1)",
    "sglang#5839": "github.com/sgl-project/sglang/pull/5839 (SGLang, H20, BF16, bench_serving, 1000 prompts)",
}
# (source, gpu, tp, concurrency or None for saturated, input len, output len, measured output tok/s)
MEASUREMENTS = [
    ("tt#340", "A100", 1, 1, 128, 128, 103.9),
    ("tt#340", "A100", 1, 1, 8192, 128, 93.94),
    ("sglang#5839", "H20", 1, None, 1000, 2000, 2634.68),
    ("sglang#5839", "H20", 1, None, 5000, 1000, 974.33),
    ("sglang#5839", "H20", 1, None, 10000, 500, 357.94),
    ("sglang#5839", "H20", 4, None, 1000, 2000, 5606.77),
]
STANDALONE_MEM_FRACTION = 0.88
REQUESTS = 1000


def modelled_tok_s(base: Preset, gpu: str, tp: int, concurrency: int | None, isl: int, osl: int) -> tuple[float, float]:
    """(output tok/s, batch) the engine model predicts for one measurement's setting."""
    p = dataclasses.replace(base, gpu=gpu, gpus_per_engine=tp, c_tok=0.0, c_kv=0.0, kv_capacity_tokens=0.0,
                            prefill_tok_s=0.0, peak_flops=0.0, hbm_bytes_s=0.0,
                            mem_fraction=STANDALONE_MEM_FRACTION).derived()
    ctx = isl + osl / 2
    batch = concurrency if concurrency is not None else min(REQUESTS, p.kv_capacity_tokens / ctx)
    decode = batch / (p.t_base + p.c_tok * batch + p.c_kv * batch * ctx)
    if concurrency is not None and concurrency == 1:
        return decode, batch       # batch 1: TPOT-based decode rate (prefill is TTFT, not in it)
    prefill = p.engine_prefill_tok_s()
    return osl / (isl / prefill + osl / decode), batch


TP_FIT_POINT = ("sglang#5839", "H20", 4, None, 1000, 2000, 5606.77)


def fit_tp_alpha(base: Preset, point: tuple = TP_FIT_POINT, tol: float = 1e-6) -> float:
    """The tp_alpha at which the model meets ``point``'s measured tok/s (bisection: the model's tok/s
    rises with tp_alpha). Raises when no alpha in [0, 1] reaches it."""
    _, gpu, tp, conc, isl, osl, measured = point

    def model(alpha: float) -> float:
        return modelled_tok_s(dataclasses.replace(base, tp_alpha=alpha), gpu, tp, conc, isl, osl)[0]

    lo, hi = 0.0, 1.0
    if not model(lo) <= measured <= model(hi):
        raise ValueError(f"fit_tp_alpha: measured {measured} tok/s is outside the model's range "
                         f"{model(lo):.1f}..{model(hi):.1f} at tp_alpha 0..1")
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if model(mid) < measured else (lo, mid)
    return (lo + hi) / 2


def calibrate(base: Preset) -> list[dict]:
    out = []
    for src, gpu, tp, conc, isl, osl, measured in MEASUREMENTS:
        model, batch = modelled_tok_s(base, gpu, tp, conc, isl, osl)
        out.append(dict(source=src, gpu=gpu, tp=tp, concurrency=conc, isl=isl, osl=osl, batch=batch,
                        measured=measured, model=model, error=model / measured - 1))
    return out


def format_calibration(rows: list[dict]) -> str:
    out = [f"{'source':12s} {'GPU':5s} {'TP':>2s} {'batch':>6s} {'in-out':>11s} {'measured':>9s} {'model':>8s} {'error':>6s}"]
    for r in rows:
        batch = f"{r['batch']:.0f}" + ("" if r["concurrency"] else "*")
        out.append(f"{r['source']:12s} {r['gpu']:5s} {r['tp']:2d} {batch:>6s} {r['isl']:>5d}-{r['osl']:<5d} "
                   f"{r['measured']:9.1f} {r['model']:8.1f} {r['error']:+6.0%}")
    out.append("* saturated: the batch the KV cache holds at that length; sources: "
               + "; ".join(f"{k}: {v}" for k, v in SOURCES.items()))
    return "\n".join(out)
