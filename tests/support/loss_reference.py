"""An independent float64 / mpmath reference for every loss mode, written from docs/losses.md.

Token by token in plain Python (no tensors, no shared code with epic_slime.losses): for each valid
token it returns the objective S_t and dS_t / dlog pi_t, then aggregates. Slow on purpose: small
batches only.
"""

from __future__ import annotations

import math

import mpmath as mp

mp.mp.dps = 40


def roots(c: float) -> tuple[float, float]:
    """(y-, y+) of e^y - 1 - y = c via the Lambert W closed form, in 40-digit arithmetic."""
    c = mp.mpf(c)
    arg = -mp.exp(-(1 + c))
    lower = -(1 + c) - mp.lambertw(arg, 0)
    upper = -(1 + c) - mp.lambertw(arg, -1)
    return float(mp.re(lower)), float(mp.re(upper))


def _clip_rule(x: float, a: float, lo: float, hi_pos: float, hi_neg: float) -> tuple[float, float]:
    """Sign-aware rule on X (log space): A >= 0 keeps the gradient iff X < hi_pos (value capped at
    e^hi_pos); A < 0 keeps it iff lo < X < hi_neg (value clipped into [e^lo, e^hi_neg])."""
    if a >= 0:
        if x < hi_pos:
            return a * math.exp(x), a * math.exp(x)
        return a * math.exp(hi_pos), 0.0
    if x <= lo:
        return a * math.exp(lo), 0.0
    if x >= hi_neg:
        return a * math.exp(hi_neg), 0.0
    return a * math.exp(x), a * math.exp(x)


def _ppo_rule(r: float, a: float, low: float, high: float, dual_clip=None) -> tuple[float, float]:
    """min(r A, clip(r, low, high) A) [then max(., c A) for A < 0]; ties count as unclipped."""
    unclipped = r * a
    clipped = min(max(r, low), high) * a
    if unclipped <= clipped or low < r < high:
        value, coef = unclipped, r * a
    else:
        value, coef = clipped, 0.0
    if dual_clip is not None and a < 0 and dual_clip * a > value:
        value, coef = dual_clip * a, 0.0
    return value, coef


def token_terms(mode: str, lp, blp, adv, mask, params: dict, extras: dict | None = None):
    """Per-row lists of (S_t, coef_t) on valid tokens, for one batch given as nested lists.

    ``extras``: the Top-K inputs of the dppo_topk_* modes as nested lists (see trust_region_token_terms)."""
    if mode in TRUST_REGION_MODES:
        return trust_region_token_terms(mode, lp, blp, adv, mask, params, extras)
    rows = []
    for b in range(len(lp)):
        valid = [t for t in range(len(lp[b])) if mask[b][t]]
        lam = {t: lp[b][t] - blp[b][t] for t in valid}
        n_row = len(valid)
        mean_lam = sum(lam.values()) / n_row if n_row else 0.0
        out = []
        count = 0
        prefix_lam = 0.0
        prefix_mu = 0.0
        for t in valid:
            count += 1
            prefix_lam += lam[t]
            prefix_mu += blp[b][t]
            a = adv[b][t]
            r = math.exp(lam[t])
            if mode in ("epic", "epic_raw_prob", "epic_cumulative"):
                mean_log_mu = prefix_mu / count if mode != "epic_raw_prob" else prefix_mu
                c_lo = count * params["delta_low"] / mp.exp(mean_log_mu)
                c_hi = count * params["delta_high"] / mp.exp(mean_log_mu)
                y_lo, _ = roots(c_lo)
                _, y_hi = roots(c_hi)
                if mode == "epic_cumulative":
                    x, lo, hi = prefix_lam, y_lo, y_hi
                else:
                    x, lo, hi = prefix_lam / count, y_lo / count, y_hi / count
                out.append(_clip_rule(x, a, lo, hi, hi))
            elif mode in ("grpo", "dapo"):
                out.append(_ppo_rule(r, a, 1 - params["clip_low"], 1 + params["clip_high"], params["dual_clip"]))
            elif mode == "gspo":
                s = math.exp(mean_lam)
                out.append(_ppo_rule(s, a, 1 - params["clip_low"], 1 + params["clip_high"]))
            elif mode == "ctpo":
                scale = count ** params["power"]
                out.append(
                    _clip_rule(
                        prefix_lam,
                        a,
                        -params["clip_low"] * scale,
                        params["clip_high"] * scale,
                        params["clip_cap"] * scale,
                    )
                )
            elif mode == "ripo":
                mu = math.exp(blp[b][t])
                low = max(1 - math.sqrt(params["delta_low"] / mu), params["ratio_floor"])
                high = min(1 + math.sqrt(params["delta_high"] / mu), params["ratio_cap"])
                out.append(_ppo_rule(r, a, low, high, params["dual_clip"]))
            elif mode in ("dppo_tv", "dppo_kl"):
                p, q = math.exp(lp[b][t]), math.exp(blp[b][t])
                if mode == "dppo_tv":
                    too_far_up, too_far_down = p - q > params["clip_high"], p - q < -params["clip_low"]
                else:
                    pm, qm = mp.mpf(p), mp.mpf(q)
                    kl = qm * mp.log(qm / pm) + ((1 - qm) * mp.log((1 - qm) / (1 - pm)) if qm < 1 else 0)
                    too_far_up = kl > params["clip_high"] and p > q
                    too_far_down = kl > params["clip_low"] and p < q
                masked = too_far_up if a > 0 else too_far_down
                weight = 0.0 if masked else a * min(r, params["ratio_cap"])
                out.append((weight * lp[b][t], weight))
            elif mode == "cispo":
                low = 0.0 if params["clip_low"] is None else 1 - params["clip_low"]
                weight = a * min(max(r, low), 1 + params["clip_high"])
                out.append((weight * lp[b][t], weight))
            else:
                raise KeyError(mode)
        rows.append((valid, out))
    return rows


def loss_and_grad(mode: str, lp, blp, adv, mask, params: dict, aggregation: str, extras: dict | None = None):
    """(loss, d loss / d log_probs as nested lists) in float64."""
    rows = token_terms(mode, lp, blp, adv, mask, params, extras)
    grad = [[0.0] * len(lp[b]) for b in range(len(lp))]
    non_empty = [i for i, (valid, _) in enumerate(rows) if valid]
    total_tokens = sum(len(valid) for valid, _ in rows)
    loss = 0.0
    for b, (valid, terms) in enumerate(rows):
        if not valid:
            continue
        if aggregation == "token-mean":
            weight = 1.0 / total_tokens
        elif aggregation == "seq-mean-token-mean":
            weight = 1.0 / (len(non_empty) * len(valid))
        else:  # seq-mean-token-sum
            weight = 1.0 / len(non_empty)
        for t, (value, coef) in zip(valid, terms):
            loss -= weight * value
            grad[b][t] = -weight * coef
    return loss, grad


# ------------------------------------------------------------------------------------------------
# The seeds' other trust-region methods (docs/losses.md, second registry wave)
# ------------------------------------------------------------------------------------------------

TRUST_REGION_MODES = ("cppo", "bandpo", "acpo", "dppo_topk_tv", "dppo_topk_kl")


def percentile_linear(values, fraction: float) -> float:
    """Quantile by linear interpolation between order statistics (numpy's default method)."""
    ordered = sorted(values)
    h = fraction * (len(ordered) - 1)
    below = math.floor(h)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (h - below) * (ordered[above] - ordered[below])


def _cppo_row(lp_row, blp_row, adv_row, valid, params):
    n = len(valid)
    w_min, delta, budget_delta = params["weight_min"], params["delta"], params["budget_delta"]
    divergence = [abs(math.exp(lp_row[t]) - math.exp(blp_row[t])) for t in valid]
    weights = [1.0 if n == 1 else w_min + (1 - w_min) * (n - j) / (n - 1) for j in range(1, n + 1)]
    budget = min(max(percentile_linear(divergence, 0.9), budget_delta), 2 * budget_delta)
    spent = weight_sum = 0.0
    out = []
    for j, t in enumerate(valid):
        lam = lp_row[t] - blp_row[t]
        a, r = adv_row[t], math.exp(lam)
        threshold = min(delta, delta + budget * weight_sum - spent)
        z = weights[j] * divergence[j]
        keep = a * math.expm1(lam) <= 0 or z <= threshold
        out.append((a * r, a * r) if keep else (0.0, 0.0))
        spent += z
        weight_sum += weights[j]
    return out


def _f_generator(name: str):
    if name == "kl":
        return lambda u: u - 1 - mp.log(u) if u > 0 else mp.inf
    if name == "tv":
        return lambda u: abs(u - 1) / 2
    return lambda u: (u - 1) ** 2


def _bracketed_root(fn, inside, outside):
    """Root of fn (fn(inside) < 0 < fn(outside)), after widening ``outside`` away from ``inside``."""
    while fn(outside) <= 0:
        outside = inside + 2 * (outside - inside)
    for _ in range(130):  # bisection: slow, but nothing to go wrong (2^-130 of the bracket)
        middle = (inside + outside) / 2
        inside, outside = (middle, outside) if fn(middle) <= 0 else (inside, middle)
    return (inside + outside) / 2


def band_bounds(q: float, delta: float, generator: str, ratio_cap: float) -> tuple[float, float]:
    """BandPO's [lo, hi] from the definition: the r in [0, 1/q] whose two-point distribution
    {token: r q, rest: 1 - r q} has D_f(. || mu) = q f(r) + (1 - q) f((1 - r q) / (1 - q)) <= delta.
    Found by bracketed root finding in 40 digits: the lower side in y = log r, the upper side in
    v = log of the rest bucket's ratio (so that hi -> 1/q resolves), no closed form used."""
    q, delta = mp.mpf(q), mp.mpf(delta)
    f = _f_generator(generator)
    divergence = lambda r, u: q * f(r) + (1 - q) * f(u)  # noqa: E731
    from_y = lambda y: divergence(mp.exp(y), (1 - mp.exp(y) * q) / (1 - q)) - delta  # noqa: E731
    from_v = lambda v: divergence((1 - (1 - q) * mp.exp(v)) / q, mp.exp(v)) - delta  # noqa: E731
    if divergence(mp.mpf(0), 1 / (1 - q)) <= delta:
        lo = mp.mpf(0)
    else:
        lo = mp.exp(_bracketed_root(from_y, mp.mpf(0), mp.mpf(-1)))
    if divergence(1 / q, mp.mpf(0)) <= delta:
        hi = 1 / q
    else:
        hi = (1 - (1 - q) * mp.exp(_bracketed_root(from_v, mp.mpf(0), mp.mpf(-1)))) / q
    return float(lo), float(min(hi, mp.mpf(ratio_cap)))


def acpo_bin_epsilons(blp, lam_by_token, mask, params) -> list[float]:
    """eps per bin of q_t (5 equal-width bins on [0, 1]) from the population std of r_t in the bin."""
    ratios = [[] for _ in range(5)]
    for b in range(len(blp)):
        for t in range(len(blp[b])):
            if mask[b][t]:
                ratios[min(int(math.exp(blp[b][t]) * 5), 4)].append(math.exp(lam_by_token[b][t]))
    eps = []
    for values in ratios:
        std = 0.0
        if values:
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        eps.append(min(max(params["eps_base"] + params["alpha"] * std, params["eps_min"]), params["eps_max"]))
    return eps


def topk_divergence(kind: str, behavior_set, current_set) -> float:
    """TV or KL(mu || pi) over a token set (lists of log-probs) plus the rest bucket (floored at 1e-12)."""
    mu = [mp.exp(mp.mpf(x)) for x in behavior_set]
    pi = [mp.exp(mp.mpf(x)) for x in current_set]
    mu_rest = max(1 - sum(mu), mp.mpf(1e-12))
    pi_rest = max(1 - sum(pi), mp.mpf(1e-12))
    if kind == "tv":
        return float((sum(abs(a - b) for a, b in zip(mu, pi)) + abs(mu_rest - pi_rest)) / 2)
    return float(sum(a * mp.log(a / b) for a, b in zip(mu, pi)) + mu_rest * mp.log(mu_rest / pi_rest))


def trust_region_token_terms(mode: str, lp, blp, adv, mask, params: dict, extras: dict | None):
    """cppo / bandpo / acpo / dppo_topk_*: per-row lists of (S_t, coef_t) on valid tokens.

    extras (Top-K modes): {"behavior_topk": [B][T][K], "current_topk": [B][T][K], "topk_mask": [B][T][K]}."""
    lam = [[lp[b][t] - blp[b][t] for t in range(len(lp[b]))] for b in range(len(lp))]
    eps = acpo_bin_epsilons(blp, lam, mask, params) if mode == "acpo" else None
    rows = []
    for b in range(len(lp)):
        valid = [t for t in range(len(lp[b])) if mask[b][t]]
        if mode == "cppo":
            rows.append((valid, _cppo_row(lp[b], blp[b], adv[b], valid, params) if valid else []))
            continue
        out = []
        for t in valid:
            a, r, q = adv[b][t], math.exp(lam[b][t]), math.exp(blp[b][t])
            if mode == "bandpo":
                lo, hi = band_bounds(q, params["delta"], params["generator"], params["ratio_cap"])
                out.append(_ppo_rule(r, a, lo, hi))
            elif mode == "acpo":
                e = eps[min(int(q * 5), 4)]
                out.append(_ppo_rule(r, a, 1 - e, 1 + e))
            else:
                used = [k for k, keep in enumerate(extras["topk_mask"][b][t]) if keep]
                divergence = topk_divergence(
                    mode[-2:],
                    [extras["behavior_topk"][b][t][k] for k in used],
                    [extras["current_topk"][b][t][k] for k in used],
                )
                p = math.exp(lp[b][t])
                if a > 0:
                    masked = divergence > params["clip_high"] and p > q
                else:
                    masked = divergence > params["clip_low"] and p < q
                weight = 0.0 if masked else a * min(r, params["ratio_cap"])
                out.append((weight * lp[b][t], weight))
        rows.append((valid, out))
    return rows
