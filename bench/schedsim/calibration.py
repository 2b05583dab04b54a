"""The engine model against published decode-throughput measurements of Qwen3-30B-A3B.

Two regimes, the two the schedules live in:
- batch 1 (a schedule's tail: one long response decoding alone): vLLM on one A100,
  tenstorrent/tt-inference-server#340 ("Performance Benchmark Sweeps for Qwen3-30B-A3B on A100"),
  concurrency 1, ISL 128 / 8192, OSL 128: 103.9 / 93.94 tok/s;
- saturated (engines full: the bound's regime): SGLang on H20, sgl-project/sglang#5839 (fused-MoE
  configs for Qwen3 BF16 on H20, output token throughput after the change), TP1 at input-output
  1000-2000 / 5000-1000 / 10000-500: 2634.68 / 974.33 / 357.94 tok/s; TP4 at 1000-2000: 5606.77 tok/s.
  Its TP4 rows before the tuned configs (1000-2000: 4247.26, 5000-1000: 3416.06 tok/s; TP1 before:
  2364.46 / 899.59) enter the tensor-parallel fit below (``TP_POINTS``), not the TP1 table.
  The batch there is what the KV cache holds (bench_serving sends all 1000 prompts at once), so the
  three lengths are three batch sizes (about 120, 43 and 23 running at TP1 by the model's capacity).

Model: a decode step at batch b and mean context c costs t_base + c_tok b + c_kv b c; saturated, the
engine also prefills every input at the prefill rate, so output tok/s = O / (I / P + O / D), with D the
decode rate at b = min(requests, capacity / (I + O / 2)). SGLang's static memory share for a
standalone server is assumed 0.88 (its default on large GPUs; slime sets 0.7 in the presets).

Tensor parallelism: an engine of g GPUs runs c_tok, c_kv and prefill g ** tp_alpha times as fast as one
GPU. ``fit_tp_alpha`` fits tp_alpha to the TP4 point through this model (each point at the batch its KV
cache holds: about 119 at TP1, all 1000 at TP4), with the TP1 constants as calibrated above; the preset's
TP_ALPHA_FITTED is its result, rounded. One TP1/TP4 pair on one GPU type is thin evidence, so
``tp_alpha_range`` fits every TP4 row #5839 publishes, each two ways (the TP4 point through the model
calibrated at TP1, and the modelled TP4 / TP1 ratio against the measured one at the same tuning), and
gives the range they allow for SGLang as it runs now (tuned configs): from the lowest tuned fit to 1.0.
The top is 1.0 because the tuned 5000-1000 TP4 row is not published beside its untuned 3416.06 tok/s
(which already implies about 0.86): tuning raised every other row, and the model stops at linear
scaling. The untuned 1000-2000 row (about 0.3) describes kernels SGLang no longer runs with."""

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
    p = dataclasses.replace(
        base,
        gpu=gpu,
        gpus_per_engine=tp,
        c_tok=0.0,
        c_kv=0.0,
        kv_capacity_tokens=0.0,
        prefill_tok_s=0.0,
        peak_flops=0.0,
        hbm_bytes_s=0.0,
        mem_fraction=STANDALONE_MEM_FRACTION,
    ).derived()
    ctx = isl + osl / 2
    batch = concurrency if concurrency is not None else min(REQUESTS, p.kv_capacity_tokens / ctx)
    decode = batch / (p.t_base + p.c_tok * batch + p.c_kv * batch * ctx)
    if concurrency is not None and concurrency == 1:
        return decode, batch  # batch 1: TPOT-based decode rate (prefill is TTFT, not in it)
    prefill = p.engine_prefill_tok_s()
    return osl / (isl / prefill + osl / decode), batch


TP_FIT_POINT = ("sglang#5839", "H20", 4, None, 1000, 2000, 5606.77)
# sglang#5839's TP4 rows: (input, output, TP4 tok/s, TP1 tok/s at the same tuning, tuned?)
TP_POINTS = [
    (1000, 2000, 5606.77, 2634.68, True),
    (1000, 2000, 4247.26, 2364.46, False),
    (5000, 1000, 3416.06, 899.59, False),
]
TP_ALPHA_TOP = 1.0  # linear scaling: the model's ceiling (see the module docstring)


def fit_tp_alpha(base: Preset, point: tuple = TP_FIT_POINT, tol: float = 1e-6) -> float:
    """The tp_alpha at which the model meets ``point``'s measured tok/s (bisection: the model's tok/s
    rises with tp_alpha). Raises when no alpha in [0, 1] reaches it."""
    _, gpu, tp, conc, isl, osl, measured = point

    def model(alpha: float) -> float:
        return modelled_tok_s(dataclasses.replace(base, tp_alpha=alpha), gpu, tp, conc, isl, osl)[0]

    if not model(0.0) <= measured <= model(1.0):
        raise ValueError(
            f"fit_tp_alpha: measured {measured} tok/s is outside the model's range "
            f"{model(0.0):.1f}..{model(1.0):.1f} at tp_alpha 0..1"
        )
    return _bisect_rising(model, measured, tol)


def _bisect_rising(model, target: float, tol: float) -> float:
    """The alpha in [0, 1] where the rising ``model(alpha)`` meets ``target`` (checked to lie in range)."""
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if model(mid) < target else (lo, mid)
    return (lo + hi) / 2


def fit_tp_alpha_ratio(base: Preset, isl: int, osl: int, ratio: float, tol: float = 1e-6) -> float:
    """The tp_alpha at which the modelled TP4 / TP1 throughput ratio at (isl, osl) on H20 is ``ratio``
    (bisection: the modelled ratio rises with tp_alpha); the TP1 model's own error cancels."""
    tp1 = modelled_tok_s(base, "H20", 1, None, isl, osl)[0]

    def model(alpha: float) -> float:
        return modelled_tok_s(dataclasses.replace(base, tp_alpha=alpha), "H20", 4, None, isl, osl)[0] / tp1

    if not model(0.0) <= ratio <= model(1.0):
        raise ValueError(
            f"fit_tp_alpha_ratio: TP4/TP1 ratio {ratio:.3f} is outside the model's range "
            f"{model(0.0):.3f}..{model(1.0):.3f} at tp_alpha 0..1"
        )
    return _bisect_rising(model, ratio, tol)


def tp_alpha_fits(base: Preset) -> list[dict]:
    """Every #5839 TP4 row fitted two ways: the point through the TP1-calibrated model, and the ratio."""
    out = []
    for isl, osl, tp4, tp1, tuned in TP_POINTS:
        point = fit_tp_alpha(base, ("sglang#5839", "H20", 4, None, isl, osl, tp4))
        out.append(
            dict(
                isl=isl,
                osl=osl,
                tp4=tp4,
                tp1=tp1,
                tuned=tuned,
                point=point,
                ratio=fit_tp_alpha_ratio(base, isl, osl, tp4 / tp1),
            )
        )
    return out


def tp_alpha_range(base: Preset) -> tuple[float, float]:
    """The exponents the published TP4 rows allow for tuned SGLang: the lowest tuned fit .. 1.0 (module
    docstring: the untuned 5000-1000 row is a lower bound on its tuned value, about 0.86)."""
    fits = tp_alpha_fits(base)
    tuned = [v for f in fits if f["tuned"] for v in (f["point"], f["ratio"])]
    return round(min(tuned), 2), TP_ALPHA_TOP


def format_tp_fits(base: Preset) -> str:
    out = [
        "-- tp_alpha from every sglang#5839 TP4 row (H20), two ways --",
        f"{'in-out':>11s} {'kernels':8s} {'TP4':>8s} {'TP1':>8s} {'point fit':>9s} {'ratio fit':>9s}",
    ]
    for f in tp_alpha_fits(base):
        out.append(
            f"{f['isl']:>5d}-{f['osl']:<5d} {'tuned' if f['tuned'] else 'untuned':8s} {f['tp4']:8.1f} "
            f"{f['tp1']:8.1f} {f['point']:9.2f} {f['ratio']:9.2f}"
        )
    lo, hi = tp_alpha_range(base)
    out.append(
        f"allowed for tuned SGLang: tp_alpha {lo}-{hi} (the preset's {base.tp_alpha}; the untuned 5000-1000 row "
        "bounds its tuned value from below, the untuned 1000-2000 row is kernels SGLang no longer runs)"
    )
    return "\n".join(out)


def calibrate(base: Preset) -> list[dict]:
    out = []
    for src, gpu, tp, conc, isl, osl, measured in MEASUREMENTS:
        model, batch = modelled_tok_s(base, gpu, tp, conc, isl, osl)
        out.append(
            dict(
                source=src,
                gpu=gpu,
                tp=tp,
                concurrency=conc,
                isl=isl,
                osl=osl,
                batch=batch,
                measured=measured,
                model=model,
                error=model / measured - 1,
            )
        )
    return out


def format_calibration(rows: list[dict]) -> str:
    out = [
        f"{'source':12s} {'GPU':5s} {'TP':>2s} {'batch':>6s} {'in-out':>11s} {'measured':>9s} {'model':>8s} {'error':>6s}"
    ]
    for r in rows:
        batch = f"{r['batch']:.0f}" + ("" if r["concurrency"] else "*")
        out.append(
            f"{r['source']:12s} {r['gpu']:5s} {r['tp']:2d} {batch:>6s} {r['isl']:>5d}-{r['osl']:<5d} "
            f"{r['measured']:9.1f} {r['model']:8.1f} {r['error']:+6.0%}"
        )
    out.append(
        "* saturated: the batch the KV cache holds at that length; sources: "
        + "; ".join(f"{k}: {v}" for k, v in SOURCES.items())
    )
    return "\n".join(out)
