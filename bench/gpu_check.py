"""One prepared check of the loss path on a GPU: correctness, bf16, host syncs, speed, slime.

    python bench/gpu_check.py                   # CUDA, about 5 minutes on one H200, no network
    python bench/gpu_check.py --cpu             # small sizes on the CPU (part of the test suite)
    python bench/gpu_check.py --out figs.json --sections correctness sync

Sections (each one records "pass" / "fail" / "skip" with a reason in one JSON, --out):

  correctness  every registered mode on the device against the core on the CPU in float64, on the
               same (dtype-rounded) inputs: loss, gradient (tokens whose clip decision agrees),
               clip-decision mismatches; float32 and bfloat16 inputs. Also grpo == the plain
               6-line PPO clip written below (value and gradient).
  bounds       exact_kl_log_bounds on the device (float32, float64) against the CPU float64 solver.
  sync         no host synchronisation in compute_policy_loss(..., validate=False), with and
               without metrics (validation's value check is the one documented sync):
               * everywhere: a detector on the "meta" device (which takes the accelerator branches
                 of the core, and raises on .item() / bool() / bincount) that records data-dependent
                 ops and tensors built from Python data on the device (an H2D copy, i.e. a sync on
                 CUDA), metrics off and on; and the same detector on the CPU with the accelerator
                 branches forced and metrics on (for ops without meta kernels);
               * CUDA only: torch.cuda.set_sync_debug_mode("error") around forward + backward,
                 metrics off and on.
  speed        forward + backward time of epic, its ablations, grpo, gspo, ctpo, cppo, bandpo at
               512 x 16384 (CUDA; --cpu: 4 x 512), with and without metrics, as ratios to grpo
               and to the plain PPO clip in the same run, plus peak memory above the inputs (CUDA);
               and a torch.compile'd loss (kept only if exact and faster; --cpu: dynamo with the
               "eager" backend, i.e. tracing only, never timed as a verdict).
  slime        slime's own loss_function (world size 1; NCCL on CUDA, gloo on the CPU) with
               --loss-type custom_loss and the project's loss, against the core on log-probs
               computed here from the same logits: loss and logit gradients.
  graph        (CUDA only, last) CUDA-graph capture of forward + backward (validate=False, no
               metrics) of every mode and of the plain PPO clip (the control), replayed against eager.

Host syncs found by the detector fail the run only with --require-sync-free (see README
"Performance on a GPU" for the current findings); every other failed check gives exit status 1.

slime and megatron-core (the slime section; nothing is fetched): slime's source is the first of
--slime-path, $SLIME_PATH, bench/slime-624b824a, ../shared/vendor/slime-624b824a (beside the repo);
megatron-core is imported if installed, else installed with pip --no-index --no-deps into a
temporary folder from a megatron_core-0.16.1 wheel in --wheel-dir (default bench/wheels/).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import importlib
import inspect
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(BENCH_DIR))
from epic_slime.losses import LOSS_MODES, compute_policy_loss, exact_kl_log_bounds  # noqa: E402
from epic_slime.losses import bounds as _bounds  # noqa: E402
from epic_slime.losses.topk import topk_inputs_around  # noqa: E402
from loss_bench import PLAIN, make_inputs, plain_ppo_clip  # noqa: E402  (the 6-line PPO clip baseline)

SECTIONS = ("correctness", "bounds", "sync", "speed", "slime", "graph")  # graph last: a failed capture may break CUDA
SPEED_MODES = ("epic", "epic_raw_prob", "epic_cumulative", "grpo", "gspo", "ctpo", "cppo", "bandpo")
TOPK = 20  # top-k ids per token of the Top-K modes (K = 21 columns with the sampled token)


@dataclasses.dataclass(frozen=True)
class Sizes:
    correctness: tuple[int, int]
    bounds_points: int
    speed: tuple[int, int]
    repeats: int
    slime_samples: tuple[tuple[int, int], ...]  # (total length, response length)
    slime_vocab: int


GPU_SIZES = Sizes(correctness=(64, 4096), bounds_points=1 << 20, speed=(512, 16384), repeats=10,
                  slime_samples=((1100, 1024), (2100, 2048), (300, 200), (700, 77)), slime_vocab=4096)
CPU_SIZES = Sizes(correctness=(4, 96), bounds_points=4096, speed=(4, 512), repeats=3,
                  slime_samples=((9, 5), (20, 17), (7, 1), (33, 30)), slime_vocab=11)

# Tolerances against the CPU float64 core on the same inputs. The loss is computed in float32 for
# float32 and bfloat16 inputs; the gradient is returned in the input dtype (bf16: 8 bits).
LOSS_RTOL = 1e-4
GRAD_RTOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2}
MAX_DECISION_MISMATCH = 1e-3  # tokens sitting on a bound may be decided either way
BOUNDS_RTOL = {torch.float64: 1e-12, torch.float32: 2.4e-7}


# --------------------------------------------------------------------------------------------
# Inputs and one forward + backward
# --------------------------------------------------------------------------------------------

def device_inputs(batch, seq, dtype, device, seed=0, with_topk=True):
    """(log pi, log mu, advantages, mask) in ``dtype`` on ``device`` + Top-K sets (for the Top-K
    modes); float64 CPU copies of the same rounded values for the reference."""
    lp, blp, adv, mask = make_inputs(batch, seq, torch.float64, "cpu", seed=seed)
    lp, blp, adv = (t.to(dtype) for t in (lp, blp, adv))
    topk_kw = {}
    if with_topk:
        topk = topk_inputs_around(lp.double(), blp.double(), TOPK, generator=torch.Generator().manual_seed(seed + 1))
        topk_kw = {k: v.to(dtype) if v.is_floating_point() else v for k, v in topk.loss_kwargs().items()}
    ref = dict(inputs=tuple(t.double() if t.is_floating_point() else t for t in (lp, blp, adv, mask)),
               topk={k: v.double() if v.is_floating_point() else v for k, v in topk_kw.items()})
    dev = dict(inputs=tuple(t.to(device) for t in (lp, blp, adv, mask)),
               topk={k: v.to(device) for k, v in topk_kw.items()})
    return dev, ref


def forward_backward(mode, inputs, topk, *, compute_metrics=True, validate=True):
    """(output, gradient w.r.t. log pi) of one call; mode PLAIN is the 6-line baseline."""
    lp, blp, adv, mask = inputs
    leaf = lp.detach().clone().requires_grad_(True)
    if mode == PLAIN:
        loss = plain_ppo_clip(leaf, blp, adv, mask.to(leaf.dtype))
        loss.backward()
        return loss, leaf.grad
    extra = topk if LOSS_MODES[mode].needs_topk else {}
    out = compute_policy_loss(mode, leaf, blp, adv, mask, compute_metrics=compute_metrics, validate=validate, **extra)
    out.loss.backward()
    return out, leaf.grad


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _rel(a: torch.Tensor, b: torch.Tensor, where: torch.Tensor | None = None) -> float:
    """max |a - b| / max |b| (over ``where``), in float64 on the CPU."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if where is not None:
        a, b = a[where], b[where]
    if b.numel() == 0:
        return 0.0
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-300))


# --------------------------------------------------------------------------------------------
# correctness
# --------------------------------------------------------------------------------------------

def check_mode(mode, dev, ref, dtype):
    out, grad = forward_backward(mode, dev["inputs"], dev["topk"])
    ref_out, ref_grad = forward_backward(mode, ref["inputs"], ref["topk"])
    mask = ref["inputs"][3]
    mismatch = (out.clipped.cpu() != ref_out.clipped) & mask
    agree = mask & ~mismatch
    n_valid = int(mask.sum())
    row = dict(mode=mode, dtype=str(dtype).replace("torch.", ""),
               loss=float(out.loss.detach()), loss_ref=float(ref_out.loss.detach()),
               loss_rel_err=_rel(out.loss, ref_out.loss),
               grad_rel_err=_rel(grad, ref_grad, agree),
               decision_mismatch_frac=int(mismatch.sum()) / max(n_valid, 1),
               clipfrac=float(ref_out.metrics["clipfrac"]),
               finite=bool(torch.isfinite(out.loss).item() and torch.isfinite(grad).all().item()))
    row["ok"] = (row["finite"] and row["loss_rel_err"] <= LOSS_RTOL and row["grad_rel_err"] <= GRAD_RTOL[dtype]
                 and row["decision_mismatch_frac"] <= MAX_DECISION_MISMATCH)
    return row


def section_correctness(device, sizes):
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        dev, ref = device_inputs(*sizes.correctness, dtype, device, seed=3)
        for mode in sorted(LOSS_MODES):
            rows.append(check_mode(mode, dev, ref, dtype))
    # The plain PPO clip is grpo's definition: same value and gradient on the same inputs.
    dev, _ = device_inputs(*sizes.correctness, torch.float32, device, seed=4, with_topk=False)
    grpo_out, grpo_grad = forward_backward("grpo", dev["inputs"], dev["topk"])
    plain_loss, plain_grad = forward_backward(PLAIN, dev["inputs"], dev["topk"])
    plain = dict(loss_rel_err=_rel(plain_loss, grpo_out.loss), grad_rel_err=_rel(plain_grad, grpo_grad))
    plain["ok"] = plain["loss_rel_err"] <= LOSS_RTOL and plain["grad_rel_err"] <= GRAD_RTOL[torch.float32]
    ok = all(r["ok"] for r in rows) and plain["ok"]
    return dict(status="pass" if ok else "fail", size=list(sizes.correctness), modes=rows, grpo_vs_plain_ppo=plain,
                tolerances=dict(loss_rel=LOSS_RTOL, grad_rel={str(k): v for k, v in GRAD_RTOL.items()},
                                decision_mismatch=MAX_DECISION_MISMATCH))


# --------------------------------------------------------------------------------------------
# bounds
# --------------------------------------------------------------------------------------------

def solver_roots(log_c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 solver the core builds its tables from, on the CPU (the reference)."""
    x = log_c.double().cpu().contiguous()
    return (_bounds._solve_exact(x, _bounds._exact_lower_into), _bounds._solve_exact(x, _bounds._exact_upper_into))


def section_bounds(device, sizes):
    # c in [1e-12, 1e30], the documented accuracy range, plus exact grid nodes' neighbours.
    log_c = torch.linspace(math.log(1e-12), math.log(1e30), sizes.bounds_points, dtype=torch.float64)
    rows = []
    for dtype in (torch.float64, torch.float32):
        x = log_c.to(dtype)
        lower, upper = exact_kl_log_bounds(x.to(device))
        ref_lower, ref_upper = solver_roots(x)
        rel = lambda a, b: float(((a.double().cpu() - b) / b.abs().clamp(min=1e-300)).abs().max())  # noqa: E731
        row = dict(dtype=str(dtype).replace("torch.", ""), lower_rel_err=rel(lower, ref_lower),
                   upper_rel_err=rel(upper, ref_upper), points=int(x.numel()))
        special = torch.tensor([-math.inf, -1e4, 80.0, 700.0, 1e4, math.inf], dtype=dtype)
        s_lower, s_upper = exact_kl_log_bounds(special.to(device))
        s_lower, s_upper = s_lower.cpu(), s_upper.cpu()
        # finite for finite log c; +inf gives (-inf, +inf); -inf (c = 0) gives (0, 0)
        row["special_ok"] = bool(torch.isfinite(s_lower[1:-1]).all() and torch.isfinite(s_upper[1:-1]).all()
                                 and s_lower[-1] == -math.inf and s_upper[-1] == math.inf
                                 and s_lower[0] == 0 and s_upper[0] == 0)
        row["ok"] = (row["special_ok"] and row["lower_rel_err"] <= BOUNDS_RTOL[dtype]
                     and row["upper_rel_err"] <= BOUNDS_RTOL[dtype])
        rows.append(row)
    return dict(status="pass" if all(r["ok"] for r in rows) else "fail", rows=rows,
                tolerances={str(k): v for k, v in BOUNDS_RTOL.items()})


# --------------------------------------------------------------------------------------------
# sync
# --------------------------------------------------------------------------------------------

# aten ops that wait for the device on CUDA (data-dependent output size or a value read back).
SYNCING_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2",
               "unique_consecutive", "unique_dim", "bincount", "item", "repeat_interleave", "multinomial"}


def _caller_outside(skip_files=(__file__,)) -> str:
    """file:line of the innermost project frame (where the syncing call was made)."""
    for frame in inspect.stack()[2:]:
        path = frame.filename
        if "epic_slime" in path and path not in skip_files:
            return f"{Path(path).relative_to(REPO_ROOT)}:{frame.lineno} ({frame.function})"
    return "?"


class SyncDetector(TorchDispatchMode):
    """Records ops that synchronise with the host on an accelerator, and device tensors built from
    Python data (torch.tensor(x, device=...) copies from pageable host memory: a sync on CUDA)."""

    def __init__(self):
        super().__init__()
        self.sites: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        if name in SYNCING_OPS:
            self.sites.append(f"aten.{name} at {_caller_outside()}")
        elif name in ("_to_copy", "copy_"):
            tensors = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
            target = kwargs.get("device")
            devices = {t.device.type for t in tensors} | ({torch.device(target).type} if target is not None else set())
            if "cpu" in devices and len(devices) > 1:
                self.sites.append(f"aten.{name} host->device at {_caller_outside()}")
        return func(*args, **kwargs)

    @contextlib.contextmanager
    def watching_tensor_constructors(self):
        """torch.tensor / torch.as_tensor with a non-CPU device: visible here, not to the dispatcher."""
        originals = {name: getattr(torch, name) for name in ("tensor", "as_tensor")}

        def wrap(name, fn):
            def spy(*args, **kwargs):
                device = kwargs.get("device")
                if device is not None and torch.device(device).type != "cpu":
                    self.sites.append(f"torch.{name}(..., device={torch.device(device).type}) at {_caller_outside()}")
                return fn(*args, **kwargs)
            return spy

        for name, fn in originals.items():
            setattr(torch, name, wrap(name, fn))
        try:
            yield self
        finally:
            for name, fn in originals.items():
                setattr(torch, name, fn)


@contextlib.contextmanager
def accelerator_branches():
    """Make the core take its accelerator code paths on the CPU (no data-dependent shortcuts)."""
    original = _bounds.host_checks_are_free
    _bounds.host_checks_are_free = lambda x: False
    try:
        yield
    finally:
        _bounds.host_checks_are_free = original


def detect_syncs(mode, inputs, topk, *, on_meta: bool, compute_metrics: bool) -> list[str]:
    """Host-sync sites of one validate=False forward + backward (meta device: every accelerator branch
    with no data; the CPU with the accelerator branches forced: for ops without meta kernels)."""
    if on_meta:
        inputs = tuple(t.to("meta") for t in inputs)
        topk = {k: v.to("meta") for k, v in topk.items()}
    with accelerator_branches():
        forward_backward(mode, inputs, topk, compute_metrics=compute_metrics, validate=False)  # warm caches
        detector = SyncDetector()
        with detector.watching_tensor_constructors(), detector:
            forward_backward(mode, inputs, topk, compute_metrics=compute_metrics, validate=False)
    return sorted(set(detector.sites))


def _sync_site(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "epic_slime" in f.filename]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno} ({frames[-1].name})" if frames else "?"
    return f"{type(exc).__name__} at {where}: {str(exc).splitlines()[0][:160]}"


def cuda_sync_debug(mode, inputs, topk, compute_metrics) -> str | None:
    """None if forward + backward ran under set_sync_debug_mode("error"), else where it synced."""
    forward_backward(mode, inputs, topk, compute_metrics=compute_metrics, validate=False)  # tables, allocator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        forward_backward(mode, inputs, topk, compute_metrics=compute_metrics, validate=False)
        return None
    except RuntimeError as exc:
        return _sync_site(exc)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def cuda_graph_replay(mode, inputs, topk) -> dict:
    """Capture forward + backward (validate=False, no metrics) in a CUDA graph, replay, compare with eager."""
    lp, blp, adv, mask = inputs
    leaf = lp.detach().clone().requires_grad_(True)
    extra = topk if mode != PLAIN and LOSS_MODES[mode].needs_topk else {}

    def step():
        if mode == PLAIN:
            loss = plain_ppo_clip(leaf, blp, adv, mask.to(leaf.dtype))
        else:
            loss = compute_policy_loss(mode, leaf, blp, adv, mask, compute_metrics=False, validate=False, **extra).loss
        loss.backward()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            leaf.grad = None
            eager_loss = step().detach().clone()
    torch.cuda.current_stream().wait_stream(side)
    eager_grad = leaf.grad.detach().clone()
    leaf.grad = None
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            static_loss = step()
    except Exception as exc:  # noqa: BLE001 - any capture failure is the finding
        with contextlib.suppress(RuntimeError):  # a broken context is noticed by the caller
            torch.cuda.synchronize()
        return dict(captured=False, error=_sync_site(exc))
    graph.replay()
    torch.cuda.synchronize()
    return dict(captured=True, loss_rel_err=_rel(static_loss, eager_loss), grad_rel_err=_rel(leaf.grad, eager_grad))


def _sites_or_error(mode, inputs, topk, *, on_meta: bool) -> list[str]:
    """Sync sites with metrics on; an op that cannot run on meta (e.g. bincount, .item()) is one."""
    try:
        return detect_syncs(mode, inputs, topk, on_meta=on_meta, compute_metrics=True)
    except (RuntimeError, NotImplementedError) as exc:
        return [_sync_site(exc)]


def section_sync(device, sizes, require_sync_free):
    dev, _ = device_inputs(*sizes.correctness, torch.float32, "cpu", seed=5)
    small_inputs, small_topk = dev["inputs"], dev["topk"]
    if device == "cuda":
        cuda_dev, _ = device_inputs(*sizes.correctness, torch.float32, "cuda", seed=5)
    rows = []
    for mode in sorted(LOSS_MODES):
        row = dict(mode=mode,
                   meta_sites=detect_syncs(mode, small_inputs, small_topk, on_meta=True, compute_metrics=False),
                   meta_metrics_sites=_sites_or_error(mode, small_inputs, small_topk, on_meta=True),
                   metrics_sites=_sites_or_error(mode, small_inputs, small_topk, on_meta=False))
        if device == "cuda":
            row["cuda_sync_debug"] = cuda_sync_debug(mode, cuda_dev["inputs"], cuda_dev["topk"], False)
            row["cuda_sync_debug_metrics"] = cuda_sync_debug(mode, cuda_dev["inputs"], cuda_dev["topk"], True)
        row["sync_free"] = not (row["meta_sites"] or row["meta_metrics_sites"] or row["metrics_sites"]
                                or row.get("cuda_sync_debug") or row.get("cuda_sync_debug_metrics"))
        rows.append(row)
    not_free = [r["mode"] for r in rows if not r["sync_free"]]
    out = dict(status="fail" if require_sync_free and not_free else "pass", modes=rows, not_sync_free=not_free,
               require_sync_free=require_sync_free)
    if device != "cuda":
        out["cuda_parts"] = "skipped: no CUDA device (--cpu); set_sync_debug_mode needs one (CUDA graphs: section graph)"
    return out


def cuda_context_healthy() -> bool:
    try:
        return float(torch.ones(4, device="cuda").sum()) == 4.0
    except RuntimeError:
        return False


def section_graph(device, sizes, require_sync_free, capture=None, healthy=None):
    """CUDA-graph capture + replay of every mode (and of the plain PPO clip, the control). Modes the
    meta detector flags go last, and a failed capture that leaves the CUDA context unusable stops the
    rest (recorded as not run). ``capture`` / ``healthy`` stand in for CUDA in the tests."""
    if capture is None:
        if device != "cuda":
            return dict(status="skip", reason="no CUDA device (--cpu): CUDA-graph capture needs one")
        capture, healthy = cuda_graph_replay, cuda_context_healthy
    cpu_dev, _ = device_inputs(*sizes.correctness, torch.float32, "cpu", seed=5)
    flagged = {m: detect_syncs(m, cpu_dev["inputs"], cpu_dev["topk"], on_meta=True, compute_metrics=False)
               for m in LOSS_MODES}
    order = [PLAIN, *sorted(LOSS_MODES, key=lambda m: (bool(flagged[m]), m))]
    dev, _ = device_inputs(*sizes.correctness, torch.float32, device, seed=5)
    rows, unusable_after = [], None
    for mode in order:
        if unusable_after is not None:
            rows.append(dict(mode=mode, captured=False, ok=True,
                             error=f"not run: the CUDA context was unusable after {unusable_after}'s failed capture"))
            continue
        row = dict(mode=mode, expected_syncs=flagged.get(mode, []), **capture(mode, dev["inputs"], dev["topk"]))
        if not row["captured"] and not healthy():
            unusable_after = mode
        row["ok"] = not row["captured"] or (row["loss_rel_err"] <= 1e-6 and row["grad_rel_err"] <= 1e-6)
        rows.append(row)
    not_captured = [r["mode"] for r in rows if not r["captured"]]
    control_failed = not rows[0]["captured"]  # the plain PPO clip must capture, or the harness is broken
    failed = [r["mode"] for r in rows if not r["ok"]] + (not_captured if require_sync_free or control_failed else [])
    return dict(status="fail" if failed else "pass", modes=rows, not_captured=not_captured)


# --------------------------------------------------------------------------------------------
# speed
# --------------------------------------------------------------------------------------------

def _timer(device):
    if torch.device(device).type == "cuda":
        def measure(fn):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) / 1e3
    else:
        def measure(fn):
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
    return measure


def time_modes(modes, dev, device, repeats, compute_metrics):
    """Median seconds of forward + backward, modes interleaved so that drift hits all alike."""
    measure = _timer(device)
    run = {m: (lambda m=m: forward_backward(m, dev["inputs"], dev["topk"], compute_metrics=compute_metrics))
           for m in modes}
    for m in modes:
        run[m]()
    samples = {m: [] for m in modes}
    for _ in range(repeats):
        for m in modes:
            samples[m].append(measure(run[m]))
    return {m: statistics.median(v) for m, v in samples.items()}


def peak_memory(mode, dev, device) -> int | None:
    if torch.device(device).type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result = forward_backward(mode, dev["inputs"], dev["topk"])
    torch.cuda.synchronize()
    del result
    return torch.cuda.max_memory_allocated() - base


def compiled_variant(mode, dev, device, repeats) -> dict:
    """torch.compile of the loss (no metrics, validate=False): exact against eager? faster?
    On the CPU: dynamo with the "eager" backend over the accelerator branches (the graph CUDA gets)."""
    backend = "inductor" if torch.device(device).type == "cuda" else "eager"
    extra = dev["topk"] if LOSS_MODES[mode].needs_topk else {}
    lp, blp, adv, mask = dev["inputs"]

    def loss_of(leaf):
        return compute_policy_loss(mode, leaf, blp, adv, mask, compute_metrics=False, validate=False, **extra).loss

    compiled = torch.compile(loss_of, backend=backend, dynamic=False)

    def run(fn):
        leaf = lp.detach().clone().requires_grad_(True)
        loss = fn(leaf)
        loss.backward()
        return loss.detach(), leaf.grad

    start = time.perf_counter()
    try:
        c_loss, c_grad = run(compiled)
        sync(device)
    except Exception as exc:  # noqa: BLE001 - a failed compile is a result, not a crash
        return dict(mode=mode, backend=backend, compiled=False, error=f"{type(exc).__name__}: {str(exc)[:200]}")
    compile_s = time.perf_counter() - start
    e_loss, e_grad = run(loss_of)
    row = dict(mode=mode, backend=backend, compiled=True, compile_s=compile_s,
               loss_rel_err=_rel(c_loss, e_loss), grad_rel_err=_rel(c_grad, e_grad),
               bitwise=bool(torch.equal(c_loss, e_loss) and torch.equal(c_grad, e_grad)))
    measure = _timer(device)
    eager_t = statistics.median(measure(lambda: run(loss_of)) for _ in range(repeats))
    compiled_t = statistics.median(measure(lambda: run(compiled)) for _ in range(repeats))
    row.update(eager_s=eager_t, compiled_s=compiled_t, speedup=eager_t / compiled_t)
    exact = row["loss_rel_err"] <= 1e-6 and row["grad_rel_err"] <= 1e-6
    row["keep"] = bool(backend == "inductor" and exact and row["speedup"] > 1.05)
    return row


def compiled_in_subprocess(mode, device, timeout_s) -> dict:
    """`compiled_variant` in a child process (this script, --compile-one), so that a compile that
    runs long is cut off after ``timeout_s`` instead of eating the GPU's minutes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "compiled.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--compile-one", mode, "--out", str(out),
               *(["--cpu"] if device == "cpu" else [])]
        try:
            proc = subprocess.run(cmd, timeout=timeout_s, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return dict(mode=mode, compiled=False, error=f"compile + timing did not finish in {timeout_s:.0f} s (cut off)")
        if proc.returncode != 0 or not out.is_file():
            return dict(mode=mode, compiled=False, error=f"exit {proc.returncode}: {proc.stderr[-400:]}")
        return json.loads(out.read_text())


def run_compile_one(mode, device, sizes, out: Path) -> int:
    dev, _ = device_inputs(*sizes.speed, torch.float32, device, seed=6, with_topk=LOSS_MODES[mode].needs_topk)
    with accelerator_branches() if device == "cpu" else contextlib.nullcontext():
        row = compiled_variant(mode, dev, device, sizes.repeats)
    out.write_text(json.dumps(row))
    return 0


def section_speed(device, sizes, compile_modes, compile_timeout_s):
    dev, _ = device_inputs(*sizes.speed, torch.float32, device, seed=6, with_topk=False)  # no Top-K mode timed
    modes = [*SPEED_MODES, PLAIN]
    with_metrics = time_modes(modes, dev, device, sizes.repeats, True)
    without = time_modes(modes, dev, device, sizes.repeats, False)
    for m in modes:  # let the allocator settle before measuring peaks
        forward_backward(m, dev["inputs"], dev["topk"])
    memory = {m: peak_memory(m, dev, device) for m in modes}
    rows = []
    for m in modes:
        row = dict(mode=m, ms=with_metrics[m] * 1e3, ms_no_metrics=without[m] * 1e3,
                   x_grpo=with_metrics[m] / with_metrics["grpo"], x_grpo_no_metrics=without[m] / without["grpo"],
                   x_plain=with_metrics[m] / with_metrics[PLAIN], x_plain_no_metrics=without[m] / without[PLAIN],
                   peak_mib=None if memory[m] is None else memory[m] / 2**20)
        row["peak_x_grpo"] = None if memory[m] is None else memory[m] / max(memory["grpo"], 1)
        rows.append(row)
    input_bytes = sum(t.numel() * t.element_size() for t in dev["inputs"])
    del dev  # the compiled variants run in their own processes, on their own copy of the inputs
    compiled = [compiled_in_subprocess(m, device, compile_timeout_s) for m in compile_modes]
    out = dict(status="pass", size=list(sizes.speed), dtype="float32", repeats=sizes.repeats,
               input_mib=input_bytes / 2**20, clock="cuda events" if device == "cuda" else "wall (perf_counter)",
               modes=rows, compiled=compiled)
    if device != "cuda":
        out["note"] = "--cpu: small sizes to exercise the code; no memory figures, ratios not meaningful"
    return out


# --------------------------------------------------------------------------------------------
# slime
# --------------------------------------------------------------------------------------------

def find_slime(explicit: str | None) -> Path | None:
    candidates = [explicit, os.environ.get("SLIME_PATH"), BENCH_DIR / "slime-624b824a",
                  REPO_ROOT.parent / "shared" / "vendor" / "slime-624b824a"]
    for c in candidates:
        if c and (Path(c) / "slime" / "backends" / "megatron_utils" / "loss.py").is_file():
            return Path(c)
    return None


def import_with_local_wheels(module: str, wheel_dir: Path) -> str:
    """Import ``module``; if a module is missing, install every wheel in ``wheel_dir`` into a
    temporary folder (pip --no-index --no-deps: nothing is fetched, the environment is left as
    it is) and try once more. Returns how it was found; raises ImportError naming what is missing."""
    try:
        importlib.import_module(module)
        return "installed"
    except ModuleNotFoundError as exc:
        missing = exc.name
    wheels = sorted(glob.glob(str(wheel_dir / "*.whl")))
    if not wheels:
        raise ImportError(f"importing {module}: no module named {missing!r} and no wheel in {wheel_dir}")
    target = tempfile.mkdtemp(prefix="gpu_check_wheels_")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
                    "--disable-pip-version-check", "--target", target, *wheels], check=True)
    sys.path.insert(0, target)
    importlib.invalidate_caches()
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ImportError(f"importing {module}: no module named {exc.name!r}, not in the wheels of {wheel_dir} either") from exc
    return f"wheels from {wheel_dir}: {', '.join(Path(w).name for w in wheels)}"


SLIME_CASES = ("epic", "grpo", "gspo", "dapo")  # dapo: slime's per-token (token-mean) mode
SLIME_TEMPERATURE = 0.8


def slime_args(mode):
    from epic_slime.losses.flags import add_policy_loss_arguments

    parser = argparse.ArgumentParser()
    add_policy_loss_arguments(parser)
    args = parser.parse_args(["--policy-loss", mode])
    aggregation = args.policy_loss_aggregation or LOSS_MODES[mode].aggregation
    settings = dict(loss_type="custom_loss", custom_loss_function_path="epic_slime.slime.loss.policy_loss",
                    calculate_per_token_loss=aggregation == "token-mean", recompute_loss_function=False,
                    allgather_cp=False, rollout_temperature=SLIME_TEMPERATURE, rollout_top_p=1.0,
                    log_probs_chunk_size=-1, entropy_coef=0.0, use_kl_loss=False, kl_loss_coef=0.0,
                    kl_loss_type="low_var_kl", use_unbiased_kl=False, use_rollout_logprobs=False,
                    behavior_logprobs="rollout")
    for key, value in settings.items():
        setattr(args, key, value)
    return args, aggregation


def response_log_probs(logits, tokens, resp):
    """log softmax(logits / T) of each response token, read from the logit one position earlier."""
    total = tokens.numel()
    scores = torch.log_softmax(logits[total - resp - 1: total - 1].float() / SLIME_TEMPERATURE, dim=-1)
    return scores.gather(1, tokens[total - resp:, None]).squeeze(1)


def slime_samples(sizes, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    samples = []
    for k, (total, resp) in enumerate(sizes.slime_samples):
        logits = torch.randn(total, sizes.slime_vocab, generator=g)
        tokens = torch.randint(0, sizes.slime_vocab, (total,), generator=g)
        mask = torch.ones(resp, dtype=torch.int32)
        mask[1:resp:7] = 0 if resp > 3 else 1
        log_pi = response_log_probs(logits, tokens, resp)
        # a stale behaviour policy, some tokens far off so that clipping acts
        log_mu = (log_pi + 0.05 * torch.randn(resp, generator=g) + 0.5 * (torch.arange(resp) % 5 == 0)).clamp(max=-1e-3)
        adv = torch.full((resp,), (1.0, -0.6, 0.3, -1.1)[k % 4])
        samples.append({key: v.to(device) if torch.is_tensor(v) else v for key, v in
                        dict(total=total, resp=resp, logits=logits, tokens=tokens, mask=mask, log_mu=log_mu, adv=adv).items()})
    return samples


def slime_loss_and_grads(mode, samples):
    """slime's loss_function on one rank (THD stream of the samples' logits), rescaling undone."""
    from slime.backends.megatron_utils.loss import loss_function

    args, aggregation = slime_args(mode)
    leaves = [s["logits"].clone().requires_grad_(True) for s in samples]
    batch = {
        "unconcat_tokens": [s["tokens"] for s in samples], "total_lengths": [s["total"] for s in samples],
        "response_lengths": [s["resp"] for s in samples], "loss_masks": [s["mask"] for s in samples],
        "advantages": [s["adv"] for s in samples], "rollout_log_probs": [s["log_mu"] for s in samples],
        "ref_log_probs": [s["log_mu"] for s in samples], "log_probs": None,
        "rollout_mask_sums": torch.stack([s["mask"].sum().float() for s in samples]),
    }
    scaled, _, _ = loss_function(args, batch, 1, len(samples), torch.cat(leaves)[None])
    scaled.backward()
    # world size 1: slime scales a per-sample mean by 1 / step_global_batch_size; per-token mode by 1
    factor = 1.0 if aggregation == "token-mean" else 1.0 / len(samples)
    return scaled.detach() / factor, [leaf.grad / factor for leaf in leaves]


def core_loss_and_grads(mode, samples):
    """The core on log-probs computed here, reduced as slime's step sums (sample means / token sum)."""
    from torch.nn.utils.rnn import pad_sequence

    _, aggregation = slime_args(mode)
    leaves = [s["logits"].clone().requires_grad_(True) for s in samples]
    log_pi = [response_log_probs(leaf, s["tokens"], s["resp"]) for leaf, s in zip(leaves, samples)]
    mask = pad_sequence([s["mask"].bool() for s in samples], batch_first=True)
    out = compute_policy_loss(mode, pad_sequence(log_pi, batch_first=True),
                              pad_sequence([s["log_mu"] for s in samples], batch_first=True),
                              pad_sequence([s["adv"] for s in samples], batch_first=True), mask, aggregation=aggregation)
    loss = out.loss * (mask.sum() if aggregation == "token-mean" else len(samples))
    loss.backward()
    return loss.detach(), [leaf.grad for leaf in leaves]


def section_slime(device, sizes, slime_path, wheel_dir):
    path = find_slime(slime_path)
    if path is None:
        return dict(status="skip", reason="slime's source not found (--slime-path, $SLIME_PATH, bench/slime-624b824a, "
                                          "../shared/vendor/slime-624b824a)")
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    try:
        megatron_from = import_with_local_wheels("slime.backends.megatron_utils.loss", wheel_dir)
    except Exception as exc:  # noqa: BLE001 - a missing precondition is a skip with its reason
        return dict(status="skip", reason=f"slime / megatron-core not importable: {type(exc).__name__}: {exc}"[:400])
    import torch.distributed as dist
    from megatron.core import parallel_state

    backend = "nccl" if device == "cuda" else "gloo"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        started_here = not dist.is_initialized()
        if started_here:
            if device == "cuda":
                torch.cuda.set_device(0)
            dist.init_process_group(backend, init_method=f"file://{tmp}/init", rank=0, world_size=1)
        try:
            parallel_state.initialize_model_parallel()
            samples = slime_samples(sizes, device)
            for mode in SLIME_CASES:
                s_loss, s_grads = slime_loss_and_grads(mode, samples)
                c_loss, c_grads = core_loss_and_grads(mode, samples)
                row = dict(mode=mode, loss=float(s_loss), loss_core=float(c_loss),
                           loss_rel_err=_rel(s_loss, c_loss),
                           grad_rel_err=max(_rel(a, b) for a, b in zip(s_grads, c_grads)),
                           grad_nonzero=sum(float(g.abs().sum()) > 0 for g in c_grads))
                row["ok"] = row["loss_rel_err"] <= 1e-5 and row["grad_rel_err"] <= 1e-4 and row["grad_nonzero"] >= 2
                rows.append(row)
        finally:
            parallel_state.destroy_model_parallel()
            if started_here:
                dist.destroy_process_group()
    return dict(status="pass" if all(r["ok"] for r in rows) else "fail", slime_path=str(path),
                megatron=megatron_from, backend=backend, samples=[list(s) for s in sizes.slime_samples],
                vocab=sizes.slime_vocab, modes=rows)


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def print_table(results):
    print(f"\n# gpu_check on {results['device_name']} ({results['date']}), torch {results['torch']}")
    for name in SECTIONS:
        section = results["sections"].get(name)
        if section is None:
            continue
        print(f"\n## {name}: {section['status']}" + (f" ({section['reason']})" if "reason" in section else ""))
        if "error" in section:  # the section itself broke: its traceback is in the JSON
            print(section["error"])
            continue
        if section["status"] == "skip":
            continue
        if name == "correctness":
            print("| mode | dtype | loss rel err | grad rel err | decision mismatch | ok |")
            for r in section["modes"]:
                print(f"| {r['mode']} | {r['dtype']} | {r['loss_rel_err']:.1e} | {r['grad_rel_err']:.1e} | "
                      f"{r['decision_mismatch_frac']:.1e} | {r['ok']} |")
            p = section["grpo_vs_plain_ppo"]
            print(f"grpo vs plain PPO clip: loss {p['loss_rel_err']:.1e}, grad {p['grad_rel_err']:.1e}")
        elif name == "bounds":
            for r in section["rows"]:
                print(f"{r['dtype']}: lower {r['lower_rel_err']:.1e}, upper {r['upper_rel_err']:.1e}, "
                      f"special values ok {r['special_ok']}")
        elif name == "sync":
            print("| mode | meta detector | meta, metrics on | CPU accelerator branches, metrics on | CUDA sync-debug | CUDA, metrics on |")
            for r in section["modes"]:
                print(f"| {r['mode']} | {'; '.join(r['meta_sites']) or 'none'} | {'; '.join(r['meta_metrics_sites']) or 'none'} | "
                      f"{'; '.join(r['metrics_sites']) or 'none'} | {r.get('cuda_sync_debug', 'n/a') or 'none'} | "
                      f"{r.get('cuda_sync_debug_metrics', 'n/a') or 'none'} |")
        elif name == "graph":
            for r in section["modes"]:
                print(f"{r['mode']}: " + (f"replay vs eager loss {r['loss_rel_err']:.0e}, grad {r['grad_rel_err']:.0e}"
                                          if r["captured"] else r["error"]))
        elif name == "speed":
            print(f"B x T = {section['size']}, {section['clock']}, median of {section['repeats']}")
            print("| mode | ms | x grpo | x plain | ms no metrics | x grpo | x plain | peak MiB | x grpo |")
            for r in section["modes"]:
                mem = "n/a" if r["peak_mib"] is None else f"{r['peak_mib']:.0f} | {r['peak_x_grpo']:.2f}"
                print(f"| {r['mode']} | {r['ms']:.2f} | {r['x_grpo']:.2f} | {r['x_plain']:.2f} | "
                      f"{r['ms_no_metrics']:.2f} | {r['x_grpo_no_metrics']:.2f} | {r['x_plain_no_metrics']:.2f} | "
                      f"{mem if r['peak_mib'] is not None else 'n/a | n/a'} |")
            for c in section["compiled"]:
                print("torch.compile", {k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in c.items()})
        elif name == "slime":
            for r in section.get("modes", []):
                print(f"{r['mode']}: loss rel err {r['loss_rel_err']:.1e}, grad rel err {r['grad_rel_err']:.1e}, ok {r['ok']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="small sizes on the CPU; CUDA-only parts skipped")
    parser.add_argument("--sections", nargs="*", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument("--out", default=None, help="JSON of all figures (default gpu_check_<device>.json here)")
    parser.add_argument("--slime-path", default=None)
    parser.add_argument("--wheel-dir", default=str(BENCH_DIR / "wheels"))
    parser.add_argument("--compile-modes", nargs="*", default=None,
                        help="modes with a torch.compile'd variant (default: grpo epic; --cpu: epic)")
    parser.add_argument("--compile-timeout-s", type=float, default=100.0,
                        help="cut off a compiled variant (compile + timing, own process) after this")
    parser.add_argument("--compile-one", default=None, help=argparse.SUPPRESS)  # internal: one compiled variant
    parser.add_argument("--require-sync-free", action="store_true",
                        help="fail when the sync detector finds a host sync (default: report it)")
    args = parser.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --cpu")
    device = "cpu" if args.cpu else "cuda"
    sizes = CPU_SIZES if args.cpu else GPU_SIZES
    if args.compile_modes is None:
        args.compile_modes = ["epic"] if args.cpu else ["grpo", "epic"]
    if args.compile_one:
        return run_compile_one(args.compile_one, device, sizes, Path(args.out))
    results = dict(device=device, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), torch=torch.__version__,
                   device_name=torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
                   sizes=dataclasses.asdict(sizes), sections={}, seconds={})
    for name in args.sections:
        start = time.perf_counter()
        try:
            if name == "correctness":
                section = section_correctness(device, sizes)
            elif name == "bounds":
                section = section_bounds(device, sizes)
            elif name == "sync":
                section = section_sync(device, sizes, args.require_sync_free)
            elif name == "graph":
                section = section_graph(device, sizes, args.require_sync_free)
            elif name == "speed":
                section = section_speed(device, sizes, args.compile_modes, args.compile_timeout_s)
            else:
                section = section_slime(device, sizes, args.slime_path, Path(args.wheel_dir))
        except Exception as exc:  # noqa: BLE001 - one broken section must not cost the others' figures
            section = dict(status="fail", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        results["sections"][name] = section
        results["seconds"][name] = time.perf_counter() - start
        print(f"[{name}] {section['status']} in {results['seconds'][name]:.1f} s", flush=True)
    out = Path(args.out or f"gpu_check_{device}.json")
    out.write_text(json.dumps(results, indent=1, default=str))
    print_table(results)
    failed = [n for n, s in results["sections"].items() if s["status"] == "fail"]
    print(f"\nwrote {out}; " + (f"FAILED: {', '.join(failed)}" if failed else "all checks passed or skipped"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
