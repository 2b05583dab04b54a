"""Eval records: one line of JSON per generated sample.

``{"run": str, "method": str, "seed": int, "step": int, "benchmark": str, "prompt_id": str,
"sample_idx": int, "correct": bool, "weight_version": int}``. ``run`` names one training run (one method, one seed);
``step`` is the number of the evaluated checkpoint: the slime rollout id whose training produced
it (Megatron's ``iter_<step>``, ``--save-hf``'s ``{rollout_id}``), or ``PRE_TRAINING_STEP`` (-1)
for slime's evaluation before training rollout 0 (slime logs that one, and the one after rollout
0, both as rollout id 0; -1 is the id the driver and slime's RolloutManager give the state before
rollout 0). The embedded runtime numbers by weight version instead, its warm start at 0; in both,
the pre-training evaluation is the earliest step, so checkpoint selection treats it alike (it wins
ties). ``sample_idx`` numbers the samples of one prompt (0..k-1). Written by the slime eval hook
and by the local runtime; read by ``epic-slime report``.

``weight_version`` names the weights that generated the sample, in the numbering of ``step``: the
step of the checkpoint those weights are, as the serving engine reported them (slime: from the
sample's SGLang ``weight_versions``, see ``epic_slime.slime.eval_hooks``; the runtime: the version
its eval worker held). ``step`` is what the evaluation was keyed by, ``weight_version`` what it
scored, so a record where they differ scored other weights than its step names (an eval that ran
before the push of its step's weights): ``read_records`` refuses it, naming the file, line, step
and version (``VersionMismatchError``). Fallback for files written before records carried the
field: it is absent (``None``) and the step is trusted as is; ``epic-slime report`` counts such
records in its notes.

``tool_calls``, ``tool_errors``, ``turns`` (a tool-using task's records, issue 44): the sample's tool
calls, the calls answered with an error, and its engine turns; integers >= 0, the three together,
``tool_errors <= tool_calls``. Absent (``None``) for single-turn tasks, written as before (not as
null). ``epic-slime report`` shows them per response (``epic_slime.evaluation.tool_use``).

Resume (``replace_run_records``, what the slime eval hook writes with): every write of run R's
evaluation at step s replaces R's records at steps >= s and adds the new ones, so a resumed run
supersedes its own records from the first step it evaluates again (the crashed process's evals
past the last save), and a run restarted from scratch (its first write is step -1) supersedes
all of its earlier attempt. An eval-only run (``to_step = from_step``: the hook's re-scoring of one
checkpoint) replaces that one step and keeps the rest of R. Records of other runs are kept line for line. The file is rewritten
whole into a temporary file in the same folder (``.<name>.<random>.tmp``, never read as records),
fsynced and renamed over the old one (``os.replace``): a crash at any moment leaves either the
old file or the new one, never a mix, so the records before the resume step, and each step's
batch, are never lost or torn; a crash can leave a stray ``.tmp``, which is safe to delete.
Writers of one file are serialised by a POSIX lock on ``<file>.lock``.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Iterable


PRE_TRAINING_STEP = -1  # slime's evaluation before training rollout 0
TOOL_COUNT_FIELDS = ("tool_calls", "tool_errors", "turns")  # optional, a tool-using task's records
OPTIONAL_FIELDS = ("weight_version", *TOOL_COUNT_FIELDS)


class RecordError(ValueError):
    """An eval record is malformed (message names the file, line and field)."""


class VersionMismatchError(RecordError):
    """An eval record's step and the weight version it scored disagree (names file, line, step, version)."""


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
    weight_version: int | None = None  # None: a record written before records named their weights
    tool_calls: int | None = None  # None (the three alike): a single-turn task's record
    tool_errors: int | None = None
    turns: int | None = None

    def key(self) -> tuple:
        """Identity of a sample: a second record with the same key is a duplicate."""
        return (self.run, self.step, self.benchmark, self.prompt_id, self.sample_idx)

    def to_dict(self) -> dict:
        data = asdict(self)
        for name in OPTIONAL_FIELDS:
            if data[name] is None:  # unknown / not a tool-using task: written as before, not as null
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict, where: str = "record") -> "EvalRecord":
        if not isinstance(data, dict):
            raise RecordError(f"{where}: expected a JSON object, got {type(data).__name__}")
        missing = [f.name for f in fields(cls) if f.name not in data and f.name not in OPTIONAL_FIELDS]
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
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                and not (isinstance(value, float) and value.is_integer())
            ):
                raise RecordError(f"{where}: field '{name}' must be an integer, got {value!r}")
            values[name] = int(value)
            if name == "sample_idx" and values[name] < 0:
                raise RecordError(f"{where}: field 'sample_idx' must be >= 0, got {value!r}")
            if name == "step" and values[name] < PRE_TRAINING_STEP:
                raise RecordError(
                    f"{where}: field 'step' must be >= {PRE_TRAINING_STEP} "
                    f"({PRE_TRAINING_STEP}: the pre-training evaluation), got {value!r}"
                )
        correct = data["correct"]
        if isinstance(correct, bool) or correct in (0, 1):
            values["correct"] = bool(correct)
        else:
            raise RecordError(f"{where}: field 'correct' must be true/false or 0/1, got {correct!r}")
        version = data.get("weight_version")
        if version is not None:
            if (
                isinstance(version, bool)
                or not isinstance(version, int)
                and not (isinstance(version, float) and version.is_integer())
            ):
                raise RecordError(f"{where}: field 'weight_version' must be an integer or absent, got {version!r}")
            values["weight_version"] = int(version)
        values.update(_tool_counts(data, where))
        return cls(**values)

    def check_version(self, where: str = "record") -> None:
        """Refuse a record that scored other weights than its step names (see the module docstring)."""
        if self.weight_version is not None and self.weight_version != self.step:
            raise VersionMismatchError(
                f"{where}: run {self.run!r} record at step {self.step} scored weight version "
                f"{self.weight_version}: the evaluation keyed step {self.step} ran on other weights "
                f"(before the push of step {self.step}'s weights?); its scores would shift the curve and "
                f"the checkpoint selection by {self.step - self.weight_version} step(s)"
            )


def _tool_counts(data: dict, where: str) -> dict:
    """The optional tool counts of a record: none, or all three as integers >= 0 with errors <= calls."""
    held = [name for name in TOOL_COUNT_FIELDS if data.get(name) is not None]
    if not held:
        return {}
    if len(held) < len(TOOL_COUNT_FIELDS):
        absent = [name for name in TOOL_COUNT_FIELDS if name not in held]
        raise RecordError(
            f"{where}: field(s) {', '.join(absent)} absent beside {', '.join(held)}: the tool counts come together"
        )
    counts = {}
    for name in TOOL_COUNT_FIELDS:
        value = data[name]
        integral = isinstance(value, int) or isinstance(value, float) and value.is_integer()
        if isinstance(value, bool) or not integral or value < 0:
            raise RecordError(f"{where}: field '{name}' must be an integer >= 0 or absent, got {value!r}")
        counts[name] = int(value)
    if counts["tool_errors"] > counts["tool_calls"]:
        raise RecordError(
            f"{where}: field 'tool_errors' {counts['tool_errors']} exceeds 'tool_calls' {counts['tool_calls']} "
            "(an error is a call answered with one)"
        )
    return counts


def write_records(path: str, records: Iterable[EvalRecord | dict], append: bool = True) -> int:
    """Write records as JSON Lines; appends by default (evaluation adds records step by step).

    Dicts are validated first, so nothing malformed reaches the file. Returns the count written.
    """
    checked = [
        r if isinstance(r, EvalRecord) else EvalRecord.from_dict(r, where=f"record {i}") for i, r in enumerate(records)
    ]
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "a" if append else "w", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(r.to_dict()) + "\n" for r in checked))
        handle.flush()
    return len(checked)


def _parse_line(line: str, where: str) -> EvalRecord:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        raise RecordError(f"{where}: invalid JSON ({error.msg})") from None
    return EvalRecord.from_dict(data, where=where)


def read_records(path: str, check_versions: bool = True) -> list[EvalRecord]:
    """All records of one JSONL file (blank lines ignored); errors name the line. ``check_versions``:
    refuse a record whose step and weight version disagree (``EvalRecord.check_version``)."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                record = _parse_line(line, f"{path}:{number}")
                if check_versions:
                    record.check_version(f"{path}:{number}")
                records.append(record)
    return records


_thread_lock = threading.Lock()  # POSIX locks are per process: threads of one process need their own


@contextmanager
def _writer_lock(path: str):
    try:
        import fcntl
    except ImportError:  # not POSIX: one writer per file is the caller's business
        with _thread_lock:
            yield
        return
    with _thread_lock, open(path + ".lock", "a") as handle:
        fcntl.lockf(handle, fcntl.LOCK_EX)  # lockf, not flock: NFS honours POSIX locks
        try:
            yield
        finally:
            fcntl.lockf(handle, fcntl.LOCK_UN)


def replace_run_records(
    path: str, records: Iterable[EvalRecord], *, run: str, from_step: int, to_step: int | None = None
) -> int:
    """Atomically replace run ``run``'s records at steps ``from_step`` .. ``to_step`` (None: no upper
    end) by ``records`` (see the module docstring for the rule and the crash guarantees); other
    runs' lines, and this run's outside the range, stay as they are.

    Every new record must belong to ``run`` at a step in the range. A run keeps one method and
    one seed: new records that disagree with the file's records of ``run`` are refused (reusing a
    run name for another method or seed would otherwise delete that run's records).
    Returns the count written.
    """
    new = list(records)
    for record in new:
        if not isinstance(record, EvalRecord):
            raise TypeError(f"replace_run_records takes EvalRecord objects, got {type(record).__name__}")
        if record.run != run:
            raise ValueError(f"replace_run_records: a record of run {record.run!r} among run {run!r}'s")
        if record.step < from_step or (to_step is not None and record.step > to_step):
            raise ValueError(
                f"replace_run_records: record at step {record.step} outside "
                f"[{from_step}, {'end' if to_step is None else to_step}]"
            )
    identities = {(r.method, r.seed) for r in new}
    if len(identities) > 1:
        raise RecordError(f"run {run!r}: new records disagree on method/seed: {sorted(identities)}")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with _writer_lock(path):
        kept: list[str] = []
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    if not line.strip():
                        continue
                    record = _parse_line(line, f"{path}:{number}")
                    if record.run == run:
                        if new and (record.method, record.seed) != (new[0].method, new[0].seed):
                            name = "method" if record.method != new[0].method else "seed"
                            raise RecordError(
                                f"{path}:{number}: run {run!r} has field '{name}' {getattr(record, name)!r} there, "
                                f"the new records {getattr(new[0], name)!r}: one run name per method and seed "
                                f"(set another epic_run_name)"
                            )
                        if record.step >= from_step and (to_step is None or record.step <= to_step):
                            continue  # superseded
                    kept.append(line if line.endswith("\n") else line + "\n")
        mode = _file_mode(path)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        try:
            os.chmod(tmp, mode)  # mkstemp makes 0600: the report may run as another user
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.writelines(kept)
                handle.write("".join(json.dumps(r.to_dict()) + "\n" for r in new))
                handle.flush()
                os.fsync(handle.fileno())  # the data is on disk before the rename makes it the file
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        _fsync_directory(directory)
    return len(new)


def _file_mode(path: str) -> int:
    """The existing file's permissions, else what ``open(path, "w")`` would give."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)  # reading the umask means setting it; put it straight back
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_directory(directory: str) -> None:
    """Make the rename durable (best effort: not every platform can open a folder)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
