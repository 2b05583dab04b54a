"""Exact-KL trust-region bounds: the two roots of phi(e^y) = e^y - 1 - y = c, in log space.

EPIC bounds the log geometric prefix ratio z_t by y-(c) / t and y+(c) / t, where y-(c) <= 0 <= y+(c)
solve e^y - 1 - y = c. Closed form: y = -(1 + c) - W_k(-e^{-(1+c)}) (k = -1 for y+, k = 0 for y-),
but that form cancels catastrophically for small c and overflows for large c, so we solve it
piecewise, always in float64, with a fixed amount of work per element (no data-dependent loop,
no host synchronisation):

* small c (c <= 1/16): the inverse series y(s) = sum_k a_k s^k with s = +-sqrt(2c), which converges
  for |s| < sqrt(4 pi) (the branch points of y(s) sit where e^y = 1, y = 2 pi i k). 14 terms at
  |s| <= 0.36 leave a truncation error below 1e-14 relative.
* larger c, upper root: Halley's method on F(y) = y - log c - log1p((1 + y) e^{-log c}) = 0, which is
  e^y = 1 + c + y written so that c never has to be formed (finite for every finite log c).
* larger c, lower root: Halley's method on e^y - 1 - y - c = 0 started from the asymptote
  y- ~ -(1 + c) + e^{-(1 + c)} (c > 1) or from the 4-term series (c <= 1).

Two Halley steps suffice everywhere (checked against mpmath in tests/test_bounds.py). Where the
lower root is not representable (c > ~1.8e308 in float64, ~3.4e38 in float32) it is returned as
the most negative finite number of the output dtype: e^{y-} is 0 there anyway, i.e. "no lower
bound". log c = +inf gives (-inf, +inf); log c = -inf (c = 0) gives (0, 0); NaN propagates.
"""

from __future__ import annotations

import math

import torch

# Coefficients a_1..a_22 (the first 14 are used) of the upper root y+(s) = sum_k a_k s^k, s = sqrt(2c), obtained by
# reverting e^y - 1 - y = s^2 / 2 with exact rational arithmetic (a_1 = 1, a_2 = -1/6, a_3 = 1/36,
# a_4 = -1/270, ...). The lower root is the same series at -s.
_SERIES = (
    1.0,
    -1.0 / 6.0,
    1.0 / 36.0,
    -1.0 / 270.0,
    1.0 / 4320.0,
    1.0 / 17010.0,
    -139.0 / 5443200.0,
    1.0 / 204120.0,
    -571.0 / 2351462400.0,
    -281.0 / 1515591000.0,
    163879.0 / 2172751257600.0,
    -5221.0 / 354648294000.0,
    5246819.0 / 10168475885568000.0,
    5459.0 / 7447614174000.0,
    -534703531.0 / 1830325659402240000.0,
    91207079.0 / 1595278956070800000.0,
    -4483131259.0 / 2987091476144455680000.0,
    -2650986803.0 / 818378104464320400000.0,
    432261921612371.0 / 337123143997663268044800000.0,
    -6171801683.0 / 24551343133929612000000.0,
    6232523202521089.0 / 1189370452023756009662054400000.0,
    4283933145517.0 / 279517041579788632620000000.0,
)

_SERIES_TERMS = 14
_SERIES_MAX_C = 0.0625  # series region: c <= 1/16, i.e. |s| <= 0.354
_LOG_SERIES_MAX_C = math.log(_SERIES_MAX_C)
_LOWER_ASYMPTOTE_MIN_C = 1.0  # lower-root start: asymptote above, cubic series below
_HALLEY_STEPS = 2
_LOWER_CLOSED_FORM_MIN_C = 1e30  # above this y- = -(1 + c) exactly in float64
_CHUNK = 1 << 18  # elements per chunk: bounds the float64 temporaries (2 MiB each)


def kl_phi(ratio: torch.Tensor) -> torch.Tensor:
    """phi(r) = r - 1 - log r, the per-sample KL integrand: E_mu[phi(pi/mu)] = KL(mu || pi)."""
    return ratio - 1.0 - torch.log(ratio)


def _series(s: torch.Tensor, terms: int = _SERIES_TERMS) -> torch.Tensor:
    """sum_{k <= terms} a_k s^k by Horner's rule, in place on a fresh tensor."""
    acc = torch.full_like(s, _SERIES[terms - 1])
    for coef in reversed(_SERIES[:terms - 1]):
        acc.mul_(s).add_(coef)
    return acc.mul_(s)


def _halley(y: torch.Tensor, f, steps: int) -> torch.Tensor:
    """Halley's iteration y <- y - 2 F F' / (2 F'^2 - F F'') with f(y) -> (F, F', F'')."""
    for _ in range(steps):
        value, d1, d2 = f(y)
        y = y - 2.0 * value * d1 / (2.0 * d1 * d1 - value * d2)
    return y


def _upper_root(log_c: torch.Tensor) -> torch.Tensor:
    c = torch.exp(log_c)
    s = torch.sqrt(2.0 * torch.clamp(c, max=_SERIES_MAX_C))
    from_series = _series(s)

    # Large c: e^y = 1 + c + y  <=>  F(y) = y - x - log1p((1 + y) e^{-x}) = 0, x = log c.
    # Only evaluated on c > 1/2 (x is clamped below so that e^{-x} stays small and finite).
    x = torch.clamp(log_c, min=_LOG_SERIES_MAX_C)
    inv_c = torch.exp(-x)

    def f(y):
        u = (1.0 + y) * inv_c
        d1 = 1.0 - inv_c / (1.0 + u)
        d2 = inv_c * inv_c / torch.square(1.0 + u)
        return y - x - torch.log1p(u), d1, d2

    # Start from the larger of the 4-term series (good up to c ~ 1.5) and one fixed-point step of
    # y = log(1 + c + y) from y = log1p(c) (good for large c); both lie below the root.
    short_series = _series(torch.sqrt(2.0 * torch.exp(torch.clamp(x, max=math.log(1.5)))), 4)
    fixed_point = x + torch.log1p((1.0 + torch.log1p(torch.exp(torch.clamp(x, max=700.0)))) * inv_c)
    from_halley = _halley(torch.maximum(short_series, fixed_point), f, _HALLEY_STEPS)

    return torch.where(log_c <= _LOG_SERIES_MAX_C, from_series, from_halley)


def _lower_root(log_c: torch.Tensor) -> torch.Tensor:
    c = torch.exp(log_c)
    s = torch.sqrt(2.0 * torch.clamp(c, max=_SERIES_MAX_C))
    from_series = _series(-s)

    # Large c: g(y) = expm1(y) - y - c, on 1/2 < c <= 1e30 (clamped so unused lanes stay finite).
    # Beyond 1e30, y- = -(1 + c) to the last bit (e^{y-} = 0), so the excess is added back below.
    c_big = torch.clamp(c, min=_SERIES_MAX_C, max=_LOWER_CLOSED_FORM_MIN_C)

    def f(y):
        em1 = torch.expm1(y)
        return em1 - y - c_big, em1, em1 + 1.0

    asymptote = -(1.0 + c_big) + torch.exp(-(1.0 + c_big))
    short_series = _series(-torch.sqrt(2.0 * torch.clamp(c_big, max=_LOWER_ASYMPTOTE_MIN_C)), 4)
    start = torch.where(c_big > _LOWER_ASYMPTOTE_MIN_C, asymptote, short_series)
    from_halley = _halley(start, f, _HALLEY_STEPS) - (c - torch.clamp(c, max=_LOWER_CLOSED_FORM_MIN_C))

    return torch.where(log_c <= _LOG_SERIES_MAX_C, from_series, from_halley)


def _check_log_c(log_c) -> None:
    if not torch.is_tensor(log_c) or not log_c.is_floating_point():
        raise TypeError(f"log_c must be a floating-point tensor, got {type(log_c).__name__} "
                        f"{getattr(log_c, 'dtype', '')}")


def _chunked(root_fn, log_c: torch.Tensor, *, clamp_to_finite: bool) -> torch.Tensor:
    """Apply a float64 root function chunk by chunk; result in log_c's dtype and shape."""
    _check_log_c(log_c)
    out_dtype = log_c.dtype
    flat = log_c.detach().reshape(-1)
    out = torch.empty(flat.shape, dtype=out_dtype, device=flat.device)
    most_negative = -torch.finfo(out_dtype).max
    with torch.no_grad():
        for start in range(0, flat.numel(), _CHUNK):
            piece = flat[start:start + _CHUNK].to(torch.float64)
            root = root_fn(piece)
            # c = +inf: no bound on that side (+-inf). The lower root -(1 + c) overflows long
            # before log c does: it is clamped to the most negative finite number of the output
            # dtype (still "no lower bound": its exp is 0).
            is_pos_inf = piece == math.inf
            if clamp_to_finite:
                root = torch.where(is_pos_inf, -math.inf, root.clamp(min=most_negative))
            else:
                root = torch.where(is_pos_inf, math.inf, root)
            out[start:start + _CHUNK] = root
    return out.reshape(log_c.shape)


def exact_kl_lower_root(log_c: torch.Tensor) -> torch.Tensor:
    """The root y- <= 0 of e^y - 1 - y = c, given log c (see `exact_kl_log_bounds`)."""
    return _chunked(_lower_root, log_c, clamp_to_finite=True)


def exact_kl_upper_root(log_c: torch.Tensor) -> torch.Tensor:
    """The root y+ >= 0 of e^y - 1 - y = c, given log c (see `exact_kl_log_bounds`)."""
    return _chunked(_upper_root, log_c, clamp_to_finite=False)


def exact_kl_log_bounds(log_c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Roots y- <= 0 <= y+ of e^y - 1 - y = c, given log c (any shape, any float dtype).

    Returns ``(lower, upper)`` in ``log_c``'s dtype and device. Computed in float64 in chunks, so
    float32 / bfloat16 callers get correctly rounded results and bounded temporary memory.
    Relative error <= 1e-12 (float64) against mpmath for c in [1e-12, 1e30]; see the module
    docstring for the special values. Vectorised, no host synchronisation.
    """
    return exact_kl_lower_root(log_c), exact_kl_upper_root(log_c)
