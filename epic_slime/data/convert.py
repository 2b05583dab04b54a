"""Raw rows (any of the sources' layouts) -> slime-ready records.

A record is ``{"prompt": [chat message], "label": str, "metadata": {"benchmark",
"problem_id", "source"}}``. Rows are de-duplicated by problem text (DAPO-Math-17k repeats
each prompt about 100 times; AMC 2023 copies contain identical prompts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from epic_slime.data.templates import dapo_chat_prompt, strip_dapo_template

_PROBLEM_KEYS = ("problem", "question", "Problem", "Question")
_ANSWER_KEYS = ("answer", "Answer", "label", "ground_truth", "final_answer")
_ID_KEYS = ("id", "problem_id", "problem_idx", "unique_id", "idx")


class RowError(ValueError):
    """A source row lacks a problem or an answer."""


def _nested(row: dict, dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def problem_text(row: dict) -> str:
    for key in _PROBLEM_KEYS:
        if isinstance(row.get(key), str) and row[key].strip():
            return row[key].strip()
    prompt = row.get("prompt")
    if hasattr(prompt, "tolist"):  # numpy arrays from parquet
        prompt = prompt.tolist()
    if isinstance(prompt, list) and prompt:
        users = [m for m in prompt if isinstance(m, dict) and m.get("role", "user") == "user"]
        if users and isinstance(users[-1].get("content"), str):
            return strip_dapo_template(users[-1]["content"]).strip()
    if isinstance(prompt, str) and prompt.strip():
        return strip_dapo_template(prompt).strip()
    raw = _nested(row, "extra_info.raw_problem")
    if isinstance(raw, str) and raw.strip():
        return raw.strip()
    raise RowError(f"row has no problem text (looked for {_PROBLEM_KEYS + ('prompt',)}); keys: {sorted(row)}")


def canonical_answer(value: Any) -> str:
    """'025' -> '25', 27.0 -> '27', LaTeX kept verbatim (stripped)."""
    if isinstance(value, bool) or value is None:
        raise RowError(f"answer must be a string or number, got {value!r}")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise RowError(f"answer is not finite: {value!r}")
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    text = str(value).strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return str(int(text))
    if re.fullmatch(r"[+-]?\d+\.0+", text):
        return str(int(float(text)))
    if not text:
        raise RowError("answer is empty")
    return text


def answer_value(row: dict) -> str:
    for key in _ANSWER_KEYS:
        if key in row and row[key] is not None and str(row[key]).strip():
            return canonical_answer(row[key])
    ground_truth = _nested(row, "reward_model.ground_truth")
    if ground_truth is not None and str(ground_truth).strip():
        return canonical_answer(ground_truth)
    raise RowError(
        f"row has no answer (looked for {_ANSWER_KEYS + ('reward_model.ground_truth',)}); keys: {sorted(row)}"
    )


def row_id(row: dict, position: int, benchmark: str = "") -> str:
    """The row's own id; bare numbers get the benchmark as prefix ('hmmt_feb_2025_7')."""
    value = None
    for key in _ID_KEYS:
        if key in row and row[key] is not None and str(row[key]).strip():
            value = str(row[key]).strip()
            break
    if value is None:
        index = _nested(row, "extra_info.index")
        value = str(index) if index is not None else str(position)
    if benchmark and re.fullmatch(r"\d+", value):
        value = f"{benchmark}_{value}"
    return value


def _dedupe_key(problem: str) -> str:
    return re.sub(r"\s+", " ", problem).strip()


@dataclass
class ConversionReport:
    rows_in: int = 0
    records_out: int = 0
    duplicates: int = 0
    conflicting_duplicates: list[str] = field(default_factory=list)  # ids whose repeated prompt had another answer

    def as_dict(self) -> dict:
        return {
            "rows_in": self.rows_in,
            "records_out": self.records_out,
            "duplicates_removed": self.duplicates,
            "conflicting_duplicates": self.conflicting_duplicates[:50],
            "conflicting_duplicates_count": len(self.conflicting_duplicates),
        }


def convert_rows(rows: Iterable[dict], benchmark: str, source: str) -> tuple[list[dict], ConversionReport]:
    """Rows -> de-duplicated records (first occurrence kept). Bad rows raise ``RowError`` with their position."""
    report = ConversionReport()
    seen: dict[str, str] = {}
    records: list[dict] = []
    for position, row in enumerate(rows):
        report.rows_in += 1
        try:
            problem = problem_text(row)
            label = answer_value(row)
        except RowError as error:
            raise RowError(f"{benchmark} ({source}) row {position}: {error}") from None
        key = _dedupe_key(problem)
        if key in seen:
            report.duplicates += 1
            if seen[key] != label:
                report.conflicting_duplicates.append(row_id(row, position, benchmark))
            continue
        seen[key] = label
        records.append(
            {
                "prompt": dapo_chat_prompt(problem),
                "label": label,
                "metadata": {"benchmark": benchmark, "problem_id": row_id(row, position, benchmark), "source": source},
            }
        )
    report.records_out = len(records)
    return records, report
