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


def token_terms(mode: str, lp, blp, adv, mask, params: dict):
    """Per-row lists of (S_t, coef_t) on valid tokens, for one batch given as nested lists."""
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
                out.append(_clip_rule(prefix_lam, a, -params["clip_low"] * scale, params["clip_high"] * scale,
                                      params["clip_cap"] * scale))
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


def loss_and_grad(mode: str, lp, blp, adv, mask, params: dict, aggregation: str):
    """(loss, d loss / d log_probs as nested lists) in float64."""
    rows = token_terms(mode, lp, blp, adv, mask, params)
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
