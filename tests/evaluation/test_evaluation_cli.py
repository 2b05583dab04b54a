"""Entry points: scoring responses into records, evaluating a (tiny, random) HF checkpoint,
and the three-command path prepare-data -> evaluate -> report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.eval_helpers import BENCHMARK_FILES, REPO_ROOT, require_shared_math, save_tiny_checkpoint, write_eval_data
from support.sglang_engine_standin import make_sglang_module
from epic_slime.evaluation import read_records, slime_eval_arguments
from epic_slime.evaluation.evaluate import main as evaluate_main
from epic_slime.evaluation.score import main as score_main


def test_score_responses_cli(tmp_path):
    rows = [
        {"response": "Answer: 025", "label": "25", "benchmark": "aime_2024", "prompt_id": "p1", "sample_idx": 0},
        {
            "response": "Answer: \\frac{9}{\\sqrt{23}}",
            "label": "\\frac{9 \\sqrt{23}}{23}",
            "benchmark": "hmmt_feb_2025",
            "prompt_id": "p7",
            "sample_idx": 0,
            "step": 5,
        },
        {"response": "no idea", "label": "3", "benchmark": "amc_2023", "prompt_id": "p2", "sample_idx": 1},
    ]
    src = tmp_path / "gen.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "records.jsonl"
    assert (
        score_main(
            ["--responses", str(src), "--out", str(out), "--run", "r", "--method", "base", "--seed", "1", "--step", "0"]
        )
        == 0
    )
    records = read_records(str(out))
    assert [(r.benchmark, r.step, r.correct) for r in records] == [
        ("aime_2024", 0, True),
        ("hmmt_feb_2025", 5, True),
        ("amc_2023", 0, False),
    ]
    assert score_main(["--responses", str(src), "--out", str(out)]) == 1  # no run/method/seed/step anywhere


def test_slime_eval_arguments_follow_the_paper_protocol():
    flags = slime_eval_arguments("/data")
    assert flags[flags.index("--n-samples-per-eval-prompt") + 1] == "8"
    assert flags[flags.index("--eval-temperature") + 1] == "1.0"
    assert flags[flags.index("--eval-top-p") + 1] == "0.7"
    assert flags[flags.index("--eval-interval") + 1] == "5"
    start = flags.index("--eval-prompt-data") + 1
    assert flags[start : start + 8] == [
        "aime_2024",
        "/data/eval/aime_2024.jsonl",
        "aime_2025",
        "/data/eval/aime_2025.jsonl",
        "amc_2023",
        "/data/eval/amc_2023.jsonl",
        "hmmt_feb_2025",
        "/data/eval/hmmt_feb_2025.jsonl",
    ]


@pytest.mark.slow
def test_three_commands_prepare_evaluate_report(tmp_path):
    """The new-user path on a tiny random model: prepare-data, eval/evaluate.py, epic-slime report."""
    shared = require_shared_math()
    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)
    data, records, report = tmp_path / "data", tmp_path / "records.jsonl", tmp_path / "report"
    env_python = [sys.executable]
    commands = [
        env_python + ["-m", "epic_slime", "prepare-data", "--out", str(data), "--from-local", shared, "--only", "eval"],
        env_python
        + [
            "eval/evaluate.py",
            "--model",
            str(model_dir),
            "--data",
            str(data),
            "--out",
            str(records),
            "--run",
            "tiny-s1",
            "--method",
            "tiny",
            "--seed",
            "1",
            "--step",
            "0",
            "--max-prompts",
            "2",
            "--samples-per-prompt",
            "2",
            "--max-new-tokens",
            "4",
            "--engine",
            "transformers",
            "--device",
            "cpu",
        ],
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


def _answer_every_other(answers):
    """Stand-in replies: the right answer on even requests, a wrong one on odd ones."""

    def respond(prompt, index):
        (label,) = [a for problem, a in answers.items() if problem in prompt]
        return f"Let me think.\nAnswer: {label if index % 2 == 0 else 'no'}"

    return respond


def test_evaluate_drives_sglang_engine_through_its_interface(tmp_path, monkeypatch):
    """--engine sglang on CPU: sglang.Engine is a stand-in with 0.5.15.post1's interface."""
    pytest.importorskip("transformers")
    model = tmp_path / "model"
    save_tiny_checkpoint(model)
    answers = write_eval_data(tmp_path / "data")
    fake = make_sglang_module(_answer_every_other(answers))
    monkeypatch.setitem(sys.modules, "sglang", fake)
    out = tmp_path / "records.jsonl"
    argv = [
        "--model",
        str(model),
        "--data",
        str(tmp_path / "data"),
        "--out",
        str(out),
        "--run",
        "ckpt-s3",
        "--method",
        "epic",
        "--seed",
        "3",
        "--step",
        "120",
        "--engine",
        "sglang",
        "--tp-size",
        "2",
    ]
    assert evaluate_main(argv) == 0
    (engine,) = fake.engines
    assert engine.server_args == {"model_path": str(model), "tp_size": 2, "random_seed": 3}
    assert engine.shut_down
    (call,) = engine.calls  # 8 prompts x 8 samples fit one chunk
    # the paper's sampling by default
    assert call["sampling_params"] == [{"temperature": 1.0, "top_p": 0.7, "max_new_tokens": 8192}] * 64
    # the chat template applied (independently: the template's own rendering), each prompt k = 8 times
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(model)  # the exported tokenizer loads (its template is checked below)
    expected = []
    for benchmark in BENCHMARK_FILES:
        for line in (tmp_path / "data" / "eval" / f"{benchmark}.jsonl").read_text().splitlines():
            content = json.loads(line)["prompt"][0]["content"]
            expected += [f"<user> {content} <assistant>"] * 8
    assert call["prompt"] == expected
    records = read_records(str(out))
    assert len(records) == 4 * 2 * 8
    assert {(r.run, r.method, r.seed, r.step) for r in records} == {("ckpt-s3", "epic", 3, 120)}
    assert all(r.correct == (r.sample_idx % 2 == 0) for r in records)  # even requests answered right
    assert [r.sample_idx for r in records[:8]] == list(range(8))
    # the authors' re-evaluation protocol: 32 samples, top-p 1.0 on request
    out32 = tmp_path / "reeval.jsonl"
    assert (
        evaluate_main(
            argv[:5] + [str(out32)] + argv[6:] + ["--reeval-protocol", "--top-p", "1.0", "--max-prompts", "1"]
        )
        == 0
    )
    engine = fake.engines[-1]
    assert {tuple(sorted(p.items())) for c in engine.calls for p in c["sampling_params"]} == {
        (("max_new_tokens", 8192), ("temperature", 1.0), ("top_p", 1.0))
    }
    assert len(read_records(str(out32))) == 4 * 32


def test_evaluate_shuts_sglang_down_on_failure_and_checks_its_output(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    model = tmp_path / "model"
    save_tiny_checkpoint(model)
    write_eval_data(tmp_path / "data", prompts=1)
    argv = [
        "--model",
        str(model),
        "--data",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "r.jsonl"),
        "--run",
        "r",
        "--method",
        "m",
        "--seed",
        "1",
        "--step",
        "0",
        "--engine",
        "sglang",
    ]

    def broken(prompt, index):
        raise RuntimeError("CUDA error: out of memory")

    fake = make_sglang_module(broken)
    monkeypatch.setitem(sys.modules, "sglang", fake)
    with pytest.raises(RuntimeError, match="out of memory"):
        evaluate_main(argv)
    assert fake.engines[0].shut_down  # GPU processes released even when generation fails

    fake = make_sglang_module(lambda prompt, index: 42)  # not text
    monkeypatch.setitem(sys.modules, "sglang", fake)
    assert evaluate_main(argv) == 1
    assert "output without a 'text' string" in capsys.readouterr().err and fake.engines[0].shut_down
    assert not (tmp_path / "r.jsonl").exists()
    assert evaluate_main(argv + ["--top-p", "0"]) == 2
    assert "--top-p must be in (0, 1]" in capsys.readouterr().err


def test_evaluate_on_sglangs_cpu_engine_passes_its_cpu_server_args(tmp_path, monkeypatch, capsys):
    """--engine sglang --device cpu: SGLang's CPU engine switched on before sglang is imported, and the
    server args it needs without the kernel package (tests/evaluation/test_evaluate_real_sglang.py runs
    them on the real sglang.Engine)."""
    pytest.importorskip("transformers")
    model = tmp_path / "model"
    save_tiny_checkpoint(model)
    answers = write_eval_data(tmp_path / "data", prompts=1)
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "0")
    fake = make_sglang_module(_answer_every_other(answers))
    monkeypatch.setitem(sys.modules, "sglang", fake)
    argv = [
        "--model",
        str(model),
        "--data",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "r.jsonl"),
        "--run",
        "r",
        "--method",
        "m",
        "--seed",
        "4",
        "--step",
        "0",
        "--engine",
        "sglang",
        "--samples-per-prompt",
        "2",
    ]
    assert evaluate_main(argv + ["--device", "cpu"]) == 0
    assert fake.engines[0].server_args == {
        "model_path": str(model),
        "tp_size": 1,
        "random_seed": 4,
        "device": "cpu",
        "attention_backend": "torch_native",
        "sampling_backend": "pytorch",
        "disable_overlap_schedule": True,
        "cuda_graph_backend_decode": "disabled",
        "cuda_graph_backend_prefill": "disabled",
        "max_total_tokens": 4096,
        "mem_fraction_static": 0.05,
    }
    import os

    assert os.environ["SGLANG_USE_CPU_ENGINE"] == "1"
    assert evaluate_main(argv + ["--device", "cpu", "--mem-fraction-static", "0.2"]) == 0
    assert fake.engines[1].server_args["mem_fraction_static"] == 0.2
    assert evaluate_main(argv + ["--device", "mps"]) == 1
    assert "--engine sglang runs on cuda or cpu, got --device 'mps'" in capsys.readouterr().err
