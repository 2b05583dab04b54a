"""Entry points: scoring responses into records, evaluating a (tiny, random) HF checkpoint,
and the three-command path prepare-data -> evaluate -> report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from _eval_helpers import REPO_ROOT, require_shared_math
from epic_slime.evaluation import read_records, slime_eval_arguments
from epic_slime.evaluation.score import main as score_main


def test_score_responses_cli(tmp_path):
    rows = [
        {"response": "Answer: 025", "label": "25", "benchmark": "aime_2024", "prompt_id": "p1", "sample_idx": 0},
        {"response": "Answer: \\frac{9}{\\sqrt{23}}", "label": "\\frac{9 \\sqrt{23}}{23}", "benchmark": "hmmt_feb_2025",
         "prompt_id": "p7", "sample_idx": 0, "step": 5},
        {"response": "no idea", "label": "3", "benchmark": "amc_2023", "prompt_id": "p2", "sample_idx": 1},
    ]
    src = tmp_path / "gen.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "records.jsonl"
    assert score_main(["--responses", str(src), "--out", str(out), "--run", "r", "--method", "base",
                       "--seed", "1", "--step", "0"]) == 0
    records = read_records(str(out))
    assert [(r.benchmark, r.step, r.correct) for r in records] == [
        ("aime_2024", 0, True), ("hmmt_feb_2025", 5, True), ("amc_2023", 0, False)]
    assert score_main(["--responses", str(src), "--out", str(out)]) == 1  # no run/method/seed/step anywhere


def test_slime_eval_arguments_follow_the_paper_protocol():
    flags = slime_eval_arguments("/data")
    assert flags[flags.index("--n-samples-per-eval-prompt") + 1] == "8"
    assert flags[flags.index("--eval-temperature") + 1] == "1.0"
    assert flags[flags.index("--eval-top-p") + 1] == "0.7"
    assert flags[flags.index("--eval-interval") + 1] == "5"
    start = flags.index("--eval-prompt-data") + 1
    assert flags[start : start + 8] == ["aime_2024", "/data/eval/aime_2024.jsonl", "aime_2025", "/data/eval/aime_2025.jsonl",
                                        "amc_2023", "/data/eval/amc_2023.jsonl", "hmmt_feb_2025", "/data/eval/hmmt_feb_2025.jsonl"]


def _tiny_checkpoint(folder):
    """A random 2-layer Qwen3 with a word-level tokenizer, saved like a real checkpoint."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "<pad>", "<eos>", "Answer:", "1", "2", "3", "the", "is", "\\boxed{1}"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>",
                                                eos_token="<eos>")
    config = transformers.Qwen3Config(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                      max_position_embeddings=512, eos_token_id=2, pad_token_id=1)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)


@pytest.mark.slow
def test_three_commands_prepare_evaluate_report(tmp_path):
    """The new-user path on a tiny random model: prepare-data, eval/evaluate.py, epic-slime report."""
    shared = require_shared_math()
    model_dir = tmp_path / "model"
    _tiny_checkpoint(model_dir)
    data, records, report = tmp_path / "data", tmp_path / "records.jsonl", tmp_path / "report"
    env_python = [sys.executable]
    commands = [
        env_python + ["-m", "epic_slime", "prepare-data", "--out", str(data), "--from-local", shared, "--only", "eval"],
        env_python + ["eval/evaluate.py", "--model", str(model_dir), "--data", str(data), "--out", str(records),
                      "--run", "tiny-s1", "--method", "tiny", "--seed", "1", "--step", "0", "--max-prompts", "2",
                      "--samples-per-prompt", "2", "--max-new-tokens", "4", "--device", "cpu"],
        env_python + ["-m", "epic_slime", "report", "--records", str(records), "--out", str(report), "--no-plots"],
    ]
    for command in commands:
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (command, done.stdout, done.stderr[-3000:])
    got = read_records(str(records))
    assert len(got) == 4 * 2 * 2  # 4 benchmarks x 2 prompts x 2 samples
    assert {r.sample_idx for r in got} == {0, 1}
    table = (report / "table1.md").read_text()
    assert "| tiny |" in table
