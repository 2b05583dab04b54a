"""Forward+backward time and peak memory of every loss mode next to `grpo`, from one run.

    python bench/loss_bench.py                      # B x T = 64 x 16384, float32, CPU (+ CUDA if present)
    python bench/loss_bench.py --batch 8 --seq 4096 --repeats 7 --modes epic grpo

Timing: median of --repeats runs of loss + backward (metrics included, as in training; a second
column without metrics), modes interleaved round-robin so that background load hits all of them
alike; on the CPU the clock is process CPU time by default (robust to other jobs), on CUDA wall. Peak memory: bytes allocated above the inputs during one forward+backward: on CUDA
torch.cuda.max_memory_allocated; on CPU glibc's mallinfo2 (arena + mmapped bytes in use) sampled
before and after every aten op through a dispatch mode (temporaries inside one op are not seen).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from epic_slime.losses import LOSS_MODES, compute_policy_loss  # noqa: E402
from epic_slime.losses.topk import topk_inputs_around  # noqa: E402


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]


def _libc_in_use():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return None

    def in_use() -> int:
        info = libc.mallinfo2()
        return int(info.uordblks + info.hblkhd)

    return in_use


class _PeakSampler(TorchDispatchMode):
    def __init__(self, in_use):
        super().__init__()
        self.in_use = in_use
        self.peak = in_use()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.peak = max(self.peak, self.in_use())
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, self.in_use())
        return out


def make_inputs(batch: int, seq: int, dtype: torch.dtype, device: str, seed: int = 0):
    """Realistic-looking inputs: log-probs of sampled tokens, a stale behaviour policy, variable
    lengths (25%..100% of seq), group-normalised advantages."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    lp = torch.log(torch.rand(batch, seq, generator=g).clamp(min=1e-6)) * 0.3
    blp = (lp + 0.05 * torch.randn(batch, seq, generator=g)).clamp(max=-1e-6)
    lengths = torch.randint(seq // 4, seq + 1, (batch,), generator=g)
    mask = torch.arange(seq)[None, :] < lengths[:, None]
    adv = torch.randn(batch, generator=g)
    return (lp.to(device, dtype), blp.to(device, dtype), adv.to(device, dtype), mask.to(device))


_TOPK_INPUTS = {}  # id(inputs) -> Top-K sets for the modes that need them (built once per input)


def _run(mode, inputs, compute_metrics=True):
    lp, blp, adv, mask = inputs
    leaf = lp.detach().requires_grad_(True)
    topk = _TOPK_INPUTS[id(inputs)].loss_kwargs() if LOSS_MODES[mode].needs_topk else {}
    out = compute_policy_loss(mode, leaf, blp, adv, mask, compute_metrics=compute_metrics, **topk)
    out.loss.backward()
    return leaf.grad


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def time_modes(modes, inputs, device, repeats, compute_metrics, clock):
    for mode in modes:  # warm-up
        _run(mode, inputs, compute_metrics)
    samples = {mode: [] for mode in modes}
    for _ in range(repeats):
        for mode in modes:
            _sync(device)
            start = clock()
            _run(mode, inputs, compute_metrics)
            _sync(device)
            samples[mode].append(clock() - start)
    return {mode: statistics.median(v) for mode, v in samples.items()}


def peak_memory(mode, inputs, device) -> int | None:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        _run(mode, inputs)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    in_use = _libc_in_use()
    if in_use is None:
        return None
    _run(mode, inputs)  # warm the allocator
    base = in_use()
    with _PeakSampler(in_use) as sampler:
        grad = _run(mode, inputs)
    del grad
    return sampler.peak - base


def bench_device(device, args, modes):
    dtype = getattr(torch, args.dtype)
    inputs = make_inputs(args.batch, args.seq, dtype, device)
    # Top-K modes: sets of args.topk ids + the sampled token around the same tokens (not counted in "inputs").
    _TOPK_INPUTS[id(inputs)] = topk_inputs_around(inputs[0], inputs[1], args.topk,
                                                  generator=torch.Generator().manual_seed(1))
    input_bytes = sum(t.numel() * t.element_size() for t in inputs)
    # CPU: process time (all threads), which other jobs on the machine barely disturb; CUDA: wall.
    clock_name = args.clock or ("cpu" if device == "cpu" else "wall")
    clock = time.process_time if clock_name == "cpu" else time.perf_counter
    with_metrics = time_modes(modes, inputs, device, args.repeats, True, clock)
    without_metrics = time_modes(modes, inputs, device, args.repeats, False, clock)
    for mode in modes:  # let the allocator settle first, or the first mode measured looks worse
        _run(mode, inputs)
    memory = {mode: peak_memory(mode, inputs, device) for mode in modes}
    base_t, base_t_nm, base_m = with_metrics["grpo"], without_metrics["grpo"], memory["grpo"]
    print(f"\n## {device}: B x T = {args.batch} x {args.seq}, {args.dtype}, "
          f"{torch.get_num_threads()} threads, {clock_name} time, median of {args.repeats}; inputs {input_bytes / 2**20:.1f} MiB")
    print("| mode | fwd+bwd ms | x grpo | fwd+bwd ms, no metrics | x grpo | peak MiB above inputs | x grpo |")
    print("|---|---|---|---|---|---|---|")
    for mode in modes:
        mem = memory[mode]
        mem_cols = ("n/a", "n/a") if mem is None else (f"{mem / 2**20:.1f}", f"{mem / max(base_m, 1):.2f}")
        print(f"| {mode} | {with_metrics[mode] * 1e3:.1f} | {with_metrics[mode] / base_t:.2f} | "
              f"{without_metrics[mode] * 1e3:.1f} | {without_metrics[mode] / base_t_nm:.2f} | "
              f"{mem_cols[0]} | {mem_cols[1]} |")
    return with_metrics, without_metrics, memory


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=16384)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--topk", type=int, default=20, help="top-k ids per token for the Top-K modes")
    parser.add_argument("--modes", nargs="*", default=None, help="default: every registered mode")
    parser.add_argument("--devices", nargs="*", default=None, help="default: cpu, and cuda when present")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: with more, process CPU time also counts "
                             "OpenMP spin-waiting, which blurs the ratios on a busy machine)")
    parser.add_argument("--clock", choices=["cpu", "wall"], default=None,
                        help="timer (default: process CPU time on cpu, wall time on cuda)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    modes = args.modes or sorted(LOSS_MODES)
    if "grpo" not in modes:
        modes = ["grpo", *modes]
    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    for device in devices:
        bench_device(device, args, modes)


if __name__ == "__main__":
    main()
