"""Shared helpers for the reward / data / evaluation tests."""

from __future__ import annotations

import json
import os

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/support/ -> repo
SHARED_MATH = os.path.join(REPO_ROOT, "..", "shared", "data", "math")
BENCHMARK_FILES = ("aime_2024", "aime_2025", "amc_2023", "hmmt_feb_2025")


def require_shared_math() -> str:
    """Path of ../shared/data/math, or skip the test (the shared data is not in the repo)."""
    if not os.path.isfile(os.path.join(SHARED_MATH, "aime_2024.jsonl")):
        pytest.skip(f"shared math data not found at {os.path.abspath(SHARED_MATH)}")
    return SHARED_MATH


def load_shared_rows(name: str) -> list[dict]:
    with open(os.path.join(require_shared_math(), f"{name}.jsonl")) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def run_config_yaml(path: str, records_path: str, run_name: str, method: str | None = None) -> str:
    """The run identity file the launchers hand to ``--custom-config-path`` (launch/_submit.sh's
    ``run_config_yaml``): top-level keys slime sets on ``args``, read by the eval-record hook."""
    lines = [f"epic_run_name: {json.dumps(run_name)}", f"epic_eval_records_path: {json.dumps(records_path)}"]
    if method is not None:
        lines.append(f"epic_method: {json.dumps(method)}")
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


def report_on_records(records_path: str, out_dir: str) -> dict:
    """``epic-slime report`` on one records file, as the CLI runs it (``report.main``), over the
    benchmarks the file holds; fails the test with the report's own error when it refuses.

    Returns ``{"selection": selection.json, "records_per_step": {run: {step: count}}}`` so a caller
    can check that every evaluated step holds exactly one record set.
    """
    import contextlib
    import io
    from collections import Counter

    from epic_slime.evaluation.records import read_records
    from epic_slime.evaluation.report import main as report_main

    records = read_records(records_path)
    assert records, f"no eval records in {records_path}"
    benchmarks = sorted({r.benchmark for r in records})
    argv = ["--records", records_path, "--out", out_dir, "--benchmarks", *benchmarks, "--bootstrap", "0", "--no-plots"]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        rc = report_main(argv)
    assert rc == 0, f"epic-slime report {' '.join(argv)} refused the records: {stderr.getvalue().strip()}"
    with open(os.path.join(out_dir, "selection.json")) as handle:
        selection = json.load(handle)
    per_step: dict[str, Counter] = {}
    for record in records:
        per_step.setdefault(record.run, Counter())[record.step] += 1
    return {"selection": selection, "records_per_step": {run: dict(sorted(c.items())) for run, c in per_step.items()}}


def save_tiny_checkpoint(folder):
    """A random 2-layer Qwen3 with a word-level tokenizer, saved like a real checkpoint."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "<pad>", "<eos>", "Answer:", "1", "2", "3", "the", "is", "\\boxed{1}"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )
    fast.chat_template = "{% for m in messages %}<user> {{ m['content'] }} {% endfor %}<assistant>"
    config = transformers.Qwen3Config(
        vocab_size=len(words),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=512,
        eos_token_id=2,
        pad_token_id=1,
    )
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)


def write_eval_data(folder, prompts=2):
    """Prepared-data layout: DIR/eval/<benchmark>.jsonl, answers 10 * b + p."""
    from epic_slime.data.convert import convert_rows
    from epic_slime.data.files import write_jsonl

    answers = {}
    for b, benchmark in enumerate(BENCHMARK_FILES):
        rows = [{"problem": f"Problem {benchmark} number {p}.", "answer": str(10 * b + p)} for p in range(prompts)]
        records, _ = convert_rows(rows, benchmark, "test")
        write_jsonl(str(folder / "eval" / f"{benchmark}.jsonl"), records)
        answers.update({row["problem"]: row["answer"] for row in rows})
    return answers
