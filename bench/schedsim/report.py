"""Tables: the schedule table with its bound, the per-response-length-decile counts, the frontier."""

from __future__ import annotations

from .bound import bound_for
from .presets import Preset


def length_deciles(groups: list[dict], n: int = 10) -> list[dict]:
    """Per response-length decile (``epic_slime.length_deciles``, the function the driver logs with) of
    the groups counted: trained after the warm-up (``over_k`` when the true lag exceeds K), requeued
    (one record per regeneration) or dropped; lags are the true ones (first token's version)."""
    from epic_slime.length_deciles import length_deciles as deciles

    records = []
    for g in groups:
        if g["steady"] and g["true_lag"] is not None:
            records.append((g["length"], int(g["true_lag"]), "over_k" if g["over_k"] else "trained"))
        records += [(g["length"], 0, "requeued")] * int(g["requeued"])
        if g["dropped"]:
            records.append((g["length"], 0, "dropped"))
    out = []
    for row in deciles(records, n):
        lag = row.mean_staleness
        out.append(
            dict(
                decile=row.decile + 1,
                groups=row.groups,
                max_length=row.max_length or 0.0,
                dropped=row.counts["dropped"],
                requeued=row.counts["requeued"],
                over_k=row.counts["over_k"],
                mean_lag=float("nan") if lag is None else lag,
            )
        )
    return out


def format_deciles(rows: list[dict]) -> str:
    out = [
        f"{'decile':>6s} {'<= len':>7s} {'groups':>6s} {'dropped':>7s} {'requeued':>8s} {'over K':>6s} {'mean lag':>8s}"
    ]
    for r in rows:
        out.append(
            f"{r['decile']:6d} {r['max_length']:7.0f} {r['groups']:6d} {r['dropped']:7d} {r['requeued']:8d} "
            f"{r['over_k']:6d} {r['mean_lag']:8.2f}"
        )
    return "\n".join(out)


def summary(p: Preset, row: dict, sync_s: float, warmup: int = 2) -> dict:
    """A row's numbers for the frontier: speed, share of its bound, counts, lag spread over deciles."""
    b = bound_for(p, row, warmup)
    dec = length_deciles(row["groups"])
    trained = sum(g["steady"] for g in row["groups"])
    lags = [d["mean_lag"] for d in dec if d["mean_lag"] == d["mean_lag"]]
    return dict(
        schedule=row["schedule"],
        push=row["push_mode"],
        split=row["split"],
        gpe=row["gpus_per_engine"],
        s=row["s_per_rollout"],
        ratio=sync_s / row["s_per_rollout"],
        bound_s=b["bound_s"],
        share=b["bound_s"] / row["s_per_rollout"],
        hist=row["staleness_hist"],
        dropped=row["dropped_groups"],
        requeued=row["requeued_groups"],
        requeued_share=row["requeued_groups"] / max(1, trained),
        over_k=sum(g["over_k"] for g in row["groups"] if g["steady"]),
        lag_spread=(lags[-1] - lags[0]) if len(lags) >= 2 else 0.0,
        retractions=row["retractions"],
        deciles=dec,
    )


def format_table(p: Preset, rows: list[dict]) -> str:
    by = {r["schedule"]: r for r in rows}
    sync_s = by["sync colocated"]["s_per_rollout"] if "sync colocated" in by else rows[0]["s_per_rollout"]
    out = [
        f"{'schedule':16s} {'s/rollout':>9s} {'bound':>6s} {'of bnd':>6s} {'GPU util':28s} {'staleness hist (steady)':24s} "
        f"{'drop':>4s} {'requeue':>7s} {'aborts':>6s} {'retract':>7s} {'GPU-h (300)':>11s}"
    ]
    for r in rows:
        b = bound_for(p, r)["bound_s"]
        util = ", ".join(f"{k.split()[0]} {v:.0%}" for k, v in r["utilisation"].items())
        hist = " ".join(f"{k}:{v}" for k, v in r["staleness_hist"].items())
        out.append(
            f"{r['schedule']:16s} {r['s_per_rollout']:9.1f} {b:6.1f} {b / r['s_per_rollout']:6.0%} {util:28s} "
            f"{hist:24s} {r['dropped_groups']:4d} {r['requeued_groups']:7d} {r['abort_resubmits']:6d} "
            f"{r['retractions']:7d} {r['gpu_hours_paper_run']:11.1f}"
        )
    if "async K=2" in by and "sync colocated" in by and "sync split" in by:
        out.append(
            f"async K=2 / sync split: {by['sync split']['s_per_rollout'] / by['async K=2']['s_per_rollout']:.2f}x"
        )
        out.append(
            f"async K=2 / sync colocated on this table's {p.gpus_per_engine}-GPU engines: "
            f"{sync_s / by['async K=2']['s_per_rollout']:.2f}x (the paper's and verl's protocol; the headline "
            "divides by its best engine size)"
        )
    return "\n".join(out)


def format_frontier(rows: list[dict]) -> str:
    out = [
        f"{'K':>2s} {'push':8s} {'split':6s} {'GPU/eng':>7s} {'s/rollout':>9s} {'x sync':>6s} {'bound':>6s} "
        f"{'of bnd':>6s} {'staleness hist':22s} {'drop':>4s} {'requeue':>7s} {'over K':>6s} {'lag spread':>10s}"
    ]
    for r in rows:
        k = r["schedule"].split("=")[-1] if "=" in r["schedule"] else "0"
        hist = " ".join(f"{a}:{b}" for a, b in r["hist"].items())
        out.append(
            f"{k:>2s} {r['push']:8s} {r['split']:6s} {r['gpe']:7d} {r['s']:9.1f} {r['ratio']:6.2f} "
            f"{r['bound_s']:6.1f} {r['share']:6.0%} {hist:22s} {r['dropped']:4d} {r['requeued']:7d} "
            f"{r['over_k']:6d} {r['lag_spread']:10.2f}"
        )
    return "\n".join(out)


# A row measured past its throughput bound is not in steady state (its window's batches took the short
# responses while the long ones waited in flight: seen at K = 8 with a K + 2 warm-up); no schedule beats
# the bound, so such a row is no candidate for "best". 2% of slack for the window's token count.
STEADY_SHARE_MAX = 1.02


def best_row(rows: list[dict]) -> dict:
    """The fastest steady row with 0 dropped, <= 1% requeued and none over K (falling back to any row
    meeting those, then to any row, so that a table always names one)."""
    ok = [r for r in rows if r["dropped"] == 0 and r["requeued_share"] <= 0.01 and r["over_k"] == 0]
    steady = [r for r in ok if r["share"] <= STEADY_SHARE_MAX]
    return max(steady or ok or rows, key=lambda r: r["ratio"])


def best_line(rows: list[dict]) -> str:
    """The fastest steady row meeting 0 dropped, <= 1% requeued, none over K:
    ``best: K=.. push=.. split=..: X.XXx (Y% of bound)``, noting the rows left out as past their bound."""
    ok = [r for r in rows if r["dropped"] == 0 and r["requeued_share"] <= 0.01 and r["over_k"] == 0]
    steady = [r for r in ok if r["share"] <= STEADY_SHARE_MAX]
    b = best_row(rows)
    k = b["schedule"].split("=")[-1]
    line = f"best: K={k} push={b['push']} split={b['split']}x{b['gpe']}: {b['ratio']:.2f}x ({b['share']:.0%} of bound)"
    past = len(ok) - len(steady)
    if steady and past:
        line += f" [{past} row(s) past {STEADY_SHARE_MAX:.0%} of their bound left out: window too short]"
    return line
