"""Forward+backward time of every loss mode against a plain six-line PPO clip, from one run.

    python bench/loss_bench.py                      # B x T = 16 x 8192, float32, CPU (+ CUDA if present)
    python bench/loss_bench.py --batch 64 --seq 16384 --repeats 9 --modes epic grpo

Per mode, two configurations: "bare" (compute_metrics=False, validate=False: the loss alone) and
"full" (metrics + validation, as in training). Printed ratios, all from the same run:
  * bare / plain and full / plain: against `plain_ppo_clip` below (exp, minimum, clamp, masked mean);
  * overhead = (full - bare) / bare: what metrics + validation add to the mode's own loss;
  * the issue-20 targets: bare epic <= 3x plain, overhead <= 0.5 for every mode.
Timing: median of --repeats runs of loss + backward, every (mode, configuration) and the plain clip
interleaved round-robin so that background load hits all of them alike; on the CPU the clock is
process CPU time by default (robust to other jobs), on CUDA wall. Peak memory (full configuration):
bytes allocated above the inputs during one forward+backward: on CUDA torch.cuda.max_memory_allocated;
on CPU glibc's mallinfo2 (arena + mmapped bytes in use) sampled before and after every aten op
through a dispatch mode (temporaries inside one op are not seen).

Allocator: on the CPU, glibc serves each [B, T] temporary (0.5 MiB at the default size) with a
fresh mmap unless its thresholds are raised, and the page faults of touching it then cost more
than the arithmetic and vary with the machine's load (2-3x on a busy 2-core machine). The bench
raises M_MMAP_THRESHOLD and M_TRIM_THRESHOLD (mallopt) so temporaries are reused, as CUDA's
caching allocator reuses them; --system-allocator keeps glibc's defaults.
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
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


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


def pin_cpu_allocator() -> bool:
    """Keep freed temporaries in glibc's heap (see the module docstring). False if not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 1 << 30)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))


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


def plain_ppo_clip(log_probs, old_log_probs, advantages, mask, eps=0.2):
    """The baseline everyone writes: PPO clip, mean over each response's tokens, then over responses."""
    ratio = torch.exp(log_probs - old_log_probs)
    adv = advantages.unsqueeze(-1)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)
    per_token = -surrogate * mask
    return (per_token.sum(-1) / mask.sum(-1).clamp(min=1)).mean()


PLAIN = "plain_ppo_clip"
CONFIGS = {"bare": dict(compute_metrics=False, validate=False), "full": dict(compute_metrics=True, validate=True)}
TARGET_EPIC_BARE_X_PLAIN = 3.0
TARGET_OVERHEAD = 0.5

_TOPK_INPUTS = {}  # id(inputs) -> Top-K sets for the modes that need them (built once per input)


def _run(mode, inputs, compute_metrics=True, validate=True):
    lp, blp, adv, mask = inputs
    leaf = lp.detach().requires_grad_(True)
    if mode == PLAIN:
        plain_ppo_clip(leaf, blp, adv, _TOPK_INPUTS[id(inputs), "mask"]).backward()
        return leaf.grad
    topk = _TOPK_INPUTS[id(inputs)].loss_kwargs() if LOSS_MODES[mode].needs_topk else {}
    out = compute_policy_loss(mode, leaf, blp, adv, mask, compute_metrics=compute_metrics, validate=validate, **topk)
    out.loss.backward()
    return leaf.grad


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def time_runs(runs: dict, device, repeats, clock) -> dict:
    """Median seconds of each zero-argument callable, all interleaved round-robin."""
    for fn in runs.values():  # warm-up
        fn()
    samples = {key: [] for key in runs}
    for _ in range(repeats):
        for key, fn in runs.items():
            _sync(device)
            start = clock()
            fn()
            _sync(device)
            samples[key].append(clock() - start)
    return {key: statistics.median(v) for key, v in samples.items()}


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
    _TOPK_INPUTS[id(inputs)] = topk_inputs_around(
        inputs[0], inputs[1], args.topk, generator=torch.Generator().manual_seed(1)
    )
    _TOPK_INPUTS[id(inputs), "mask"] = inputs[3].to(dtype)  # the plain clip takes a float mask, as written
    input_bytes = sum(t.numel() * t.element_size() for t in inputs)
    # CPU: process time (all threads), which other jobs on the machine barely disturb; CUDA: wall.
    clock_name = args.clock or ("cpu" if device == "cpu" else "wall")
    clock = time.process_time if clock_name == "cpu" else time.perf_counter
    runs = {(PLAIN, "bare"): lambda: _run(PLAIN, inputs)}
    for mode in modes:
        for config, kw in CONFIGS.items():
            runs[mode, config] = lambda mode=mode, kw=kw: _run(mode, inputs, **kw)
    t = time_runs(runs, device, args.repeats, clock)
    for mode in modes:  # let the allocator settle first, or the first mode measured looks worse
        _run(mode, inputs)
    memory = {mode: peak_memory(mode, inputs, device) for mode in (PLAIN, *modes)} if args.memory else {}
    plain = t[PLAIN, "bare"]
    print(
        f"\n## {device}: B x T = {args.batch} x {args.seq}, {args.dtype}, "
        f"{torch.get_num_threads()} threads, {clock_name} time, median of {args.repeats}; inputs {input_bytes / 2**20:.1f} MiB"
        + (f"; CPU allocator: {args.allocator}" if device == "cpu" else "")
    )
    print(f"plain six-line PPO clip (the floor): {plain * 1e3:.2f} ms")
    print(
        "| mode | bare ms | bare x plain | full ms | full x plain | overhead (full - bare) / bare | peak MiB above inputs |"
    )
    print("|---|---|---|---|---|---|---|")
    rows = {}
    for mode in modes:
        bare, full = t[mode, "bare"], t[mode, "full"]
        rows[mode] = dict(
            bare_ms=bare * 1e3,
            full_ms=full * 1e3,
            bare_x_plain=bare / plain,
            full_x_plain=full / plain,
            overhead=(full - bare) / bare,
        )
        mem = memory.get(mode)
        mem_col = "n/a" if mem is None else f"{mem / 2**20:.1f}"
        r = rows[mode]
        print(
            f"| {mode} | {r['bare_ms']:.2f} | {r['bare_x_plain']:.2f} | {r['full_ms']:.2f} | "
            f"{r['full_x_plain']:.2f} | {r['overhead']:.2f} | {mem_col} |"
        )
    if "epic" in rows:
        ratio = rows["epic"]["bare_x_plain"]
        print(
            f"target: bare epic <= {TARGET_EPIC_BARE_X_PLAIN:g}x plain: {ratio:.2f}x "
            f"({'met' if ratio <= TARGET_EPIC_BARE_X_PLAIN else 'NOT met'})"
        )
    over = sorted((m for m, r in rows.items() if r["overhead"] > TARGET_OVERHEAD), key=lambda m: -rows[m]["overhead"])
    worst = max(rows, key=lambda m: rows[m]["overhead"])
    print(
        f"target: metrics + validation <= {TARGET_OVERHEAD:g}x bare for every mode: worst {worst} "
        f"{rows[worst]['overhead']:.2f} ({'met' if not over else 'NOT met by ' + ', '.join(over)})"
    )
    return dict(plain_ms=plain * 1e3, modes=rows, memory=memory)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory column")
    parser.add_argument("--topk", type=int, default=20, help="top-k ids per token for the Top-K modes")
    parser.add_argument("--modes", nargs="*", default=None, help="default: every registered mode")
    parser.add_argument("--devices", nargs="*", default=None, help="default: cpu, and cuda when present")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: with more, process CPU time also counts "
        "OpenMP spin-waiting, which blurs the ratios on a busy machine)",
    )
    parser.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default=None,
        help="timer (default: process CPU time on cpu, wall time on cuda)",
    )
    parser.add_argument(
        "--system-allocator",
        action="store_true",
        help="keep glibc's mmap / trim thresholds (see the allocator note above)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.allocator = (
        "glibc defaults"
        if args.system_allocator
        else ("glibc, temporaries kept in the heap" if pin_cpu_allocator() else "system (not glibc)")
    )
    modes = args.modes or sorted(LOSS_MODES)
    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    for device in devices:
        bench_device(device, args, modes)


if __name__ == "__main__":
    main()
