"""ruff keeps the format and the lint (pyproject.toml's [tool.ruff]); .ci/run fails on an unused import or
an unformatted file before the suite runs."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUFF = shutil.which("ruff")
needs_ruff = pytest.mark.skipif(RUFF is None, reason="ruff is not installed (the test extra pins it)")


def test_ruff_is_pinned_and_ci_runs_it_before_the_suite():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("ruff==") for r in extras["test"])
    script = (REPO / ".ci" / "run").read_text()
    lines = [line.strip() for line in script.splitlines()]
    check, fmt = lines.index("ruff check ."), lines.index("ruff format --check .")
    suite = next(i for i, line in enumerate(lines) if line.startswith("python -m pytest"))
    assert "set -euo pipefail" in script and check < suite and fmt < suite  # a finding stops the run


def _ruff(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RUFF, *args, "--config", str(REPO / "pyproject.toml"), "."], cwd=cwd, capture_output=True, text=True
    )


@needs_ruff
def test_the_projects_settings_refuse_an_unused_import_and_an_unformatted_file(tmp_path):
    (tmp_path / "clean.py").write_text('import os\n\nprint(os.sep, "x")\n')
    assert _ruff("check", cwd=tmp_path).returncode == 0
    assert _ruff("format", "--check", cwd=tmp_path).returncode == 0
    (tmp_path / "unused.py").write_text("import os\n")
    found = _ruff("check", cwd=tmp_path)
    assert found.returncode == 1 and "F401" in found.stdout
    (tmp_path / "unused.py").unlink()
    (tmp_path / "messy.py").write_text("x = {'a':1}\n")
    assert _ruff("format", "--check", cwd=tmp_path).returncode == 1


@needs_ruff
def test_the_tree_is_clean():
    for args in (("check",), ("format", "--check")):
        done = _ruff(*args, cwd=REPO)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
