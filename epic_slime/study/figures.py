"""The study's PNG figures, one per diagnostic, from the runs' own records (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

from .analysis import POSITION_BINS, mean_curve

# the paper's Fig. 6 / Fig. 7 quantities: file stem -> (metrics.jsonl key, axis label)
CURVES = {
    "fig6_clipfrac": ("train/policy/clipfrac", "clip fraction"),
    "fig6_entropy": ("train/entropy", "policy entropy (nats / token)"),
    "fig6_grad_norm": ("train/grad_norm", "gradient norm (before clipping)"),
    "fig6_logprob_gap": ("train/logprob_abs_diff_step_start", "train-rollout |log pi - log mu| (first minibatch)"),
    "fig7_abs_log_r_pre": ("train/policy/abs_L_mean", "mean |log r_pre| = |L_t| (pre-clip log prefix ratio)"),
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    _plt().close(fig)
    return path


def entropy_profile_figure(profile: dict, path: Path) -> Path:
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    a.bar(range(POSITION_BINS), profile["entropy_by_relative_bin"])
    a.set_xlabel("relative position bin (t - 1) / T")
    a.set_ylabel("entropy (nats)")
    a.set_title(f"warm start: CV across bins {profile['relative_bin_cv']:.2f}", fontsize=9)
    b.plot(profile["entropy_by_position"], lw=1)
    b.set_xlabel("response position t")
    b.set_ylabel("entropy (nats)")
    b.set_title(f"mean length {profile['mean_length']:.1f} tokens", fontsize=9)
    for ax in (a, b):
        ax.grid(alpha=0.3)
    return _save(fig, path)


def table1_figure(rows: list[dict], setting: str, path: Path) -> Path:
    """Selected checkpoint's test mean@k per method: mean over seeds, one dot per seed."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for i, r in enumerate(rows):
        ax.bar(i, r["test_mean"], color="tab:blue" if r["method"] == "epic" else "tab:gray", alpha=0.7)
        ax.scatter([i] * len(r["test_by_seed"]), list(r["test_by_seed"].values()), color="k", s=10, zorder=3)
    ax.set_xticks(range(len(rows)), [r["method"] for r in rows], rotation=30, fontsize=8)
    ax.set_ylabel(f"test mean@{rows[0]['k']} (selected on validation)")
    ax.set_title(f"Table 1 at toy scale, setting {setting} (dots: seeds)", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def position_figure(profiles: dict[str, dict], setting: str, path: Path, title: str) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for method, prof in profiles.items():
        ax.plot(range(POSITION_BINS), prof["bins"], marker="o", ms=3, lw=1.2, label=f"{method} (CV {prof['cv']:.2f})")
    ax.set_xlabel("relative position bin (t - 1) / T")
    ax.set_ylabel("late-stage clip fraction")
    ax.set_title(f"{title}, setting {setting}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def rawprob_figure(profiles: dict[str, dict], setting: str, path: Path) -> Path:
    """Fig. 3c: EPIC vs its raw-probability ablation (and the cumulative one): position profile and
    the share of tokens with a finite lower bound."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    for method, prof in profiles.items():
        a.plot(range(POSITION_BINS), prof["bins"], marker="o", ms=3, lw=1.2, label=f"{method} (CV {prof['cv']:.2f})")
    a.set_xlabel("relative position bin")
    a.set_ylabel("late-stage clip fraction")
    a.legend(fontsize=7)
    names = list(profiles)
    b.bar(range(len(names)), [profiles[m]["finite_lower_frac"] for m in names])
    b.set_xticks(range(len(names)), names, fontsize=8)
    b.set_ylabel("finite lower bound coverage")
    b.set_ylim(0, 1.05)
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.suptitle(f"raw-prob vs EPIC, setting {setting}", fontsize=9)
    return _save(fig, path)


def curve_figure(runs_by_method: dict[str, list[list[dict]]], key: str, label: str, setting: str, path: Path) -> Path:
    """One metric over training, mean over seeds, one line per method."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for method, runs in runs_by_method.items():
        steps, values = mean_curve(runs, key)
        ax.plot(steps, values, lw=1.2, label=method)
    ax.set_xlabel("step")
    ax.set_ylabel(label, fontsize=8)
    ax.set_title(f"{label.split(' (')[0]}, mean over seeds, setting {setting}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def ladder_figure(
    summary: dict, axes: dict[str, list[dict]], methods: list[str], warm_start: float, chance: float, k: int, path: Path
) -> Path:
    """Test mean@k at the last checkpoint against lag (top: D at K = 0, K at D = 8; one line per method,
    95% t intervals over seeds) and the collapse rate (bottom); the warm start and chance as lines."""
    from .analysis import t_quantile_975

    plt = _plt()
    plt.rcParams.update({"font.size": 13})
    fig, grid = plt.subplots(2, 2, figsize=(14, 9), sharey="row", gridspec_kw={"height_ratios": [2, 1]})
    colors = plt.get_cmap("tab10")
    for col, (axis, lags) in enumerate(axes.items()):
        top, bottom = grid[0][col], grid[1][col]
        xs = [lag[axis] for lag in lags]
        for i, m in enumerate(methods):
            pts = [(lag[axis], summary["cells"][lag["setting"]]["methods"].get(m)) for lag in lags]
            pts = [(x, d) for x, d in pts if d is not None]
            if not pts:
                continue
            x = [p[0] for p in pts]
            y = [p[1]["test_last_mean"] for p in pts]
            err = [
                t_quantile_975(p[1]["n_seeds"] - 1) * p[1]["test_last_sd"] / p[1]["n_seeds"] ** 0.5
                if p[1]["test_last_sd"] is not None
                else 0.0
                for p in pts
            ]
            # spread the methods' markers a little so that their intervals do not hide each other
            offset = (i - (len(methods) - 1) / 2) * 0.025
            xt = [v * 2**offset if axis == "D" else v + offset * max(1, max(xs)) for v in x]
            top.errorbar(xt, y, yerr=err, marker="o", ms=6, lw=2, capsize=4, color=colors(i), label=m)
            bottom.plot(xt, [p[1]["collapse_frac"] for p in pts], marker="s", ms=6, lw=2, color=colors(i), label=m)
        top.axhline(warm_start, color="k", ls="--", lw=1.5, label="warm start")
        top.axhline(chance, color="gray", ls=":", lw=1.5, label="chance")
        if axis == "D":
            for ax in (top, bottom):
                ax.set_xscale("log", base=2)
        for ax in (top, bottom):
            ax.set_xticks(xs, [str(v) for v in xs])
            ax.grid(alpha=0.3)
        top.set_title(
            "update depth D (synchronous, K = 0)" if axis == "D" else "staleness bound K (D = 8, asynchronous)"
        )
        bottom.set_xlabel("update depth D" if axis == "D" else "staleness bound K")
        bottom.set_ylim(-0.05, 1.05)
        top.set_ylim(-0.02, 1.02)
    grid[0][0].set_ylabel(f"test mean@{k}, last checkpoint")
    grid[1][0].set_ylabel("collapse rate")
    handles, labels = grid[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(0.83, 0.5), fontsize=13, frameon=False)
    fig.suptitle("Policy-lag ladder at toy scale: mean over seeds, 95% t intervals", fontsize=15)
    fig.tight_layout(rect=(0, 0, 0.82, 0.96))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    plt.rcParams.update({"font.size": plt.rcParamsDefault["font.size"]})
    return path


def stress_heatmap(summary: dict, methods: list[str], warm: float, chance: float, k: int, path: Path) -> Path:
    """Method x stress, one panel per axis (levels mildest first), coloured by the last checkpoint's
    test mean@k; each cell's score written in it, a broken cell hatched, and each method's breaking
    point (the mildest broken level of the axis) boxed in red; a level whose warm start is at chance
    (untestable) labelled so under its name. Empty: not finished."""
    import numpy as np

    plt = _plt()
    axes = summary["axes"]
    widths = [len(v) for v in axes.values()]
    fig, panels = plt.subplots(
        1,
        len(axes),
        figsize=(1.1 * sum(widths) + 2.5, 0.42 * len(methods) + 1.8),
        gridspec_kw={"width_ratios": widths},
        squeeze=False,
    )
    image = None
    at_chance = set(summary["untestable_settings"])
    for ax, (axis, levels) in zip(panels[0], axes.items()):
        grid = np.full((len(methods), len(levels)), np.nan)
        for i, m in enumerate(methods):
            for j, s in enumerate(levels):
                c = summary["cells"].get(s, {}).get(m)
                if c is not None:
                    grid[i, j] = c["test_last_mean"]
                    dark = c["test_last_mean"] < (chance + 1.0) / 2
                    ax.text(
                        j,
                        i,
                        f"{c['test_last_mean']:.2f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="w" if dark else "k",
                        fontweight="bold",
                    )
                    if c["breaks"]:
                        ax.add_patch(
                            plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", lw=0, edgecolor="0.35")
                        )
            point = summary["breaking_points"][m][axis]["index"]
            if point is not None:
                ax.add_patch(plt.Rectangle((point - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", lw=2))
        image = ax.imshow(grid, cmap="viridis", vmin=chance, vmax=1.0, aspect="auto")
        ax.set_xticks(
            range(len(levels)),
            [f"{s}\n(at chance)" if s in at_chance else s for s in levels],
            rotation=35,
            fontsize=7,
            ha="right",
        )
        ax.set_yticks(range(len(methods)), methods if ax is panels[0][0] else [""] * len(methods), fontsize=8)
        ax.set_title(f"{axis} (milder -> harsher)", fontsize=9)
    cbar = fig.colorbar(image, ax=list(panels[0]), fraction=0.025, pad=0.01)
    cbar.set_label(f"test mean@{k}, last checkpoint", fontsize=8)
    cbar.ax.axhline(warm, color="w", lw=1.5)
    fig.suptitle(
        f"stress ladder: hatched = breaks, red box = breaking point; warm start {warm:.2f} (white line), "
        f"chance {chance:.2f}",
        fontsize=9,
    )
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path
