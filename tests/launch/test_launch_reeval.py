"""launch/reeval.sh: the 32-sample re-evaluation of a run's selected checkpoint (dry run: the exact
commands; a real run on CPU with the transformers engine on a tiny checkpoint)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from support.eval_helpers import REPO_ROOT, save_tiny_checkpoint, write_eval_data
from epic_slime.evaluation import read_records

SCRIPT = os.path.join(REPO_ROOT, "launch", "reeval.sh")


def _run(args, env_extra=None):
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=REPO_ROOT, **(env_extra or {}))
    return subprocess.run(["bash", SCRIPT, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


def _selection(tmp_path):
    path = tmp_path / "selection.json"
    path.write_text(
        json.dumps(
            {
                "epic": {"epic-s1": {"seed": 1, "step": 120}, "epic-s2": {"seed": 2, "step": 80}},
                "grpo": {"grpo-s1": {"seed": 1, "step": 40}},
            }
        )
    )
    return path


def test_dry_run_prints_both_top_p_passes_for_the_selected_step(tmp_path):
    done = _run(["--run", "epic-s2", "--selection", str(_selection(tmp_path)), "--dry-run"])
    assert done.returncode == 0, done.stderr
    commands = [shlex.split(line) for line in done.stdout.splitlines() if line.strip()]
    evaluates = [c for c in commands if c[1:4] == ["-m", "epic_slime", "evaluate"]]
    reports = [c for c in commands if c[1:4] == ["-m", "epic_slime", "report"]]
    assert len(evaluates) == 2 and len(reports) == 2
    for command, top_p in zip(evaluates, ("0.7", "1.0")):
        flag = {command[i]: command[i + 1] for i in range(4, len(command) - 1) if command[i].startswith("--")}
        assert flag["--model"] == "/root/checkpoints/epic-s2_hf/iter_0000080"
        assert (flag["--run"], flag["--method"], flag["--seed"], flag["--step"]) == ("epic-s2", "epic", "2", "80")
        assert (flag["--top-p"], flag["--temperature"], flag["--engine"], flag["--tp-size"]) == (
            top_p,
            "1.0",
            "sglang",
            "8",
        )
        assert "--reeval-protocol" in command
        assert flag["--out"] == f"/root/reeval/epic-s2/reeval_topp{top_p}.jsonl"
    assert all("--reeval-protocol" in c for c in reports)
    assert done.stdout.splitlines()[-1] == "# dry run (DRY_RUN=1): nothing was run; the commands above are only printed"


def test_bad_input_is_named(tmp_path):
    done = _run(["--run", "nobody", "--selection", str(_selection(tmp_path)), "--dry-run"])
    assert done.returncode == 2 and "run 'nobody' is not in" in done.stderr
    done = _run(["--run", "x", "--method", "m", "--seed", "1", "--steps", "5,abc", "--dry-run"])
    assert done.returncode == 2 and "'abc' is not a step number" in done.stderr
    done = _run(
        [
            "--run",
            "x",
            "--method",
            "m",
            "--seed",
            "1",
            "--steps",
            "5",
            "--out-dir",
            str(tmp_path / "o"),
            "--ckpt-pattern",
            str(tmp_path / "missing_%d"),
        ]
    )
    assert done.returncode == 2 and "no Hugging Face checkpoint at" in done.stderr


@pytest.mark.slow
def test_reeval_runs_end_to_end_on_cpu(tmp_path):
    pytest.importorskip("transformers")
    save_tiny_checkpoint(tmp_path / "ckpt_7")
    write_eval_data(tmp_path / "data", prompts=1)
    out = tmp_path / "reeval"
    done = _run(
        [
            "--run",
            "tiny-s1",
            "--method",
            "tiny",
            "--seed",
            "1",
            "--steps",
            "7",
            "--engine",
            "transformers",
            "--ckpt-pattern",
            str(tmp_path / "ckpt_%d"),
            "--data-dir",
            str(tmp_path / "data"),
            "--out-dir",
            str(out),
            "--top-ps",
            "1.0",
            "--",
            "--max-new-tokens",
            "3",
            "--device",
            "cpu",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_records(str(out / "reeval_topp1.0.jsonl"))
    assert len(records) == 4 * 32 and {r.step for r in records} == {7}
    table = (out / "report_topp1.0" / "table1.md").read_text()
    assert "| tiny |" in table and "aime_2024 k=32" in table and "amc_2023 k=16" in table
    again = _run(
        [
            "--run",
            "tiny-s1",
            "--method",
            "tiny",
            "--seed",
            "1",
            "--steps",
            "7",
            "--out-dir",
            str(out),
            "--top-ps",
            "1.0",
            "--ckpt-pattern",
            str(tmp_path / "ckpt_%d"),
        ]
    )
    assert again.returncode == 2 and "exists" in again.stderr
