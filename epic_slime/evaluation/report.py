"""``epic-slime report``: Table 1 (Markdown) and training curves (PNG) from eval records.

    epic-slime report --records runs/*.jsonl --out report/

``--k K`` scores mean@K from each prompt's first K samples (``--benchmark-k NAME=K`` per benchmark,
``--reeval-protocol`` for the authors' 32-sample re-evaluation: AIME k = 32, AMC / HMMT k = 16); each
Table 1 cell carries a bootstrap 95% interval over prompts and seeds (``--bootstrap N`` replicates).

Writes ``table1.md`` (Table 1, per-run selections, notes), ``scores.csv`` (every run, step
and benchmark), ``selection.json`` and ``average.png`` + one ``<benchmark>.png`` per benchmark.
Records with the agent's tool counts add a "Tool use" section and three columns (``tool_use``).

A record file whose step and weight version disagree (an eval that scored other weights than its
step names) is refused with an error naming the file, line, step and version; records from before
the version field are read with their step trusted, counted in the notes.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from typing import Sequence

from epic_slime.evaluation.bootstrap import Interval, method_intervals
from epic_slime.evaluation.config import BENCHMARKS, PAPER_PROTOCOL, REEVAL_K
from epic_slime.evaluation.metrics import (
    MethodRow,
    RunInfo,
    checkpoint_average,
    group_records,
    method_table,
)
from epic_slime.evaluation.records import RecordError, read_record_paths
from epic_slime.evaluation.tool_use import ToolUse, tool_use_notes, tool_use_section


def format_cell(cell: tuple[float, float | None] | None, interval: Interval | None = None) -> str:
    """Percent with one decimal: '43.2 ± 1.1' (no ± with a single seed), 'n/a' when absent;
    with an interval: '43.2 ± 1.1 [40.0, 46.3]'."""
    if cell is None:
        return "n/a"
    mean, std = cell
    text = f"{100 * mean:.1f}" if std is None else f"{100 * mean:.1f} ± {100 * std:.1f}"
    if interval is not None:
        text += f" [{100 * interval.low:.1f}, {100 * interval.high:.1f}]"
    return text


def table1_markdown(
    rows: Sequence[MethodRow],
    benchmarks: Sequence[str],
    titles: dict[str, str],
    intervals: dict[str, dict[str, Interval]] | None = None,
) -> str:
    header = ["Method"] + [titles.get(b, b) for b in benchmarks] + ["Average"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + [":---:"] * (len(header) - 1)) + "|"]
    for row in rows:
        ci = (intervals or {}).get(row.method, {})
        cells = [format_cell(row.cells.get(c), ci.get(c)) for c in [*benchmarks, "average"]]
        lines.append("| " + " | ".join([row.method] + cells) + " |")
    return "\n".join(lines)


def parse_benchmark_k(values: Sequence[str] | None) -> dict[str, int]:
    """``["amc_2023=16", ...]`` -> {benchmark: k}; errors name the bad value."""
    out: dict[str, int] = {}
    for value in values or []:
        name, sep, number = value.partition("=")
        try:
            k = int(number)
        except ValueError:
            k = 0
        if not sep or not name or k < 1:
            raise ValueError(f"--benchmark-k: expected NAME=K with K >= 1, got {value!r}")
        out[name] = k
    return out


def resolve_k(args) -> int | dict[str, int] | None:
    """One k for all (--k), per-benchmark k (--reeval-protocol, then --benchmark-k on top), or None (all samples)."""
    per_benchmark = dict(REEVAL_K) if args.reeval_protocol else {}
    per_benchmark.update(parse_benchmark_k(args.benchmark_k))
    if not per_benchmark:
        return args.k
    if args.k is not None:
        return {b: per_benchmark.get(b, args.k) for b in args.benchmarks}
    return per_benchmark


def runs_markdown(
    rows: Sequence[MethodRow],
    runs: dict[str, RunInfo],
    benchmarks: Sequence[str],
    titles: dict[str, str],
    pass_k: int | None,
) -> str:
    header = ["Run", "Method", "Seed", "Selected step"] + [titles.get(b, b) for b in benchmarks] + ["Average"]
    if pass_k:
        header += [f"pass@{pass_k} {titles.get(b, b)}" for b in benchmarks]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    for row in rows:
        for run in row.runs:
            info, step = runs[run], row.selected_steps[run]
            scores = info.scores[step]
            cells = [f"{100 * scores[b].mean_at_k:.1f}" for b in benchmarks]
            cells.append(f"{100 * checkpoint_average(scores, benchmarks):.1f}")
            if pass_k:
                cells += [
                    f"{100 * scores[b].pass_at(pass_k):.1f}" if scores[b].min_samples >= pass_k else "n/a"
                    for b in benchmarks
                ]
            lines.append("| " + " | ".join([run, info.method, str(info.seed), str(step)] + cells) + " |")
    return "\n".join(lines)


def version_note(records) -> list[str]:
    """Records name the weights they scored (``weight_version``; ``read_records`` refused any that
    disagree with their step). Files from before that field: their steps are trusted, said here."""
    unnamed = sorted({r.run for r in records if r.weight_version is None})
    if not unnamed:
        return []
    count = sum(r.weight_version is None for r in records)
    return [
        f"{count} of {len(records)} records (run(s) {', '.join(unnamed)}) name no weight version (written "
        f"before records carried one): their step is taken as the weights they scored, unchecked"
    ]


def notes(
    rows: Sequence[MethodRow],
    runs: dict[str, RunInfo],
    benchmarks: Sequence[str],
    k_expected: int,
    k: int | dict[str, int] | None = None,
    records=(),
) -> list[str]:
    out = version_note(records)
    if k is not None:
        chosen = {b: (k.get(b) if isinstance(k, dict) else k) for b in benchmarks}
        out.append(
            "mean@k from the first k samples of each prompt: "
            + ", ".join(f"{b} k={v if v is not None else 'all'}" for b, v in chosen.items())
        )
        if isinstance(k, int) or len({v for v in chosen.values()}) == 1 and None not in chosen.values():
            k_expected = next(iter(chosen.values()))
        else:
            k_expected = None
    prompts = {
        b: sorted({s[b].num_prompts for i in runs.values() for s in i.scores.values() if b in s}) for b in benchmarks
    }
    samples = sorted(
        {
            (s[b].min_samples, s[b].max_samples)
            for i in runs.values()
            for s in i.scores.values()
            for b in benchmarks
            if b in s
        }
    )
    out.append(
        "Prompts per benchmark: " + ", ".join(f"{b} {'/'.join(map(str, p)) or 'none'}" for b, p in prompts.items())
    )
    sample_sizes = sorted({n for pair in samples for n in pair})
    out.append(
        f"Samples per prompt: {'/'.join(map(str, sample_sizes)) or 'none'}"
        + (f" (protocol: {k_expected})" if k_expected is not None else "")
    )
    if k_expected is not None and sample_sizes and sample_sizes != [k_expected]:
        out.append(
            f"WARNING: samples per prompt differ from the protocol's {k_expected}: "
            f"these are mean@{'/'.join(map(str, sample_sizes))} numbers"
        )
    for b, p in prompts.items():
        if len(p) > 1:
            out.append(f"WARNING: {b} was evaluated on different numbers of prompts across checkpoints: {p}")
    for row in rows:
        if row.runs_without_complete_checkpoint:
            out.append(
                f"WARNING: method {row.method}: run(s) {', '.join(row.runs_without_complete_checkpoint)} "
                f"have no checkpoint with all {len(benchmarks)} benchmarks and are left out"
            )
        if len(row.runs) == 1:
            out.append(f"Method {row.method}: a single seed, no standard deviation")
    return out


def write_scores_csv(
    path: str, runs: dict[str, RunInfo], benchmarks: Sequence[str], tool_use: ToolUse | None = None
) -> None:
    """``tool_use`` holding any counts adds its three columns."""
    tools = tool_use or ToolUse(())
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        header = ["run", "method", "seed", "step", "benchmark", "mean_at_k", "num_prompts", "samples_per_prompt"]
        writer.writerow(header + tools.csv_header())
        for info in sorted(runs.values(), key=lambda i: (i.method, i.seed, i.run)):
            for step in sorted(info.scores):
                scores = info.scores[step]
                for b in sorted(scores, key=lambda x: (x not in benchmarks, x)):
                    s = scores[b]
                    writer.writerow(
                        [
                            info.run,
                            info.method,
                            info.seed,
                            step,
                            b,
                            f"{s.mean_at_k:.6f}",
                            s.num_prompts,
                            s.min_samples if s.min_samples == s.max_samples else f"{s.min_samples}-{s.max_samples}",
                        ]
                        + tools.csv_cells(info.run, step, [b])
                    )
                average = checkpoint_average(scores, benchmarks)
                if average is not None:
                    tool_cells = tools.csv_cells(info.run, step, benchmarks)
                    writer.writerow(
                        [info.run, info.method, info.seed, step, "average", f"{average:.6f}", "", "", *tool_cells]
                    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epic-slime report", description="Table 1 and curves from eval records")
    parser.add_argument(
        "--records",
        nargs="+",
        required=True,
        help="record files (JSONL), folders of them, or run folders of `epic-slime train` (their eval_records.jsonl)",
    )
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument(
        "--benchmarks",
        nargs="+",
        default=None,
        help="benchmarks of the average, in column order (default: the ones the records hold, "
        "the paper's four first in their order, then the rest sorted)",
    )
    parser.add_argument(
        "--methods", nargs="+", default=None, help="methods (rows) to show, in order (default: all, sorted)"
    )
    parser.add_argument(
        "--samples-per-prompt",
        type=int,
        default=PAPER_PROTOCOL.samples_per_prompt,
        help="expected k of mean@k; a mismatch is flagged in the notes (default 8)",
    )
    parser.add_argument(
        "--k",
        type=int,
        default=None,
        help="mean@k from the first k samples of each prompt (a prompt with fewer is an error)",
    )
    parser.add_argument(
        "--benchmark-k",
        action="append",
        metavar="NAME=K",
        default=None,
        help="k of one benchmark (repeatable); benchmarks without one use --k, else all samples",
    )
    parser.add_argument(
        "--reeval-protocol",
        action="store_true",
        help="the authors' 32-sample re-evaluation: " + ", ".join(f"{b} k={k}" for b, k in REEVAL_K.items()),
    )
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=2000,
        metavar="N",
        help="bootstrap replicates for the 95%% interval of each Table 1 cell (0: no intervals)",
    )
    parser.add_argument("--bootstrap-seed", type=int, default=0)
    parser.add_argument("--pass-at-k", type=int, default=None, help="also list unbiased pass@k per run")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the report already in --out (without it a folder holding one is refused)",
    )
    return parser


# what `epic-slime report` writes (plots: curves_*.png); a folder holding any of them holds a report
REPORT_FILES = ("table1.md", "scores.csv", "intervals.json", "selection.json")


def check_out_folder(out: str, overwrite: bool) -> None:
    """As `epic-slime train` with its --output-dir: a folder holding an earlier report is not
    overwritten silently (RecordError naming the folder and the files) unless --overwrite."""
    held = [n for n in REPORT_FILES if os.path.exists(os.path.join(out, n))]
    if held and not overwrite:
        raise RecordError(
            f"--out {out} already holds a report ({', '.join(held)}): pass --overwrite to replace it, "
            "or choose another --out"
        )


def _check_benchmarks_present(runs: dict, benchmarks: Sequence[str]) -> None:
    """An all-n/a table helps nobody: name the benchmarks the records hold and the flag to pass."""
    held = sorted({b for info in runs.values() for scores in info.scores.values() for b in scores})
    if not set(benchmarks) & set(held):
        local = " (`heldout` is the embedded runtime's held-out split)" if "heldout" in held else ""
        raise RecordError(
            f"none of the benchmarks {' '.join(benchmarks)} is in the records; they hold "
            f"{' '.join(held)}{local}: pass --benchmarks {' '.join(held)}"
        )


# an `epic-slime train` run folder: its records file, and the .jsonl files beside it that are not records
RUN_FOLDER_RECORDS = "eval_records.jsonl"
RUN_FOLDER_OTHER_JSONL = ("metrics.jsonl", "batches.jsonl")


def record_paths(paths: Sequence[str]) -> list[str]:
    """A run folder of the embedded runtime stands for its eval records (a folder otherwise stands
    for every .jsonl in it, and the run's metrics and batches files are not records)."""

    def is_run_folder(p: str) -> bool:
        return all(os.path.isfile(os.path.join(p, n)) for n in (RUN_FOLDER_RECORDS, *RUN_FOLDER_OTHER_JSONL))

    return [os.path.join(p, RUN_FOLDER_RECORDS) if is_run_folder(p) else p for p in paths]


def held_benchmarks(records) -> list[str]:
    """The records' benchmarks: the paper's in their order, then the others sorted."""
    held = {r.benchmark for r in records}
    return [b for b in BENCHMARKS if b in held] + sorted(held - set(BENCHMARKS))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_out_folder(args.out, args.overwrite)
        records = read_record_paths(record_paths(args.records))
        if not records:
            raise RecordError(f"no eval records in {', '.join(args.records)}")
        defaulted = args.benchmarks is None
        if defaulted:
            args.benchmarks = held_benchmarks(records)
        k = resolve_k(args)
        if isinstance(k, int) and k < 1:
            raise ValueError(f"--k must be >= 1, got {k}")
        runs = group_records(records, k=k)
        _check_benchmarks_present(runs, args.benchmarks)
        rows = method_table(runs, args.benchmarks, args.methods)
        tool_use = ToolUse(records, k)
        intervals = {
            row.method: method_intervals(row, runs, args.benchmarks, args.bootstrap, args.bootstrap_seed)
            for row in rows
        }
    except (RecordError, ValueError) as error:
        print(f"epic-slime report: error: {error}", file=sys.stderr)
        return 2  # bad input, as every other epic-slime command
    titles = dict(BENCHMARKS)
    os.makedirs(args.out, exist_ok=True)
    table = table1_markdown(rows, args.benchmarks, titles, intervals)
    interval_note = (
        f" [bootstrap 95% interval over prompts and seeds, {args.bootstrap} replicates]" if args.bootstrap > 0 else ""
    )
    evaluated = sorted({len(runs[run].scores) for row in rows for run in row.runs})
    chosen_from = "/".join(map(str, evaluated)) or "0"
    benchmark_note = (
        f" Benchmarks: {' '.join(args.benchmarks)} (the ones the records hold; --benchmarks to choose)."
        if defaulted
        else ""
    )
    document = [
        "# Table 1",
        "",
        f"mean@k (%) at each run's checkpoint with the best equal-weight average of "
        f"{len(args.benchmarks)} benchmarks; mean ± standard deviation (ddof=1) over seeds{interval_note}.",
        "",
        f"Each number is the best of {chosen_from} evaluated checkpoints per run, scored on the same records "
        f"that chose it: an optimistic estimate. For an unbiased one, re-score the selected checkpoints on a "
        f"held-out split (launch/reeval.sh with other data, or other samples).{benchmark_note}",
        "",
        table,
        "",
        "## Selected checkpoints",
        "",
        runs_markdown(rows, runs, args.benchmarks, titles, args.pass_at_k),
        "",
        *tool_use_section(rows, tool_use, args.benchmarks),
        "## Notes",
        "",
        *[f"- {line}" for line in notes(rows, runs, args.benchmarks, args.samples_per_prompt, k, records)],
        *[f"- {line}" for line in tool_use_notes(rows, tool_use, args.benchmarks)],
        "",
    ]
    with open(os.path.join(args.out, "table1.md"), "w") as handle:
        handle.write("\n".join(document))
    write_scores_csv(os.path.join(args.out, "scores.csv"), runs, args.benchmarks, tool_use)
    selection = {
        row.method: {run: {"seed": runs[run].seed, "step": row.selected_steps[run]} for run in row.runs} for row in rows
    }
    if args.bootstrap > 0:
        with open(os.path.join(args.out, "intervals.json"), "w") as handle:
            json.dump({m: {c: [i.low, i.high] for c, i in ci.items()} for m, ci in intervals.items()}, handle, indent=2)
    with open(os.path.join(args.out, "selection.json"), "w") as handle:
        json.dump(selection, handle, indent=2)
    if not args.no_plots:
        from epic_slime.evaluation.plots import plot_curves

        plot_curves(runs, args.benchmarks, titles, args.out)
    print(table)
    print(f"\nreport written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
