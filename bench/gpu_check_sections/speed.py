"""gpu_check section "speed": forward + backward time and peak memory per mode, and a torch.compile'd loss."""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from epic_slime.losses import LOSS_MODES, compute_policy_loss

from .common import ENTRY_POINT, PLAIN, device_inputs, forward_backward, relative_error, sync
from .host_sync import accelerator_branches

SPEED_MODES = ("epic", "epic_raw_prob", "epic_cumulative", "grpo", "gspo", "ctpo", "cppo", "bandpo")


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
    run = {
        m: (lambda m=m: forward_backward(m, dev["inputs"], dev["topk"], compute_metrics=compute_metrics)) for m in modes
    }
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
    row = dict(
        mode=mode,
        backend=backend,
        compiled=True,
        compile_s=compile_s,
        loss_rel_err=relative_error(c_loss, e_loss),
        grad_rel_err=relative_error(c_grad, e_grad),
        bitwise=bool(torch.equal(c_loss, e_loss) and torch.equal(c_grad, e_grad)),
    )
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
        cmd = [
            sys.executable,
            str(ENTRY_POINT),
            "--compile-one",
            mode,
            "--out",
            str(out),
            *(["--cpu"] if device == "cpu" else []),
        ]
        try:
            proc = subprocess.run(cmd, timeout=timeout_s, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return dict(
                mode=mode, compiled=False, error=f"compile + timing did not finish in {timeout_s:.0f} s (cut off)"
            )
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
        row = dict(
            mode=m,
            ms=with_metrics[m] * 1e3,
            ms_no_metrics=without[m] * 1e3,
            x_grpo=with_metrics[m] / with_metrics["grpo"],
            x_grpo_no_metrics=without[m] / without["grpo"],
            x_plain=with_metrics[m] / with_metrics[PLAIN],
            x_plain_no_metrics=without[m] / without[PLAIN],
            peak_mib=None if memory[m] is None else memory[m] / 2**20,
        )
        row["peak_x_grpo"] = None if memory[m] is None else memory[m] / max(memory["grpo"], 1)
        rows.append(row)
    input_bytes = sum(t.numel() * t.element_size() for t in dev["inputs"])
    del dev  # the compiled variants run in their own processes, on their own copy of the inputs
    compiled = [compiled_in_subprocess(m, device, compile_timeout_s) for m in compile_modes]
    out = dict(
        status="pass",
        size=list(sizes.speed),
        dtype="float32",
        repeats=sizes.repeats,
        input_mib=input_bytes / 2**20,
        clock="cuda events" if device == "cuda" else "wall (perf_counter)",
        modes=rows,
        compiled=compiled,
    )
    if device != "cuda":
        out["note"] = "--cpu: small sizes to exercise the code; no memory figures, ratios not meaningful"
    return out
