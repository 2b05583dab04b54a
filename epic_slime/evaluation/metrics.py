"""mean@k, unbiased pass@k, the equal-weight benchmark average, checkpoint selection and
aggregation over seeds. Pure functions over ``EvalRecord`` lists; no I/O.

Definitions
- mean@k of a benchmark at a checkpoint: the mean over prompts of the per-prompt fraction of
  correct samples (k samples per prompt) = average correctness over prompts and samples.
- pass@k (unbiased, Chen et al. 2021): per prompt with n samples of which c are correct,
  1 - C(n-c, k) / C(n, k); averaged over prompts.
- average: the unweighted mean of the benchmarks' mean@k (each benchmark weighs the same,
  whatever its number of prompts); defined only when every benchmark was evaluated.
- best checkpoint of a run: the step with the highest average (ties: the earliest step).
- Table 1 cell: mean and sample standard deviation (ddof=1) over seeds of the selected
  checkpoints' scores.
- mean@k with a given k (``group_records(records, k=...)``): only the first k samples (lowest
  ``sample_idx``) of each prompt count; a prompt with fewer than k samples is an error naming it.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from epic_slime.evaluation.records import EvalRecord, RecordError


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt with ``n`` samples, ``c`` correct."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_at_k(outcomes_by_prompt: dict[str, Sequence[bool]]) -> float:
    """Mean over prompts of the fraction of correct samples."""
    if not outcomes_by_prompt:
        raise ValueError("mean_at_k: no prompts")
    per_prompt = []
    for prompt_id, outcomes in outcomes_by_prompt.items():
        if not outcomes:
            raise ValueError(f"mean_at_k: prompt {prompt_id!r} has no samples")
        per_prompt.append(sum(map(bool, outcomes)) / len(outcomes))
    return sum(per_prompt) / len(per_prompt)


def benchmark_pass_at_k(outcomes_by_prompt: dict[str, Sequence[bool]], k: int) -> float:
    values = [pass_at_k(len(o), sum(map(bool, o)), k) for o in outcomes_by_prompt.values()]
    if not values:
        raise ValueError("benchmark_pass_at_k: no prompts")
    return sum(values) / len(values)


@dataclass(frozen=True)
class BenchmarkScore:
    mean_at_k: float
    num_prompts: int
    min_samples: int  # samples per prompt (min and max differ only for incomplete evaluations)
    max_samples: int
    prompt_counts: tuple[tuple[int, int], ...] = ()  # per prompt: (samples n, correct c)
    prompt_ids: tuple[str, ...] = ()  # aligned with prompt_counts (the bootstrap pairs prompts)

    def pass_at(self, k: int) -> float:
        """Unbiased pass@k averaged over prompts (needs k <= samples of every prompt)."""
        return sum(pass_at_k(n, c, k) for n, c in self.prompt_counts) / len(self.prompt_counts)


@dataclass
class RunInfo:
    run: str
    method: str
    seed: int
    # step -> benchmark -> score
    scores: dict[int, dict[str, BenchmarkScore]] = field(default_factory=dict)


def k_for(k: int | dict[str, int] | None, benchmark: str) -> int | None:
    """The k of ``benchmark``: one k for all, a per-benchmark mapping (absent: every sample), or None."""
    return k.get(benchmark) if isinstance(k, dict) else k


def first_k(samples: dict[int, bool], k: int | None, where: str) -> list[bool]:
    """Outcomes of the first ``k`` samples (lowest sample_idx); all of them when k is None."""
    ordered = [samples[i] for i in sorted(samples)]
    if k is None:
        return ordered
    if len(ordered) < k:
        raise RecordError(f"{where} has {len(ordered)} samples, fewer than k={k} (mean@{k} needs k per prompt)")
    return ordered[:k]


def group_records(records: Iterable[EvalRecord], k: int | dict[str, int] | None = None) -> dict[str, RunInfo]:
    """Validate and group records by run and checkpoint. Errors name the offending records.

    Checks: one method and one seed per run; no duplicate (run, step, benchmark, prompt, sample).
    ``k``: score mean@k from each prompt's first k samples (an int, or benchmark -> k).
    """
    outcomes: dict[str, dict[int, dict[str, dict[str, dict[int, bool]]]]] = {}
    runs: dict[str, RunInfo] = {}
    for record in records:
        info = runs.get(record.run)
        if info is None:
            info = runs[record.run] = RunInfo(record.run, record.method, record.seed)
        elif (info.method, info.seed) != (record.method, record.seed):
            raise RecordError(
                f"run {record.run!r} has records with method/seed {info.method!r}/{info.seed} and "
                f"{record.method!r}/{record.seed}: a run must be one method and one seed"
            )
        samples = (
            outcomes.setdefault(record.run, {})
            .setdefault(record.step, {})
            .setdefault(record.benchmark, {})
            .setdefault(record.prompt_id, {})
        )
        if record.sample_idx in samples:
            raise RecordError(f"duplicate eval record {record.key()} (same run, step, benchmark, prompt, sample)")
        samples[record.sample_idx] = record.correct
    for run, by_step in outcomes.items():
        for step, by_benchmark in by_step.items():
            runs[run].scores[step] = {}
            for benchmark, by_prompt in by_benchmark.items():
                kb = k_for(k, benchmark)
                lists = {
                    pid: first_k(s, kb, f"run {run!r} step {step} benchmark {benchmark!r} prompt {pid!r}")
                    for pid, s in by_prompt.items()
                }
                sizes = [len(v) for v in lists.values()]
                counts = tuple((len(v), sum(v)) for v in lists.values())
                runs[run].scores[step][benchmark] = BenchmarkScore(
                    mean_at_k(lists), len(lists), min(sizes), max(sizes), counts, tuple(lists)
                )
    check_seeds(runs)
    return runs


def check_seeds(runs: dict[str, RunInfo]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for info in runs.values():
        other = seen.setdefault((info.method, info.seed), info.run)
        if other != info.run:
            raise RecordError(f"method {info.method!r} has two runs with seed {info.seed}: {other!r} and {info.run!r}")


def checkpoint_average(scores: dict[str, BenchmarkScore], benchmarks: Sequence[str]) -> float | None:
    """Equal-weight average of the benchmarks' mean@k; None when one is missing."""
    if any(b not in scores for b in benchmarks):
        return None
    return sum(scores[b].mean_at_k for b in benchmarks) / len(benchmarks)


def select_best_checkpoint(info: RunInfo, benchmarks: Sequence[str]) -> int | None:
    """The step with the best average (earliest on ties); None if no step has all benchmarks."""
    best_step, best_value = None, -math.inf
    for step in sorted(info.scores):
        value = checkpoint_average(info.scores[step], benchmarks)
        if value is not None and value > best_value + 1e-12:  # float noise is not a better checkpoint
            best_step, best_value = step, value
    return best_step


def mean_and_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    if not values:
        raise ValueError("mean_and_std: no values")
    mean = sum(values) / len(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


@dataclass
class MethodRow:
    method: str
    runs: list[str]
    seeds: list[int]
    selected_steps: dict[str, int]
    # column (benchmark name or "average") -> (mean, std or None), as fractions in [0, 1]
    cells: dict[str, tuple[float, float | None]]
    runs_without_complete_checkpoint: list[str]


def method_table(
    runs: dict[str, RunInfo], benchmarks: Sequence[str], methods: Sequence[str] | None = None
) -> list[MethodRow]:
    """Table 1 rows: per method, the seeds' selected-checkpoint scores, mean and std."""
    by_method: dict[str, list[RunInfo]] = defaultdict(list)
    for info in runs.values():
        by_method[info.method].append(info)
    order = list(methods) if methods else sorted(by_method)
    unknown = [m for m in order if m not in by_method]
    if unknown:
        raise RecordError(f"method(s) {', '.join(map(repr, unknown))} have no records; known: {sorted(by_method)}")
    rows = []
    for method in order:
        infos = sorted(by_method[method], key=lambda i: i.seed)
        selected, skipped = {}, []
        for info in infos:
            step = select_best_checkpoint(info, benchmarks)
            if step is None:
                skipped.append(info.run)
            else:
                selected[info.run] = step
        cells: dict[str, tuple[float, float | None]] = {}
        chosen = [i for i in infos if i.run in selected]
        if chosen:
            for benchmark in benchmarks:
                cells[benchmark] = mean_and_std([i.scores[selected[i.run]][benchmark].mean_at_k for i in chosen])
            cells["average"] = mean_and_std([checkpoint_average(i.scores[selected[i.run]], benchmarks) for i in chosen])
        rows.append(MethodRow(method, [i.run for i in chosen], [i.seed for i in chosen], selected, cells, skipped))
    return rows


def curves(runs: dict[str, RunInfo], benchmarks: Sequence[str], column: str):
    """Per method: steps and, per step, the list of the seeds' values of ``column``
    (a benchmark name or "average"); for plots (mean line, spread band)."""
    out: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for info in runs.values():
        for step, scores in info.scores.items():
            if column == "average":
                value = checkpoint_average(scores, benchmarks)
            else:
                value = scores[column].mean_at_k if column in scores else None
            if value is not None:
                out[info.method][step].append(value)
    return {method: dict(sorted(by_step.items())) for method, by_step in out.items()}
