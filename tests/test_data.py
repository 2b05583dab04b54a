"""Data preparation: local conversion, template, de-duplication, download path without network."""

from __future__ import annotations

import io
import json

import time
import urllib.error

import pytest

from _eval_helpers import load_shared_rows, require_shared_math
from epic_slime.cli import main as cli_main
from epic_slime.data import DAPO_PREFIX, DAPO_SUFFIX, RowError, canonical_answer, convert_rows
from epic_slime.data import download, prepare


def _read_jsonl(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def test_from_local_converts_the_shared_files(tmp_path):
    folder = require_shared_math()
    assert cli_main(["prepare-data", "--out", str(tmp_path), "--from-local", folder]) == 0
    counts = {name: len(_read_jsonl(tmp_path / "eval" / f"{name}.jsonl"))
              for name in ("aime_2024", "aime_2025", "amc_2023", "hmmt_feb_2025")}
    assert counts == {"aime_2024": 30, "aime_2025": 30, "amc_2023": 40, "hmmt_feb_2025": 30}
    assert sum(counts.values()) == 130
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["datasets"]["amc_2023"]["records_out"] == 40
    assert all(not entry["warnings"] for entry in manifest["datasets"].values())

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


@pytest.mark.parametrize("value, expected", [("025", "25"), (27.0, "27"), (-1.0, "-1"), (" 7 ", "7"),
                                             ("\\frac{1}{2}", "\\frac{1}{2}"), ("3.0", "3"), (12, "12")])
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


def test_offline_download_fails_fast_with_a_clear_message(tmp_path, monkeypatch, capsys):
    calls = []

    def offline(url, timeout):
        calls.append((url, timeout))
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(download, "_urlopen", offline)
    start = time.monotonic()
    assert prepare.main(["--out", str(tmp_path), "--timeout", "2"]) == 1
    assert time.monotonic() - start < 2
    err = capsys.readouterr().err
    assert "dapo_math_17k" in err and "BytedTsinghua-SIA/DAPO-Math-17k" in err
    assert "--from-local" in err and "dapo_math_17k.jsonl" in err
    assert calls == [("https://huggingface.co/api/datasets/BytedTsinghua-SIA/DAPO-Math-17k", 2.0)]


class _FakeResponse(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def test_download_path_with_a_fake_hub(tmp_path, monkeypatch):
    """The whole download mode (listing, file fetch, parquet + jsonl reading, de-dup) without network."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    problems = [f"Compute {i} + {i}." for i in range(5)]
    dapo_rows = [
        {"data_source": "math_dapo",
         "prompt": [{"role": "user", "content": DAPO_PREFIX + p + DAPO_SUFFIX}],
         "reward_model": {"ground_truth": str(2 * i), "style": "rule-lighteval/MATH_v2"},
         "extra_info": {"index": f"uuid-{i}"}}
        for _ in range(100) for i, p in enumerate(problems)  # each prompt repeated 100 times, like the raw file
    ]
    parquet_path = tmp_path / "dapo.parquet"
    pq.write_table(pa.Table.from_pylist(dapo_rows), parquet_path)
    amc_lines = "".join(json.dumps({"id": i, "question": f"AMC {i % 3}?", "answer": float(i % 3)}) + "\n" for i in range(6))
    files = {
        "https://hub.test/api/datasets/BytedTsinghua-SIA/DAPO-Math-17k":
            json.dumps({"siblings": [{"rfilename": "README.md"}, {"rfilename": "data/dapo-math-17k.parquet"}]}).encode(),
        "https://hub.test/datasets/BytedTsinghua-SIA/DAPO-Math-17k/resolve/main/data/dapo-math-17k.parquet":
            parquet_path.read_bytes(),
        "https://hub.test/api/datasets/math-ai/amc23": json.dumps({"siblings": [{"rfilename": "test.jsonl"}]}).encode(),
        "https://hub.test/datasets/math-ai/amc23/resolve/main/test.jsonl": amc_lines.encode(),
    }
    requested = []

    def fake_urlopen(url, timeout):
        requested.append(url)
        if url not in files:
            raise urllib.error.HTTPError(url, 404, "not found", {}, None)
        return _FakeResponse(files[url])

    monkeypatch.setenv("HF_ENDPOINT", "https://hub.test")
    monkeypatch.setattr(download, "_urlopen", fake_urlopen)
    out = tmp_path / "out"
    assert prepare.main(["--out", str(out), "--datasets", "dapo_math_17k", "amc_2023"]) == 0
    train = _read_jsonl(out / "train" / "dapo_math_17k.jsonl")
    assert len(train) == 5 and [r["label"] for r in train] == ["0", "2", "4", "6", "8"]
    assert train[3]["prompt"][0]["content"] == DAPO_PREFIX + problems[3] + DAPO_SUFFIX
    assert train[3]["metadata"] == {"benchmark": "dapo_math_17k", "problem_id": "uuid-3", "source": "hf:BytedTsinghua-SIA/DAPO-Math-17k"}
    amc = _read_jsonl(out / "eval" / "amc_2023.jsonl")
    assert [r["label"] for r in amc] == ["0", "1", "2"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["datasets"]["dapo_math_17k"]["duplicates_removed"] == 495
    assert manifest["datasets"]["amc_2023"]["warnings"] == ["expected 40 prompts, got 3"]
    # a second run reuses the cached raw files: only the listings are fetched again
    requested.clear()
    assert prepare.main(["--out", str(out), "--datasets", "amc_2023"]) == 0
    assert requested == ["https://hub.test/api/datasets/math-ai/amc23"]
