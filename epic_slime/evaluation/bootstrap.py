"""Bootstrap 95% intervals for Table 1 cells, over prompts and seeds.

A cell (method x benchmark) is the mean over seeds of each seed's mean@k at its selected
checkpoint; mean@k is the mean over prompts of the prompt's fraction correct. One bootstrap
replicate draws the seeds with replacement and, independently, the benchmark's prompts with
replacement (by prompt id, the same draw for every seed: the prompts are the shared population),
and recomputes the cell. The Average cell uses the same seed draw for all benchmarks and a prompt
draw per benchmark. The interval is the 2.5 / 97.5 percentile of the replicates (linear
interpolation). The selected checkpoints are held fixed (selection is not re-run per replicate).

For the mean of P values resampled with replacement the replicate variance is the population
variance over P (divide by P, not P - 1); the tests check that and the additive two-way case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from epic_slime.evaluation.metrics import MethodRow, RunInfo


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


def fraction_matrix(per_seed: Sequence[dict[str, float]]) -> np.ndarray:
    """[S, P] float64 of prompt fractions, prompts ordered by id; NaN where a seed lacks a prompt."""
    ids = sorted({pid for seed in per_seed for pid in seed})
    matrix = np.full((len(per_seed), len(ids)), np.nan)
    for s, seed in enumerate(per_seed):
        for p, pid in enumerate(ids):
            if pid in seed:
                matrix[s, p] = seed[pid]
    return matrix


def replicate_cell(matrix: np.ndarray, seed_draws: np.ndarray, prompt_draws: np.ndarray) -> np.ndarray:
    """[B] replicate values: mean over drawn seeds of the mean over drawn prompts (missing prompts skipped)."""
    values = matrix[seed_draws[:, :, None], prompt_draws[:, None, :]]  # [B, S, P]
    present = ~np.isnan(values)
    per_seed = np.where(present, values, 0.0).sum(-1) / np.maximum(present.sum(-1), 1)
    per_seed = np.where(present.any(-1), per_seed, np.nan)  # a draw with none of a seed's prompts: skip that seed
    counted = ~np.isnan(per_seed)
    # NaN when no drawn seed has a drawn prompt (only with uneven prompt sets); the percentile skips it
    return np.where(counted.any(1), np.where(counted, per_seed, 0.0).sum(1) / np.maximum(counted.sum(1), 1), np.nan)


def bootstrap_replicates(
    per_benchmark: dict[str, list[dict[str, float]]], replicates: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Replicates of every benchmark cell and of their equal-weight average ("average").

    ``per_benchmark[b][s]`` maps prompt id -> fraction correct of seed s (same seed order for all b).
    """
    num_seeds = {len(v) for v in per_benchmark.values()}
    if len(num_seeds) != 1:
        raise ValueError(f"bootstrap: benchmarks have different numbers of seeds: {sorted(num_seeds)}")
    (S,) = num_seeds
    seed_draws = rng.integers(0, S, size=(replicates, S))
    out = {}
    for benchmark, per_seed in per_benchmark.items():
        matrix = fraction_matrix(per_seed)
        prompt_draws = rng.integers(0, matrix.shape[1], size=(replicates, matrix.shape[1]))
        out[benchmark] = replicate_cell(matrix, seed_draws, prompt_draws)
    out["average"] = np.mean(np.stack([out[b] for b in per_benchmark]), axis=0)
    return out


def percentile_interval(values: np.ndarray, level: float = 0.95) -> Interval:
    tail = 100 * (1 - level) / 2
    low, high = np.nanpercentile(values, [tail, 100 - tail])
    return Interval(float(low), float(high))


def method_intervals(
    row: MethodRow,
    runs: dict[str, RunInfo],
    benchmarks: Sequence[str],
    replicates: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, Interval]:
    """Intervals of one Table 1 row (benchmark columns and "average"); empty when no run was selected."""
    if not row.runs or replicates <= 0:
        return {}
    per_benchmark = {}
    for benchmark in benchmarks:
        per_seed = []
        for run in row.runs:
            score = runs[run].scores[row.selected_steps[run]][benchmark]
            per_seed.append({pid: c / n for pid, (n, c) in zip(score.prompt_ids, score.prompt_counts)})
        per_benchmark[benchmark] = per_seed
    rng = np.random.default_rng([seed, *row.method.encode()])  # each row its own stream, reproducible
    draws = bootstrap_replicates(per_benchmark, replicates, rng)
    return {column: percentile_interval(values, level) for column, values in draws.items()}
