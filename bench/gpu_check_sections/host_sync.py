"""gpu_check section "sync": no host synchronisation in compute_policy_loss(..., validate=False).

The detector also serves the "graph" section (which modes to capture last) and the compiled
variants of "speed" (the accelerator branches on the CPU)."""

from __future__ import annotations

import contextlib
import inspect
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from epic_slime.losses import LOSS_MODES
from epic_slime.losses import bounds as loss_bounds

from .common import BENCH_DIR, REPO_ROOT, device_inputs, forward_backward

# aten ops that wait for the device on CUDA (data-dependent output size or a value read back).
SYNCING_OPS = {
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "unique",
    "_unique",
    "_unique2",
    "unique_consecutive",
    "unique_dim",
    "bincount",
    "item",
    "repeat_interleave",
    "multinomial",
}


def _caller_outside() -> str:
    """file:line of the innermost project frame (where the syncing call was made)."""
    for frame in inspect.stack()[2:]:
        path = frame.filename
        if "epic_slime" in path and not Path(path).is_relative_to(BENCH_DIR):  # gpu_check's own frames
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
    original = loss_bounds.host_checks_are_free
    loss_bounds.host_checks_are_free = lambda x: False
    try:
        yield
    finally:
        loss_bounds.host_checks_are_free = original


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


def sync_site(exc: BaseException) -> str:
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
        return sync_site(exc)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def _sites_or_error(mode, inputs, topk, *, on_meta: bool) -> list[str]:
    """Sync sites with metrics on; an op that cannot run on meta (e.g. bincount, .item()) is one."""
    try:
        return detect_syncs(mode, inputs, topk, on_meta=on_meta, compute_metrics=True)
    except (RuntimeError, NotImplementedError) as exc:
        return [sync_site(exc)]


def section_sync(device, sizes, require_sync_free):
    dev, _ = device_inputs(*sizes.correctness, torch.float32, "cpu", seed=5)
    small_inputs, small_topk = dev["inputs"], dev["topk"]
    if device == "cuda":
        cuda_dev, _ = device_inputs(*sizes.correctness, torch.float32, "cuda", seed=5)
    rows = []
    for mode in sorted(LOSS_MODES):
        row = dict(
            mode=mode,
            meta_sites=detect_syncs(mode, small_inputs, small_topk, on_meta=True, compute_metrics=False),
            meta_metrics_sites=_sites_or_error(mode, small_inputs, small_topk, on_meta=True),
            metrics_sites=_sites_or_error(mode, small_inputs, small_topk, on_meta=False),
        )
        if device == "cuda":
            row["cuda_sync_debug"] = cuda_sync_debug(mode, cuda_dev["inputs"], cuda_dev["topk"], False)
            row["cuda_sync_debug_metrics"] = cuda_sync_debug(mode, cuda_dev["inputs"], cuda_dev["topk"], True)
        row["sync_free"] = not (
            row["meta_sites"]
            or row["meta_metrics_sites"]
            or row["metrics_sites"]
            or row.get("cuda_sync_debug")
            or row.get("cuda_sync_debug_metrics")
        )
        rows.append(row)
    not_free = [r["mode"] for r in rows if not r["sync_free"]]
    out = dict(
        status="fail" if require_sync_free and not_free else "pass",
        modes=rows,
        not_sync_free=not_free,
        require_sync_free=require_sync_free,
    )
    if device != "cuda":
        out["cuda_parts"] = (
            "skipped: no CUDA device (--cpu); set_sync_debug_mode needs one (CUDA graphs: section graph)"
        )
    return out
