"""eval/*.py: entry points into the installed package, runnable from any folder, with no sys.path edits."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO_ROOT / "eval").glob("*.py"))


def edits_sys_path(source: str) -> list[int]:
    """Line numbers where the source reads or changes sys.path (``sys.path.insert``, ``sys.path[...]``, ...)."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _run(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    # The checkout's package first, as an installed one would be (the venv may hold another checkout).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_path_scan_finds_an_edit():
    assert edits_sys_path("import os, sys\nx = 1\nsys.path.insert(0, os.getcwd())\n") == [3]
    assert edits_sys_path("import sys\nprint(sys.argv)\n") == []


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_eval_script_edits_sys_path(script):
    assert edits_sys_path(script.read_text()) == []


@pytest.mark.parametrize("name", ["evaluate.py", "report.py", "score_responses.py"])
def test_eval_script_help_runs_from_another_folder(name, tmp_path):
    done = _run(REPO_ROOT / "eval" / name, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout and "--out" in done.stdout


def test_slime_eval_flags_prints_the_flags_or_its_usage(tmp_path):
    done = _run(REPO_ROOT / "eval" / "slime_eval_flags.py", "/data", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--eval-prompt-data aime_2024 /data/eval/aime_2024.jsonl" in done.stdout
    usage = _run(REPO_ROOT / "eval" / "slime_eval_flags.py", cwd=tmp_path)
    assert usage.returncode == 2 and "python eval/slime_eval_flags.py DATA_DIR" in usage.stderr
