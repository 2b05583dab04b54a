"""``epic-slime evaluate --engine sglang --device cpu`` on SGLang 0.5.15.post1's own offline engine
(``sglang.Engine``, its CPU engine), end to end: the tiny checkpoint, the authors' re-evaluation protocol
(32 samples per prompt) at both of their top-p settings (0.7 and 1.0), scored into eval records; and the
same command on the ``sglang.Engine`` stand-in (tests/support/sglang_engine_standin.py), compared.

On a GPU machine SGLang is installed beside the project and ``evaluate`` imports it in its own process.
Here SGLang lives in its own venv (torch 2.14.1, transformers 5.12.1; tests/support/real_sglang.py), so the
test runs the command there, with the repository on ``PYTHONPATH``. That venv pins only SGLang's
packages: the scorer's pure-Python dependencies that it lacks (math-verify and its latex2sympy2 and antlr4
runtime; sympy 1.14 is in both) are linked from the project's venv into a folder on the path, and the
test names each one it linked."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from support import real_sglang
from support.eval_helpers import REPO_ROOT, save_tiny_checkpoint, write_eval_data
from support.sglang_engine_standin import make_sglang_module

TOP_PS = ("0.7", "1.0")
SAMPLES = 32  # --reeval-protocol
MAX_NEW_TOKENS = 8
# the scorer's imports the SGLang venv does not pin (module name -> the project venv's copy)
SCORER_MODULES = ("math_verify", "latex2sympy2_extended", "antlr4")


def _sglang_python() -> str:
    python = real_sglang.sglang_python()
    if python is None:
        if real_sglang.required():
            pytest.fail(f"{real_sglang.REQUIRE_ENV}=1 and {real_sglang.unavailable_reason()}", pytrace=False)
        pytest.skip(real_sglang.unavailable_reason())
    return python


def _missing_in(python: str, modules) -> list[str]:
    probe = (
        "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    )
    done = subprocess.run(
        [python, "-c", probe, *modules],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def _overlay(python: str, folder: Path) -> list[str]:
    """Links the project's copies of the scorer modules the SGLang venv lacks, with their distributions'
    metadata (latex2sympy2 checks the antlr4 runtime's version); returns the module names."""
    missing = _missing_in(python, SCORER_MODULES)
    folder.mkdir()
    owners = importlib.metadata.packages_distributions()
    for name in missing:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin, f"the project's venv has no {name}"
        package = Path(spec.origin).parent
        (folder / name).symlink_to(package, target_is_directory=True)
        for dist in owners.get(name, []):
            canonical = re.sub(r"[-_.]+", "_", dist).lower()
            for info in package.parent.glob("*.dist-info"):
                if info.name.lower().startswith(canonical + "-"):
                    (folder / info.name).symlink_to(info, target_is_directory=True)
    return missing


def _argv(model, data, out, top_p):
    return [
        "--model",
        str(model),
        "--data",
        str(data),
        "--out",
        str(out),
        "--run",
        "tiny-s1",
        "--method",
        "tiny",
        "--seed",
        "1",
        "--step",
        "0",
        "--engine",
        "sglang",
        "--device",
        "cpu",
        "--reeval-protocol",
        "--top-p",
        top_p,
        "--max-new-tokens",
        str(MAX_NEW_TOKENS),
    ]


def _mean_at_k(records) -> dict[str, float]:
    by_prompt: dict = {}
    for r in records:
        by_prompt.setdefault((r.benchmark, r.prompt_id), []).append(r.correct)
    per_benchmark: dict = {}
    for (benchmark, _), hits in by_prompt.items():
        per_benchmark.setdefault(benchmark, []).append(sum(hits) / len(hits))
    return {b: sum(v) / len(v) for b, v in sorted(per_benchmark.items())}


@pytest.mark.slow
def test_evaluate_runs_on_sglangs_own_engine_and_matches_the_standins_protocol(tmp_path, monkeypatch):
    from epic_slime.evaluation import read_records
    from epic_slime.evaluation.evaluate import main as evaluate_main
    from epic_slime.runtime.task import Tokenizer  # noqa: F401 - the project imports before the subprocess

    python = _sglang_python()
    model, data = tmp_path / "model", tmp_path / "data"
    save_tiny_checkpoint(model)
    answers = write_eval_data(data)
    linked = _overlay(python, tmp_path / "scorer_deps")
    print(f"linked from the project's venv into the SGLang venv's path: {linked or 'nothing'}")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([REPO_ROOT, str(tmp_path / "scorer_deps")]),
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    real = {}
    for top_p in TOP_PS:
        out = tmp_path / f"real_topp{top_p}.jsonl"
        done = subprocess.run(
            [python, "-m", "epic_slime", "evaluate", *_argv(model, data, out, top_p)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
        assert f"8 prompts x {SAMPLES} samples on sglang (temperature 1.0, top-p {top_p})" in done.stdout
        real[top_p] = read_records(str(out))

    # the stand-in, same command and checkpoint, in this process: every other request answered right
    def respond(prompt, index):
        (label,) = [a for problem, a in answers.items() if problem in prompt]
        return f"Answer: {label if index % 2 == 0 else 'no'}"

    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "0")  # SGLangEngine sets it for --device cpu; restored after
    standin = {}
    for top_p in TOP_PS:
        fake = make_sglang_module(respond)
        monkeypatch.setitem(sys.modules, "sglang", fake)
        out = tmp_path / f"standin_topp{top_p}.jsonl"
        assert evaluate_main(_argv(model, data, out, top_p)) == 0
        (engine,) = fake.engines
        assert engine.server_args["device"] == "cpu" and engine.server_args["attention_backend"] == "torch_native"
        assert {p["top_p"] for c in engine.calls for p in c["sampling_params"]} == {float(top_p)}
        standin[top_p] = read_records(str(out))

    for top_p in TOP_PS:
        got, ref = real[top_p], standin[top_p]
        # the same prompts, each 32 times, the same record keys: only the answers differ
        key = lambda r: (r.benchmark, r.prompt_id, r.sample_idx, r.run, r.method, r.seed, r.step)  # noqa: E731
        assert len(got) == 4 * 2 * SAMPLES and sorted(map(key, got)) == sorted(map(key, ref))
        assert _mean_at_k(ref) == {b: 0.5 for b in _mean_at_k(ref)}  # the stand-in's script
        scores = _mean_at_k(got)
        # the random tiny model writes words of its 10-word vocabulary (labels 0-31; "1" is one word, and
        # "\\boxed{1}"): far from the script's 0.5 on every benchmark
        correct = Counter(f"{r.benchmark}/{r.prompt_id}" for r in got if r.correct)
        assert all(v < 0.5 for v in scores.values()), (scores, correct)
        print(
            f"top-p {top_p}: real sglang.Engine mean@{SAMPLES} {json.dumps(scores)}; correct samples {dict(correct)}; "
            f"stand-in {json.dumps(_mean_at_k(ref))}"
        )
