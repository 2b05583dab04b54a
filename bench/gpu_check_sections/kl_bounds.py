"""gpu_check section "bounds": exact_kl_log_bounds on the device against the CPU float64 solver."""

from __future__ import annotations

import math

import torch

from epic_slime.losses import bounds as loss_bounds
from epic_slime.losses import exact_kl_log_bounds

BOUNDS_RTOL = {torch.float64: 1e-12, torch.float32: 2.4e-7}


def solver_roots(log_c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 solver the core builds its tables from, on the CPU (the reference)."""
    x = log_c.double().cpu().contiguous()
    return (
        loss_bounds._solve_exact(x, loss_bounds._exact_lower_into),
        loss_bounds._solve_exact(x, loss_bounds._exact_upper_into),
    )


def section_bounds(device, sizes):
    # c in [1e-12, 1e30], the documented accuracy range, plus exact grid nodes' neighbours.
    log_c = torch.linspace(math.log(1e-12), math.log(1e30), sizes.bounds_points, dtype=torch.float64)
    rows = []
    for dtype in (torch.float64, torch.float32):
        x = log_c.to(dtype)
        lower, upper = exact_kl_log_bounds(x.to(device))
        ref_lower, ref_upper = solver_roots(x)
        rel = lambda a, b: float(((a.double().cpu() - b) / b.abs().clamp(min=1e-300)).abs().max())  # noqa: E731
        row = dict(
            dtype=str(dtype).replace("torch.", ""),
            lower_rel_err=rel(lower, ref_lower),
            upper_rel_err=rel(upper, ref_upper),
            points=int(x.numel()),
        )
        special = torch.tensor([-math.inf, -1e4, 80.0, 700.0, 1e4, math.inf], dtype=dtype)
        s_lower, s_upper = exact_kl_log_bounds(special.to(device))
        s_lower, s_upper = s_lower.cpu(), s_upper.cpu()
        # finite for finite log c; +inf gives (-inf, +inf); -inf (c = 0) gives (0, 0)
        row["special_ok"] = bool(
            torch.isfinite(s_lower[1:-1]).all()
            and torch.isfinite(s_upper[1:-1]).all()
            and s_lower[-1] == -math.inf
            and s_upper[-1] == math.inf
            and s_lower[0] == 0
            and s_upper[0] == 0
        )
        row["ok"] = (
            row["special_ok"]
            and row["lower_rel_err"] <= BOUNDS_RTOL[dtype]
            and row["upper_rel_err"] <= BOUNDS_RTOL[dtype]
        )
        rows.append(row)
    return dict(
        status="pass" if all(r["ok"] for r in rows) else "fail",
        rows=rows,
        tolerances={str(k): v for k, v in BOUNDS_RTOL.items()},
    )
