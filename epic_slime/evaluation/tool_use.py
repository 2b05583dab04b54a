"""The agent's tool use in ``epic-slime report`` (issue 44): tool calls, tool errors and turns per response.

A tool-using task's eval records carry each sample's counts (``EvalRecord.tool_calls``,
``tool_errors``, ``turns``); a single-turn task's carry none, and its report is unchanged.

Which responses count: the ones mean@k counts, i.e. each prompt's first k samples (``--k``,
``--benchmark-k``; all without). A run's figure at a step is the mean over those responses of the
report's benchmarks, pooled (every response weighs the same, as the runtime's
``eval/heldout/*_per_response``). Table 1's section takes each run at its selected checkpoint and
gives, per method, the mean and sample standard deviation (ddof=1) over seeds, as Table 1 does.

Mixed records (some responses without counts): the means are over the responses that carry them;
the notes say how many counted responses carry none, and in which runs. A run none of whose
responses at its selected checkpoint carries counts has no figure and is left out of its method's
mean ("n/a" when no run of the method has one).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

from epic_slime.evaluation.metrics import MethodRow, k_for, mean_and_std
from epic_slime.evaluation.records import TOOL_COUNT_FIELDS, EvalRecord

CSV_COLUMNS = tuple(f"{name}_per_response" for name in TOOL_COUNT_FIELDS)
TITLES = ("Tool calls", "Tool errors", "Turns")


@dataclass(frozen=True)
class ToolCounts:
    """Counted responses with counts, those without, and the sums of their three counts."""

    responses: int = 0
    without: int = 0
    sums: tuple[int, int, int] = (0, 0, 0)

    def __add__(self, other: ToolCounts) -> ToolCounts:
        sums = tuple(a + b for a, b in zip(self.sums, other.sums))
        return ToolCounts(self.responses + other.responses, self.without + other.without, sums)

    def per_response(self) -> tuple[float, float, float] | None:
        return tuple(s / self.responses for s in self.sums) if self.responses else None


class ToolUse:
    """The counts of the responses mean@k counts, by (run, step, benchmark)."""

    def __init__(self, records: Iterable[EvalRecord], k: int | dict[str, int] | None = None):
        by_prompt: dict[tuple, list[EvalRecord]] = defaultdict(list)
        for record in records:
            by_prompt[(record.run, record.step, record.benchmark, record.prompt_id)].append(record)
        self.cells: dict[tuple[str, int, str], ToolCounts] = defaultdict(ToolCounts)
        for (run, step, benchmark, _), members in by_prompt.items():
            members.sort(key=lambda r: r.sample_idx)
            for record in members[: k_for(k, benchmark)]:  # None: every sample
                if record.tool_calls is None:
                    counted = ToolCounts(without=1)
                else:
                    counted = ToolCounts(1, 0, (record.tool_calls, record.tool_errors, record.turns))
                self.cells[(run, step, benchmark)] += counted
        self.any = any(c.responses for c in self.cells.values())

    def at(self, run: str, step: int, benchmarks: Sequence[str]) -> ToolCounts:
        total = ToolCounts()
        for benchmark in benchmarks:
            total += self.cells.get((run, step, benchmark), ToolCounts())
        return total

    def csv_header(self) -> list[str]:
        """scores.csv's three columns, when any record carries counts (else none: the file as before)."""
        return list(CSV_COLUMNS) if self.any else []

    def csv_cells(self, run: str, step: int, benchmarks: Sequence[str]) -> list[str]:
        """One row's cells of those columns ("" where no counted response carries counts)."""
        if not self.any:
            return []
        means = self.at(run, step, benchmarks).per_response()
        return [f"{m:.6f}" for m in means] if means else ["", "", ""]

    def selected(self, rows: Sequence[MethodRow], benchmarks: Sequence[str]) -> dict[str, ToolCounts]:
        """Run -> its counts at the checkpoint Table 1 selected."""
        return {run: self.at(run, row.selected_steps[run], benchmarks) for row in rows for run in row.runs}


def _cell(values: list[float]) -> str:
    if not values:
        return "n/a"
    mean, std = mean_and_std(values)
    return f"{mean:.2f}" if std is None else f"{mean:.2f} ± {std:.2f}"


def tool_use_section(rows: Sequence[MethodRow], tool_use: ToolUse, benchmarks: Sequence[str]) -> list[str]:
    """table1.md's "## Tool use" lines; none when no response Table 1 counts carries tool counts."""
    selected = tool_use.selected(rows, benchmarks)
    if not any(c.responses for c in selected.values()):
        return []
    lines = [
        "## Tool use",
        "",
        "Per response at each run's selected checkpoint (the responses Table 1's mean@k counts), "
        "mean ± standard deviation (ddof=1) over seeds.",
        "",
        "| Method | " + " | ".join(TITLES) + " |",
        "|---|" + "|".join([":---:"] * len(TITLES)) + "|",
    ]
    for row in rows:
        means = [m for m in (selected[run].per_response() for run in row.runs) if m is not None]
        cells = [_cell([m[i] for m in means]) for i in range(len(TITLES))]
        lines.append("| " + " | ".join([row.method, *cells]) + " |")
    return [*lines, ""]


def tool_use_notes(rows: Sequence[MethodRow], tool_use: ToolUse, benchmarks: Sequence[str]) -> list[str]:
    """A note when some responses at the selected checkpoints carry no tool counts (mixed records)."""
    selected = tool_use.selected(rows, benchmarks)
    if not any(c.responses for c in selected.values()):
        return []
    without = sorted(run for run, c in selected.items() if c.without)
    if not without:
        return []
    missing = sum(c.without for c in selected.values())
    total = missing + sum(c.responses for c in selected.values())
    left_out = sorted(run for run, c in selected.items() if not c.responses)
    line = (
        f"{missing} of {total} responses at the selected checkpoints (run(s) {', '.join(without)}) carry no "
        f"tool counts: the tool-use figures are means over the responses that carry them"
    )
    if left_out:
        line += f"; run(s) {', '.join(left_out)} have none and are left out of them"
    return [line]
