"""PNG plots of a run directory (reward, eval, clip fraction, staleness histogram)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from epic_slime import metric_names as names


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _series(rows: list[dict], key: str) -> tuple[list, list]:
    pts = [(r["step"], r[key]) for r in rows if key in r and r[key] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def write_plots(run_dir: str | Path, lag_hist: Counter | dict | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    written = []

    def save(fig, name):
        p = run_dir / name
        fig.tight_layout()
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(*_series(rows, names.REWARD_MEAN), label="train reward")
    ax.set_xlabel("step"); ax.set_ylabel("reward"); ax.set_title(names.REWARD_MEAN); ax.grid(alpha=0.3)
    save(fig, "reward.png")

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for key in sorted({k for r in rows for k in r if k.startswith("eval/") and "@" in k}):
        # eval results are logged when they arrive; plot them against the version they evaluated
        pts = [(r.get("eval/version", r["step"]), r[key]) for r in rows if key in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key)
    ax.set_xlabel("weight version"); ax.set_ylabel("score"); ax.set_title("held-out eval"); ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save(fig, "eval.png")

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(*_series(rows, names.CLIPFRAC), label="clipfrac")
    ax.set_xlabel("step"); ax.set_ylabel("fraction"); ax.set_title(names.CLIPFRAC); ax.grid(alpha=0.3)
    save(fig, "clipfrac.png")

    hist = Counter({int(k): v for k, v in (lag_hist or {}).items()})
    fig, ax = plt.subplots(figsize=(5, 3.2))
    if hist:
        lags = sorted(hist)
        ax.bar(lags, [hist[k] for k in lags])
    ax.set_xlabel("lag (weight versions)"); ax.set_ylabel("trained samples"); ax.set_title("staleness")
    save(fig, "staleness_hist.png")
    return written
