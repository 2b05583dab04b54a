"""Training curves: the four-benchmark average and each benchmark against step, one line per
method (mean over seeds), shaded between the lowest and highest seed."""

from __future__ import annotations

import os
from typing import Sequence

from epic_slime.evaluation.metrics import RunInfo, curves


def plot_curves(runs: dict[str, RunInfo], benchmarks: Sequence[str], titles: dict[str, str], out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    written = []
    for column in ["average", *benchmarks]:
        data = curves(runs, benchmarks, column)
        fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
        for method in sorted(data):
            steps = list(data[method])
            values = [data[method][s] for s in steps]
            mean = [100 * sum(v) / len(v) for v in values]
            low = [100 * min(v) for v in values]
            high = [100 * max(v) for v in values]
            (line,) = ax.plot(steps, mean, marker="o", markersize=3, label=method)
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        name = (
            "Average of " + ", ".join(titles.get(b, b) for b in benchmarks)
            if column == "average"
            else titles.get(column, column)
        )
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel("mean@k (%)")
        ax.grid(alpha=0.3)
        if data:
            ax.legend(fontsize=8)
        path = os.path.join(out_dir, f"{column}.png")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
