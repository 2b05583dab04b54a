"""What every section of bench/gpu_check.py shares: sizes, inputs, one forward + backward, the error measure."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from epic_slime.losses import LOSS_MODES, compute_policy_loss
from epic_slime.losses.topk import topk_inputs_around
from loss_bench import PLAIN, make_inputs, plain_ppo_clip  # the 6-line PPO clip baseline (bench/ is on the path)

BENCH_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = BENCH_DIR.parent
ENTRY_POINT = BENCH_DIR / "gpu_check.py"
SECTIONS = ("correctness", "bounds", "sync", "speed", "slime", "graph")  # graph last: a failed capture may break CUDA
TOPK = 20  # top-k ids per token of the Top-K modes (K = 21 columns with the sampled token)


@dataclasses.dataclass(frozen=True)
class Sizes:
    correctness: tuple[int, int]
    bounds_points: int
    speed: tuple[int, int]
    repeats: int
    slime_samples: tuple[tuple[int, int], ...]  # (total length, response length)
    slime_vocab: int


GPU_SIZES = Sizes(
    correctness=(64, 4096),
    bounds_points=1 << 20,
    speed=(512, 16384),
    repeats=10,
    slime_samples=((1100, 1024), (2100, 2048), (300, 200), (700, 77)),
    slime_vocab=4096,
)
CPU_SIZES = Sizes(
    correctness=(4, 96),
    bounds_points=4096,
    speed=(4, 512),
    repeats=3,
    slime_samples=((9, 5), (20, 17), (7, 1), (33, 30)),
    slime_vocab=11,
)


def device_inputs(batch, seq, dtype, device, seed=0, with_topk=True):
    """(log pi, log mu, advantages, mask) in ``dtype`` on ``device`` + Top-K sets (for the Top-K
    modes); float64 CPU copies of the same rounded values for the reference."""
    lp, blp, adv, mask = make_inputs(batch, seq, torch.float64, "cpu", seed=seed)
    lp, blp, adv = (t.to(dtype) for t in (lp, blp, adv))
    topk_kw = {}
    if with_topk:
        topk = topk_inputs_around(lp.double(), blp.double(), TOPK, generator=torch.Generator().manual_seed(seed + 1))
        topk_kw = {k: v.to(dtype) if v.is_floating_point() else v for k, v in topk.loss_kwargs().items()}
    ref = dict(
        inputs=tuple(t.double() if t.is_floating_point() else t for t in (lp, blp, adv, mask)),
        topk={k: v.double() if v.is_floating_point() else v for k, v in topk_kw.items()},
    )
    dev = dict(
        inputs=tuple(t.to(device) for t in (lp, blp, adv, mask)), topk={k: v.to(device) for k, v in topk_kw.items()}
    )
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


def relative_error(a: torch.Tensor, b: torch.Tensor, where: torch.Tensor | None = None) -> float:
    """max |a - b| / max |b| (over ``where``), in float64 on the CPU."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if where is not None:
        a, b = a[where], b[where]
    if b.numel() == 0:
        return 0.0
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-300))
