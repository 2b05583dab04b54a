"""gpu_check section "graph": CUDA-graph capture of forward + backward of every mode, replayed against eager."""

from __future__ import annotations

import contextlib

import torch

from epic_slime.losses import LOSS_MODES, compute_policy_loss

from .common import PLAIN, device_inputs, plain_ppo_clip, relative_error
from .host_sync import detect_syncs, sync_site


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
        return dict(captured=False, error=sync_site(exc))
    graph.replay()
    torch.cuda.synchronize()
    return dict(
        captured=True,
        loss_rel_err=relative_error(static_loss, eager_loss),
        grad_rel_err=relative_error(leaf.grad, eager_grad),
    )


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
    flagged = {
        m: detect_syncs(m, cpu_dev["inputs"], cpu_dev["topk"], on_meta=True, compute_metrics=False) for m in LOSS_MODES
    }
    order = [PLAIN, *sorted(LOSS_MODES, key=lambda m: (bool(flagged[m]), m))]
    dev, _ = device_inputs(*sizes.correctness, torch.float32, device, seed=5)
    rows, unusable_after = [], None
    for mode in order:
        if unusable_after is not None:
            rows.append(
                dict(
                    mode=mode,
                    captured=False,
                    ok=True,
                    error=f"not run: the CUDA context was unusable after {unusable_after}'s failed capture",
                )
            )
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
