"""Data preparation: local conversion, template, de-duplication; downloads through huggingface_hub
against a loopback stand-in of the Hub (no network)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from support.eval_helpers import REPO_ROOT, load_shared_rows, require_shared_math
from support.hub_standin import HubStandIn
from epic_slime.cli import main as cli_main
from epic_slime.data import DAPO_PREFIX, DAPO_SUFFIX, RowError, canonical_answer, convert_rows
from epic_slime.data import prepare
from epic_slime.data.sources import BY_NAME


def _read_jsonl(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def test_from_local_converts_the_shared_files(tmp_path, capsys):
    folder = require_shared_math()
    assert cli_main(["prepare-data", "--out", str(tmp_path), "--from-local", folder]) == 0
    # the shared folder's DAPO file is a 28-row sample: said on its line and in the manifest, nowhere else
    printed = capsys.readouterr().out
    (dapo_line,) = [line for line in printed.splitlines() if line.startswith("dapo_math_17k")]
    assert "dapo_math_sample.jsonl is a 28-row sample of DAPO-Math-17k, not the full set" in dapo_line
    assert printed.count("-row sample") == 1
    counts = {
        name: len(_read_jsonl(tmp_path / "eval" / f"{name}.jsonl"))
        for name in ("aime_2024", "aime_2025", "amc_2023", "hmmt_feb_2025")
    }
    assert counts == {"aime_2024": 30, "aime_2025": 30, "amc_2023": 40, "hmmt_feb_2025": 30}
    assert sum(counts.values()) == 130
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["datasets"]["amc_2023"]["records_out"] == 40
    assert [name for name, entry in manifest["datasets"].items() if entry["warnings"]] == ["dapo_math_17k"]

    # labels and ids come from the source rows, in order
    hmmt = _read_jsonl(tmp_path / "eval" / "hmmt_feb_2025.jsonl")
    source = load_shared_rows("hmmt_feb_2025")
    assert [r["label"] for r in hmmt] == [row["answer"] for row in source]
    assert [r["metadata"]["problem_id"] for r in hmmt] == [row["id"] for row in source]
    assert {r["metadata"]["benchmark"] for r in hmmt} == {"hmmt_feb_2025"}
    aime = _read_jsonl(tmp_path / "eval" / "aime_2024.jsonl")
    assert aime[1]["label"] == "25"  # published as "025"


def test_dapo_template_matches_the_dapo_files_verbatim(tmp_path):
    """Our prompts must be byte-identical to DAPO's own (independent reference: the DAPO files)."""
    folder = require_shared_math()
    assert prepare.main(["--out", str(tmp_path), "--from-local", folder, "--datasets", "dapo_math_17k"]) == 0
    train = _read_jsonl(tmp_path / "train" / "dapo_math_17k.jsonl")
    reference = load_shared_rows("dapo_math_sample")
    assert len(train) == len(reference) == 28
    for ours, theirs in zip(train, reference):
        assert ours["prompt"] == theirs["prompt"]
        assert ours["label"] == theirs["reward_model"]["ground_truth"]
    # a DAPO-format source (template already applied) round-trips to the same prompt
    dapo_aime = load_shared_rows("aime_2024_dapo_format")
    rows = [{"prompt": row["prompt"], "reward_model": row["reward_model"]} for row in dapo_aime]
    records, _ = convert_rows(rows, "aime_2024", "test")
    assert [r["prompt"] for r in records] == [row["prompt"] for row in dapo_aime]
    assert records[0]["prompt"][0]["content"].startswith(DAPO_PREFIX)
    assert records[0]["prompt"][0]["content"].endswith(DAPO_SUFFIX)


def test_duplicates_are_removed_and_conflicts_counted():
    rows = [
        {"problem": "What is 1+1?", "answer": "2"},
        {"problem": "What is  1+1? ", "answer": "2"},  # same text up to whitespace
        {"problem": "What is 2+2?", "answer": 4.0},
        {"problem": "What is 2+2?", "answer": "5"},  # same prompt, other answer: counted
        {"question": "What is 3+3?", "answer": "006"},
    ]
    records, report = convert_rows(rows, "amc_2023", "test")
    assert [r["label"] for r in records] == ["2", "4", "6"]
    assert report.rows_in == 5 and report.records_out == 3 and report.duplicates == 2
    assert report.conflicting_duplicates == ["amc_2023_3"]
    assert [r["metadata"]["problem_id"] for r in records] == ["amc_2023_0", "amc_2023_2", "amc_2023_4"]


@pytest.mark.parametrize(
    "value, expected",
    [
        ("025", "25"),
        (27.0, "27"),
        (-1.0, "-1"),
        (" 7 ", "7"),
        ("\\frac{1}{2}", "\\frac{1}{2}"),
        ("3.0", "3"),
        (12, "12"),
    ],
)
def test_canonical_answer(value, expected):
    assert canonical_answer(value) == expected


def test_row_without_answer_names_the_row():
    with pytest.raises(RowError, match=r"aime_2025 \(test\) row 1: row has no answer"):
        convert_rows([{"problem": "a", "answer": "1"}, {"problem": "b"}], "aime_2025", "test")


def test_missing_local_file_names_the_dataset_and_files(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    assert prepare.main(["--out", str(tmp_path / "out"), "--from-local", str(tmp_path / "src"), "--only", "eval"]) == 1
    err = capsys.readouterr().err
    assert "aime_2024" in err and "aime_2024.jsonl" in err and "BytedTsinghua-SIA/AIME-2024" in err


@pytest.fixture
def hub(monkeypatch):
    server = HubStandIn()
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield server
    server.close()


def _dapo_parquet_bytes(tmp_path, problems):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": DAPO_PREFIX + p + DAPO_SUFFIX}],
            "reward_model": {"ground_truth": str(2 * i), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"uuid-{i}"},
        }
        for _ in range(100)
        for i, p in enumerate(problems)  # each prompt repeated 100 times, like the raw file
    ]
    path = tmp_path / "dapo.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path.read_bytes()


def _amc_lines(answers):
    return "".join(
        json.dumps({"id": i, "question": f"AMC {i}?", "answer": a}) + "\n" for i, a in enumerate(answers)
    ).encode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_download_goes_through_huggingface_hub_and_records_commits_and_hashes(tmp_path, hub):
    """The whole download mode on huggingface_hub's own code path (repo info, tree, HEAD + GET per file,
    its cache), parquet + jsonl reading, de-duplication, and the manifest's revision / commit / sha256."""
    problems = [f"Compute {i} + {i}." for i in range(5)]
    parquet = _dapo_parquet_bytes(tmp_path, problems)
    dapo_commit = hub.push(
        "BytedTsinghua-SIA/DAPO-Math-17k", {"README.md": b"# card", "data/dapo-math-17k.parquet": parquet}
    )
    amc = _amc_lines([0.0, 1.0, 2.0, 0.0])
    amc_commit = hub.push("math-ai/amc23", {"test.jsonl": amc, ".gitattributes": b"*.jsonl"})
    out, cache = tmp_path / "out", tmp_path / "hf-cache"
    argv = ["--out", str(out), "--cache-dir", str(cache), "--datasets", "dapo_math_17k", "amc_2023"]
    assert prepare.main(argv) == 0
    train = _read_jsonl(out / "train" / "dapo_math_17k.jsonl")
    assert len(train) == 5 and [r["label"] for r in train] == ["0", "2", "4", "6", "8"]
    assert train[3]["prompt"][0]["content"] == DAPO_PREFIX + problems[3] + DAPO_SUFFIX
    assert train[3]["metadata"] == {
        "benchmark": "dapo_math_17k",
        "problem_id": "uuid-3",
        "source": "hf:BytedTsinghua-SIA/DAPO-Math-17k",
    }
    assert [r["label"] for r in _read_jsonl(out / "eval" / "amc_2023.jsonl")] == ["0", "1", "2", "0"]
    manifest = json.loads((out / "manifest.json").read_text())["datasets"]
    assert manifest["dapo_math_17k"]["duplicates_removed"] == 495
    assert (manifest["dapo_math_17k"]["revision"], manifest["dapo_math_17k"]["commit"]) == ("main", dapo_commit)
    assert manifest["dapo_math_17k"]["files"] == [
        {"path": "data/dapo-math-17k.parquet", "sha256": _sha(parquet), "bytes": len(parquet)}
    ]  # README not read
    assert manifest["amc_2023"]["commit"] == amc_commit
    assert manifest["amc_2023"]["files"] == [{"path": "test.jsonl", "sha256": _sha(amc), "bytes": len(amc)}]
    assert manifest["amc_2023"]["warnings"] == ["expected 40 prompts, got 4"]
    # the files sit in huggingface_hub's own cache layout (datasets--org--name/snapshots/<commit>/...)
    assert (cache / "datasets--math-ai--amc23" / "snapshots" / amc_commit / "test.jsonl").read_bytes() == amc
    fetched = [p for m, p in hub.requests if m == "GET" and "/resolve/" in p]
    assert sorted(fetched) == sorted(
        [
            f"/datasets/BytedTsinghua-SIA/DAPO-Math-17k/resolve/{dapo_commit}/data/dapo-math-17k.parquet",
            f"/datasets/math-ai/amc23/resolve/{amc_commit}/test.jsonl",
        ]
    )
    # a second run with the same data: the revision is resolved again, the cached file is not fetched again
    hub.requests.clear()
    assert prepare.main(argv) == 0
    assert not [p for m, p in hub.requests if m == "GET" and "/resolve/" in p]
    assert ("GET", "/api/datasets/math-ai/amc23/revision/main") in hub.requests


def test_a_file_edited_after_release_is_refused(tmp_path, hub, capsys):
    """MathArena's HMMT copy was edited after release: a changed sha256 stops the second run."""
    first = _amc_lines(["12", "7"])
    old_commit = hub.push("MathArena/hmmt_feb_2025", {"data/train.jsonl": first})
    out = tmp_path / "out"
    argv = ["--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--datasets", "hmmt_feb_2025"]
    assert prepare.main(argv) == 0
    prepared = (out / "eval" / "hmmt_feb_2025.jsonl").read_bytes()
    edited = _amc_lines(["12", "8"])
    new_commit = hub.push("MathArena/hmmt_feb_2025", {"data/train.jsonl": edited})
    capsys.readouterr()
    assert prepare.main(argv) == 1
    err = capsys.readouterr().err
    assert "hmmt_feb_2025" in err and "data/train.jsonl" in err
    assert _sha(first) in err and _sha(edited) in err
    assert f"--revision hmmt_feb_2025={old_commit}" in err and "--accept-changed hmmt_feb_2025" in err
    assert (out / "eval" / "hmmt_feb_2025.jsonl").read_bytes() == prepared  # nothing overwritten
    entry = json.loads((out / "manifest.json").read_text())["datasets"]["hmmt_feb_2025"]
    assert entry["commit"] == old_commit
    # pinning the recorded commit rebuilds the recorded data
    assert prepare.main(argv + ["--revision", f"hmmt_feb_2025={old_commit}"]) == 0
    assert (out / "eval" / "hmmt_feb_2025.jsonl").read_bytes() == prepared
    entry = json.loads((out / "manifest.json").read_text())["datasets"]["hmmt_feb_2025"]
    assert (entry["revision"], entry["commit"]) == (old_commit, old_commit)
    # accepting the change records the new file
    assert prepare.main(argv + ["--accept-changed", "hmmt_feb_2025"]) == 0
    entry = json.loads((out / "manifest.json").read_text())["datasets"]["hmmt_feb_2025"]
    assert entry["commit"] == new_commit and entry["files"][0]["sha256"] == _sha(edited)
    assert [r["label"] for r in _read_jsonl(out / "eval" / "hmmt_feb_2025.jsonl")] == ["12", "8"]


def test_a_changed_local_file_is_refused_too(tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "amc_2023.jsonl").write_bytes(_amc_lines(["1", "2"]))
    argv = ["--out", str(out), "--from-local", str(src), "--datasets", "amc_2023"]
    assert prepare.main(argv) == 0
    (src / "amc_2023.jsonl").write_bytes(_amc_lines(["1", "3"]))
    assert prepare.main(argv) == 1
    assert "amc_2023.jsonl: recorded sha256" in capsys.readouterr().err
    assert [r["label"] for r in _read_jsonl(out / "eval" / "amc_2023.jsonl")] == ["1", "2"]


def test_gated_unknown_and_missing_revision_give_the_library_reason(tmp_path, hub, capsys):
    hub.push("math-ai/aime25", {"test.jsonl": _amc_lines(["1"])}, gated=True)
    hub.push("math-ai/amc23", {"test.jsonl": _amc_lines(["1"])})
    base = ["--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")]
    assert prepare.main(base + ["--datasets", "aime_2025"]) == 1
    err = capsys.readouterr().err
    assert "GatedRepoError" in err and "HF_TOKEN" in err and "math-ai/aime25" in err
    assert "--from-local" in err and "aime_2025.jsonl" in err
    assert prepare.main(base + ["--datasets", "amc_2023", "--revision", "amc_2023=v9"]) == 1
    err = capsys.readouterr().err
    assert "RevisionNotFoundError" in err and "revision v9" in err
    assert prepare.main(base + ["--datasets", "aime_2024"]) == 1  # not on this Hub at all
    assert "RepositoryNotFoundError" in capsys.readouterr().err


@pytest.mark.parametrize(
    "value, message",
    [("amc_2023", "expected NAME=REV"), ("amc_2023=", "expected NAME=REV"), ("amc24=main", "unknown dataset 'amc24'")],
)
def test_bad_revision_flag_names_the_value(tmp_path, capsys, value, message):
    assert prepare.main(["--out", str(tmp_path), "--revision", value]) == 2
    assert message in capsys.readouterr().err


def _prepare_subprocess(argv, env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(env_extra, PYTHONPATH=REPO_ROOT)
    return subprocess.run(
        [sys.executable, "-m", "epic_slime", "prepare-data", *argv],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_offline_mode_uses_the_seeded_cache_and_explains_a_miss(tmp_path):
    """HF_HUB_OFFLINE=1 (read by the library at import: hence a fresh process): a revision in the HF
    cache is used without any request; one that is not gives the library's reason and --from-local."""
    hub = HubStandIn()
    try:
        amc = _amc_lines(["5", "6"])
        commit = hub.push("math-ai/amc23", {"test.jsonl": amc})
        seeded = _prepare_subprocess(
            ["--out", str(tmp_path / "seed"), "--datasets", "amc_2023"],
            {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf")},
        )
        assert seeded.returncode == 0, seeded.stderr[-2000:]
        hub.requests.clear()
        offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.endpoint}
        done = _prepare_subprocess(["--out", str(tmp_path / "out"), "--datasets", "amc_2023"], offline)
        assert done.returncode == 0, done.stderr[-2000:]
        assert hub.requests == []  # nothing asked of the Hub
        entry = json.loads((tmp_path / "out" / "manifest.json").read_text())["datasets"]["amc_2023"]
        assert entry["commit"] == commit and entry["files"][0]["sha256"] == _sha(amc)
        missed = _prepare_subprocess(["--out", str(tmp_path / "out"), "--datasets", "aime_2025"], offline)
        assert missed.returncode == 1 and hub.requests == []
        assert "LocalEntryNotFoundError" in missed.stderr and "HF_HUB_OFFLINE" in missed.stderr
        assert "--from-local" in missed.stderr and "math-ai/aime25" in missed.stderr
    finally:
        hub.close()


# ---------------------------------------------------------------- found by the mutation check
def test_a_file_new_to_the_manifest_is_not_a_changed_file():
    """A dataset that gains a file (a new shard) is recorded, not refused, and nothing crashes;
    a changed recorded file next to it is still refused, naming only that file."""
    spec = BY_NAME["dapo_math_17k"]
    previous = {"source": "hf:x", "commit": "c1", "files": [{"path": "a.parquet", "sha256": "1" * 64}]}
    grown = [{"path": "a.parquet", "sha256": "1" * 64}, {"path": "b.parquet", "sha256": "2" * 64}]
    prepare.check_recorded_hashes(spec, previous, "hf:x", grown, "c2")
    changed = [{"path": "a.parquet", "sha256": "3" * 64}, {"path": "b.parquet", "sha256": "2" * 64}]
    with pytest.raises(prepare.DataChangedError) as err:
        prepare.check_recorded_hashes(spec, previous, "hf:x", changed, "c2")
    assert "a.parquet: recorded sha256 " + "1" * 64 in str(err.value) and "b.parquet" not in str(err.value)


@pytest.mark.parametrize(
    "count, warnings", [(40, []), (39, ["expected 40 prompts, got 39"]), (45, ["expected 40 prompts, got 45"])]
)
def test_prompt_count_warning_fires_on_too_many_prompts_too(tmp_path, count, warnings):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "amc_2023.jsonl").write_bytes(_amc_lines([str(i) for i in range(count)]))
    assert BY_NAME["amc_2023"].expected_prompts == 40
    assert prepare.main(["--out", str(out), "--from-local", str(src), "--datasets", "amc_2023"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())["datasets"]
    assert manifest["amc_2023"]["records_out"] == count and manifest["amc_2023"]["warnings"] == warnings
