"""Eval records: one line of JSON per generated sample.

``{"run": str, "method": str, "seed": int, "step": int, "benchmark": str, "prompt_id": str,
"sample_idx": int, "correct": bool}``. ``run`` names one training run (one method, one seed);
``step`` is the training step (slime rollout id) of the evaluated checkpoint; ``sample_idx``
numbers the samples of one prompt (0..k-1). Written by the slime eval hook and by the local
runtime; read by ``epic-slime report``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Iterable


class RecordError(ValueError):
    """An eval record is malformed (message names the file, line and field)."""


@dataclass(frozen=True)
class EvalRecord:
    run: str
    method: str
    seed: int
    step: int
    benchmark: str
    prompt_id: str
    sample_idx: int
    correct: bool

    def key(self) -> tuple:
        """Identity of a sample: a second record with the same key is a duplicate."""
        return (self.run, self.step, self.benchmark, self.prompt_id, self.sample_idx)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str = "record") -> "EvalRecord":
        if not isinstance(data, dict):
            raise RecordError(f"{where}: expected a JSON object, got {type(data).__name__}")
        missing = [f.name for f in fields(cls) if f.name not in data]
        if missing:
            raise RecordError(f"{where}: missing field(s) {', '.join(missing)}")
        values = {}
        for name in ("run", "method", "benchmark", "prompt_id"):
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
                raise RecordError(f"{where}: field '{name}' must be a non-empty string, got {value!r}")
            values[name] = str(value)
        for name in ("seed", "step", "sample_idx"):
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, int) and not (isinstance(value, float) and value.is_integer()):
                raise RecordError(f"{where}: field '{name}' must be an integer, got {value!r}")
            values[name] = int(value)
            if name != "seed" and values[name] < 0:
                raise RecordError(f"{where}: field '{name}' must be >= 0, got {value!r}")
        correct = data["correct"]
        if isinstance(correct, bool) or correct in (0, 1):
            values["correct"] = bool(correct)
        else:
            raise RecordError(f"{where}: field 'correct' must be true/false or 0/1, got {correct!r}")
        return cls(**values)


def write_records(path: str, records: Iterable[EvalRecord | dict], append: bool = True) -> int:
    """Write records as JSON Lines; appends by default (evaluation adds records step by step).

    Dicts are validated first, so nothing malformed reaches the file. Returns the count written.
    """
    checked = [r if isinstance(r, EvalRecord) else EvalRecord.from_dict(r, where=f"record {i}")
               for i, r in enumerate(records)]
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "a" if append else "w", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(r.to_dict()) + "\n" for r in checked))
        handle.flush()
    return len(checked)


def read_records(path: str) -> list[EvalRecord]:
    """All records of one JSONL file (blank lines ignored); errors name the line."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as error:
                raise RecordError(f"{where}: invalid JSON ({error.msg})") from None
            records.append(EvalRecord.from_dict(data, where=where))
    return records


def read_record_paths(paths: Iterable[str]) -> list[EvalRecord]:
    """Records of several files; a folder stands for every ``*.jsonl`` in it."""
    records: list[EvalRecord] = []
    for path in paths:
        if os.path.isdir(path):
            names = sorted(n for n in os.listdir(path) if n.endswith(".jsonl"))
            if not names:
                raise RecordError(f"{path}: folder has no .jsonl record files")
            for name in names:
                records += read_records(os.path.join(path, name))
        elif os.path.isfile(path):
            records += read_records(path)
        else:
            raise RecordError(f"{path}: no such record file or folder")
    return records
