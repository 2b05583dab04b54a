"""Issue 28, section 2: every eval record names the weights it scored, and the report refuses a
file whose step and version disagree (before the fix records had no version: nothing could).
Files written before the field existed are read with their steps trusted, and the report says so."""

from __future__ import annotations

import json
import types

import pytest

from epic_slime.evaluation import report
from epic_slime.evaluation.records import EvalRecord, RecordError, VersionMismatchError, read_records, write_records


def _records(step: int, weights, run: str = "r", prompts: int = 3, seed: int = 1):
    return [
        EvalRecord(run, "epic", seed, step, "heldout", f"p{p}", s, (p + s) % 2 == 0, weight_version=weights)
        for p in range(prompts)
        for s in range(2)
    ]


def _report(tmp_path, path, capsys):
    rc = report.main(["--records", str(path), "--out", str(tmp_path / "out"), "--no-plots", "--bootstrap", "0"])
    return rc, capsys.readouterr()


def test_the_version_round_trips_and_old_lines_read_without_one(tmp_path):
    path = tmp_path / "e.jsonl"
    write_records(str(path), _records(4, 4) + _records(5, None))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert {x.get("weight_version") for x in lines} == {4, None}
    assert all("weight_version" not in x for x in lines if x["step"] == 5)  # unknown: not written as null
    back = read_records(str(path))
    assert back == _records(4, 4) + _records(5, None)


def test_a_record_scored_on_other_weights_than_its_step_is_refused_by_name(tmp_path, capsys):
    path = tmp_path / "evals.jsonl"
    write_records(str(path), _records(2, 2) + _records(3, 2))  # step 3's eval ran before the push
    with pytest.raises(VersionMismatchError) as error:
        read_records(str(path))
    message = str(error.value)
    assert f"{path}:7" in message and "step 3" in message and "weight version 2" in message
    rc, out = _report(tmp_path, path, capsys)
    assert rc == 2 and f"{path}:7" in out.err and "step 3 scored weight version 2" in out.err
    assert read_records(str(path), check_versions=False)[-1].weight_version == 2  # inspectable when asked


def test_the_report_reads_old_files_with_a_counted_note(tmp_path, capsys):
    path = tmp_path / "evals.jsonl"
    write_records(
        str(path),
        _records(0, 0) + _records(1, 1) + _records(1, None, run="old", seed=2) + _records(0, None, run="old", seed=2),
    )
    rc, out = _report(tmp_path, path, capsys)
    assert rc == 0, out.err
    table = (tmp_path / "out" / "table1.md").read_text()
    assert "12 of 24 records (run(s) old) name no weight version" in table


@pytest.mark.parametrize("bad", ["3", True, 1.5])
def test_a_malformed_version_is_refused_naming_the_field(tmp_path, bad):
    path = tmp_path / "e.jsonl"
    line = _records(1, None)[0].to_dict() | {"weight_version": bad}
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(RecordError, match=r"e\.jsonl:1: field 'weight_version' must be an integer or absent"):
        read_records(str(path))


def test_the_runtime_keys_by_the_due_version_and_names_the_scored_one(tmp_path):
    from epic_slime.runtime.run_files import EVAL_RECORDS_FILE, RunLog

    cfg = types.SimpleNamespace(output_dir=str(tmp_path / "run"), policy_loss="epic", seed=1)
    (tmp_path / "run").mkdir()
    log = RunLog(cfg)
    log.evaluation(3, {"eval/version": 3}, 3, [[True, False]], weight_version=3)
    assert {r.weight_version for r in read_records(str(tmp_path / "run" / EVAL_RECORDS_FILE))} == {3}
    log.evaluation(4, {"eval/version": 5}, 5, [[True, True]], weight_version=4)  # the worker held 4
    with pytest.raises(VersionMismatchError, match="step 5 scored weight version 4"):
        read_records(str(tmp_path / "run" / EVAL_RECORDS_FILE))
