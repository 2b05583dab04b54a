"""PNG plots of a run directory (reward, eval, clip fraction, staleness histogram).

Readable at a glance: 1350 x 540 px, a title naming the run, loss mode, update depth D and
staleness bound K, labelled axes with units, raw values faint with an EMA line on top."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from epic_slime import metric_names as names

PLOT_NAMES = ("reward.png", "eval.png", "clipfrac.png", "staleness_hist.png")
FIGSIZE = (13.5, 5.4)  # inches; at DPI: 1350 x 540 px
DPI = 100


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _series(rows: list[dict], key: str) -> tuple[list, list]:
    pts = [(r["step"], r[key]) for r in rows if key in r and r[key] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def ema(values: list[float], span: int) -> list[float]:
    """Exponential moving average with alpha = 2 / (span + 1), started at the first value."""
    alpha = 2.0 / (span + 1)
    out, acc = [], None
    for v in values:
        acc = v if acc is None else alpha * v + (1 - alpha) * acc
        out.append(acc)
    return out


def ema_span(n: int) -> int:
    return max(2, min(25, n // 10))


def run_title(run_dir: Path) -> str:
    """'<run>: <mode>, D=<depth>, K=<staleness> (<policy>), <async|sync>' from config.json."""
    try:
        c = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return run_dir.name
    return (
        f"{run_dir.name}: {c.get('policy_loss')}, D={c.get('update_depth')}, K={c.get('max_staleness')} "
        f"({c.get('stale_policy')}), {c.get('rollout_mode')}, seed {c.get('seed')}"
    )


def _style(ax, title, xlabel, ylabel):
    ax.set_title(title, fontsize=13)
    ax.set_xlabel(xlabel, fontsize=11)
    ax.set_ylabel(ylabel, fontsize=11)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=10)


def _raw_and_ema(ax, xs, ys, label, color):
    if not xs:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", fontsize=12, color="gray")
        return
    ax.plot(xs, ys, color=color, alpha=0.25, lw=1, label=f"{label} (raw)")
    ax.plot(xs, ema(ys, ema_span(len(ys))), color=color, lw=2.2, label=f"{label} (EMA, span {ema_span(len(ys))})")
    ax.legend(fontsize=10, loc="best")


def staleness_axes(ax, hist: Counter, k: int | None, policy: str | None = None) -> None:
    """Integer lag ticks, log count axis, counts on the bars, K marked."""
    lags = sorted(hist)
    hi = max([*lags, k or 0]) if lags else (k or 0)
    bars = ax.bar(lags, [hist[x] for x in lags], color="tab:blue", width=0.6)
    for bar, lag in zip(bars, lags):
        ax.annotate(
            f"{hist[lag]:,}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=11,
            xytext=(0, 3),
            textcoords="offset points",
        )
    if hist:
        ax.set_yscale("log")
        ax.set_ylim(0.5, max(hist.values()) * 4)
    ax.set_xticks(range(0, hi + 2))
    ax.set_xlim(-0.7, hi + 1.5)
    if k is not None:
        ax.axvline(
            k + 0.5,
            color="tab:red",
            ls="--",
            lw=1.5,
            label=f"K = {k}: older samples are " + ("kept and counted" if policy == "keep" else "dropped"),
        )
        ax.legend(fontsize=10, loc="upper left")


def write_plots(run_dir: str | Path, lag_hist: Counter | dict | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    title = run_title(run_dir)
    try:
        config = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    k = config.get("max_staleness")
    written = []

    def save(fig, name):
        p = run_dir / name
        fig.tight_layout()
        fig.savefig(p, dpi=DPI)
        plt.close(fig)
        written.append(p)

    fig, ax = plt.subplots(figsize=FIGSIZE)
    _raw_and_ema(ax, *_series(rows, names.REWARD_MEAN), "training reward", "tab:green")
    _style(
        ax,
        f"Training reward per step\n{title}",
        "rollout step (= trainer weight version)",
        "mean reward of the step's samples (0..1)",
    )
    save(fig, "reward.png")

    fig, ax = plt.subplots(figsize=FIGSIZE)
    keys = sorted({k_ for r in rows for k_ in r if k_.startswith("eval/") and "@" in k_})
    for key, color in zip(keys, ("tab:blue", "tab:orange", "tab:purple", "tab:brown")):
        # eval results are logged when they arrive; plot them against the version they evaluated
        pts = sorted((r.get("eval/version", r["step"]), r[key]) for r in rows if key in r)
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            marker="o",
            lw=2,
            color=color,
            label=key.replace("eval/", "").replace("/", " "),
        )
        if pts:
            best = max(pts, key=lambda p: (p[1], -p[0]))
            ax.annotate(f"best {best[1]:.3f} @ {best[0]}", best, xytext=(6, 6), textcoords="offset points", fontsize=10)
    if keys:
        ax.legend(fontsize=10)
    _style(
        ax,
        f"Held-out evaluation\n{title}",
        "trainer weight version evaluated",
        "share of correct samples (mean@k) / prompts solved (pass@k)",
    )
    save(fig, "eval.png")

    fig, ax = plt.subplots(figsize=FIGSIZE)
    _raw_and_ema(ax, *_series(rows, names.CLIPFRAC), "clip fraction", "tab:red")
    _style(
        ax,
        f"Share of tokens whose gradient the loss removed (clipped)\n{title}",
        "rollout step",
        "fraction of valid tokens (mean over the step's minibatches)",
    )
    save(fig, "clipfrac.png")

    hist = Counter({int(x): v for x, v in (lag_hist or {}).items()})
    fig, ax = plt.subplots(figsize=FIGSIZE)
    staleness_axes(ax, hist, k, config.get("stale_policy"))
    _style(
        ax,
        f"Staleness of trained samples\n{title}",
        "lag (trainer version - generating version)",
        "trained samples (log scale)",
    )
    save(fig, "staleness_hist.png")
    return written
