"""exact_kl_log_bounds against a 40-digit mpmath reference (Lambert W), and its special values."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import torch

from epic_slime.losses import exact_kl_log_bounds, kl_phi

mp.mp.dps = 50


def reference_roots(log_c: float) -> tuple[mp.mpf, mp.mpf]:
    # The W form cancels like the roots themselves: carry ~|log10 c| extra digits for tiny c.
    with mp.workdps(50 + max(0, int(-log_c / 2.3))):
        c = mp.exp(mp.mpf(log_c))
        arg = -mp.exp(-(1 + c))
        return mp.re(-(1 + c) - mp.lambertw(arg, 0)), mp.re(-(1 + c) - mp.lambertw(arg, -1))


def _max_rel_error(log_c: torch.Tensor) -> tuple[float, float]:
    lower, upper = exact_kl_log_bounds(log_c)
    worst_lo = worst_hi = 0.0
    for x, lo, hi in zip(log_c.tolist(), lower.tolist(), upper.tolist()):
        ref_lo, ref_hi = reference_roots(x)
        worst_lo = max(worst_lo, float(abs(mp.mpf(lo) / ref_lo - 1)))
        worst_hi = max(worst_hi, float(abs(mp.mpf(hi) / ref_hi - 1)))
    return worst_lo, worst_hi


# Dense in the default operating range (c ~ 1e-4 .. 10) and across region boundaries.
LOG_C = np.concatenate(
    [
        np.linspace(math.log(1e-12), math.log(1e30), 1500),
        np.linspace(math.log(1e-4), math.log(10.0), 600),
        np.log(np.array([0.0625, 0.0625 * (1 + 1e-9), 1.0, 1.5, 0.5, 3e-4])),
        # Below and above the interpolation grid (x < -28, x > 70), and its edges.
        np.array([-28.0, -28.0 - 1e-9, -28.5, -35.0, -60.0, -230.0, 70.0, 70.0 + 1e-9, 70.5]),
    ]
)


def test_float64_relative_error_below_1e_12():
    lo_err, hi_err = _max_rel_error(torch.tensor(LOG_C, dtype=torch.float64))
    assert lo_err <= 1e-12 and hi_err <= 1e-12, (lo_err, hi_err)


def test_float32_relative_error_below_1e_6():
    # The reference is evaluated at the float32 value of log c, which is the input. Below
    # c ~ 1e-74 the roots (~1e-37) leave float32's normal range, so those points are left out.
    lo_err, hi_err = _max_rel_error(torch.tensor(LOG_C[LOG_C > -170], dtype=torch.float32))
    assert lo_err <= 1e-6 and hi_err <= 1e-6, (lo_err, hi_err)


def test_roots_solve_the_equation():
    log_c = torch.linspace(math.log(1e-6), math.log(1e3), 200, dtype=torch.float64)
    lower, upper = exact_kl_log_bounds(log_c)
    c = torch.exp(log_c)
    assert (lower <= 0).all() and (upper >= 0).all()
    # phi(e^y) = e^y - 1 - y, written with expm1 so that e^{y-} may underflow harmlessly.
    torch.testing.assert_close(torch.expm1(lower) - lower, c, rtol=1e-9, atol=0)
    torch.testing.assert_close(torch.expm1(upper) - upper, c, rtol=1e-9, atol=0)
    small = c < 100
    torch.testing.assert_close(kl_phi(torch.exp(upper[small])), c[small], rtol=1e-9, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_finite_for_every_finite_log_c(dtype):
    log_c = torch.tensor([-1e4, -700.0, -50.0, 0.0, 50.0, 88.0, 89.0, 700.0, 710.0, 1e4, 3e4], dtype=dtype)
    lower, upper = exact_kl_log_bounds(log_c)
    assert lower.dtype == dtype and upper.dtype == dtype
    assert torch.isfinite(lower).all() and torch.isfinite(upper).all()
    # Large c: y+ ~ log c, y- ~ -(1 + c) (clamped to the dtype's most negative number).
    assert float(upper[-1]) == pytest.approx(float(log_c[-1]), rel=1e-2)
    assert float(lower[-1]) == -torch.finfo(dtype).max


def test_special_values():
    log_c = torch.tensor([math.inf, -math.inf, math.nan], dtype=torch.float64)
    lower, upper = exact_kl_log_bounds(log_c)
    assert lower[0] == -math.inf and upper[0] == math.inf
    assert lower[1] == 0 and upper[1] == 0
    assert math.isnan(lower[2]) and math.isnan(upper[2])


def test_shape_and_no_autograd():
    log_c = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    lower, upper = exact_kl_log_bounds(log_c)
    assert lower.shape == (3, 5, 7) and not lower.requires_grad and not upper.requires_grad


def test_large_input_spanning_chunks_matches_elementwise():
    from epic_slime.losses import bounds

    n = bounds._CHUNK * 2 + 17
    log_c = torch.linspace(-20, 60, n, dtype=torch.float64)
    lower, upper = exact_kl_log_bounds(log_c)
    idx = torch.tensor([0, bounds._CHUNK - 1, bounds._CHUNK, n - 1])
    lo_small, hi_small = exact_kl_log_bounds(log_c[idx])
    assert torch.equal(lower[idx], lo_small) and torch.equal(upper[idx], hi_small)


def test_rejects_non_float_input():
    with pytest.raises(TypeError, match="log_c"):
        exact_kl_log_bounds(torch.tensor([1, 2, 3]))


def test_branch_free_path_matches_the_cpu_fast_path(monkeypatch):
    """Accelerators always evaluate every branch (no host sync); the CPU skips unused ones."""
    from epic_slime.losses import bounds

    log_c = torch.tensor(np.concatenate([LOG_C, [math.inf, -math.inf, 800.0]]), dtype=torch.float64)
    fast = exact_kl_log_bounds(log_c)
    monkeypatch.setattr(bounds, "host_checks_are_free", lambda x: False)
    full = exact_kl_log_bounds(log_c)
    for a, b in zip(fast, full):
        assert torch.equal(a, b)
    above_grid = torch.linspace(-10.0, 60.0, 100, dtype=torch.float64)  # no series, no inf
    fast_lo, fast_hi = exact_kl_log_bounds(above_grid)
    monkeypatch.undo()
    lo, hi = exact_kl_log_bounds(above_grid)
    assert torch.equal(lo, fast_lo) and torch.equal(hi, fast_hi)
