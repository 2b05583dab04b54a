"""gpu_check section "correctness": every mode on the device against the core on the CPU in float64."""

from __future__ import annotations

import torch

from epic_slime.losses import LOSS_MODES

from .common import PLAIN, device_inputs, forward_backward, relative_error


# Tolerances against the CPU float64 core on the same inputs. The loss is computed in float32 for
# float32 and bfloat16 inputs; the gradient is returned in the input dtype (bf16: 8 bits).
LOSS_RTOL = 1e-4
GRAD_RTOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2}
MAX_DECISION_MISMATCH = 1e-3  # tokens sitting on a bound may be decided either way


def check_mode(mode, dev, ref, dtype):
    out, grad = forward_backward(mode, dev["inputs"], dev["topk"])
    ref_out, ref_grad = forward_backward(mode, ref["inputs"], ref["topk"])
    mask = ref["inputs"][3]
    mismatch = (out.clipped.cpu() != ref_out.clipped) & mask
    agree = mask & ~mismatch
    n_valid = int(mask.sum())
    row = dict(
        mode=mode,
        dtype=str(dtype).replace("torch.", ""),
        loss=float(out.loss.detach()),
        loss_ref=float(ref_out.loss.detach()),
        loss_rel_err=relative_error(out.loss, ref_out.loss),
        grad_rel_err=relative_error(grad, ref_grad, agree),
        decision_mismatch_frac=int(mismatch.sum()) / max(n_valid, 1),
        clipfrac=float(ref_out.metrics["clipfrac"]),
        finite=bool(torch.isfinite(out.loss).item() and torch.isfinite(grad).all().item()),
    )
    row["ok"] = (
        row["finite"]
        and row["loss_rel_err"] <= LOSS_RTOL
        and row["grad_rel_err"] <= GRAD_RTOL[dtype]
        and row["decision_mismatch_frac"] <= MAX_DECISION_MISMATCH
    )
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
    plain = dict(
        loss_rel_err=relative_error(plain_loss, grpo_out.loss), grad_rel_err=relative_error(plain_grad, grpo_grad)
    )
    plain["ok"] = plain["loss_rel_err"] <= LOSS_RTOL and plain["grad_rel_err"] <= GRAD_RTOL[torch.float32]
    ok = all(r["ok"] for r in rows) and plain["ok"]
    return dict(
        status="pass" if ok else "fail",
        size=list(sizes.correctness),
        modes=rows,
        grpo_vs_plain_ppo=plain,
        tolerances=dict(
            loss_rel=LOSS_RTOL,
            grad_rel={str(k): v for k, v in GRAD_RTOL.items()},
            decision_mismatch=MAX_DECISION_MISMATCH,
        ),
    )
