"""The README's two commands in one checkout: command 1 fills runs/local-default, then command 2
(`bash .ci/run`) must pass. So no test may read or write the checkout's runs/, CI runs the suite with
that folder occupied, a bad config value is named before a taken folder, and the SGLang venv is built
without the project on its path."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from epic_slime.runtime.cli import train_main
from epic_slime.runtime.config import FIELDS, parse_config
from epic_slime.runtime.run_files import RUN_FILES, RunFolderTaken, check_output_dir, existing_run
from support.occupied_run import occupy

REPO = Path(__file__).resolve().parents[2]
CI_RUN = REPO / ".ci" / "run"
DEFAULT_RUN = FIELDS["output_dir"].default  # runs/local-default: where command 1's run goes


def _ci_lines() -> list[str]:
    return [ln.strip() for ln in CI_RUN.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_the_stand_in_run_is_refused_as_a_finished_run_is(tmp_path):
    folder = tmp_path / "runs" / "local-default"
    assert occupy(folder) is True
    assert occupy(folder) is False  # a folder already there (a user's real run) is left as it is
    cfg = parse_config(["--output-dir", str(folder)], quick=True)
    assert sorted(p.name for p in existing_run(cfg)) == sorted([*RUN_FILES, "checkpoints"])
    with pytest.raises(RunFolderTaken, match=rf"--output-dir {folder} already holds a run .*--load .*--overwrite"):
        check_output_dir(cfg, None)


def test_ci_runs_the_suite_with_the_default_run_folder_occupied():
    lines = _ci_lines()
    suite = lines.index("python -m pytest -q --durations=15")
    (occupied,) = [i for i, ln in enumerate(lines) if "tests/support/occupied_run.py" in ln]
    assert occupied < suite and f"occupied_run.py {DEFAULT_RUN})" in lines[occupied], lines[occupied]
    # removed after only when CI wrote it, and a write under runs/ during the suite fails the run
    (cleanup,) = [ln for ln in lines if ln.startswith('if [ "$made_default_run" = created ]')]
    assert f"rm -rf {DEFAULT_RUN}" in cleanup and "trap" in cleanup
    assert any(ln.startswith('written="$(find runs -newer "$suite_start"') for ln in lines[suite:])


def test_the_sglang_venv_is_built_without_the_project_on_pythonpath(tmp_path):
    """The line of .ci/run that builds the venv, run with the checkout exported on PYTHONPATH as CI has
    it by then, and the build script replaced by one that reports the PYTHONPATH it was given."""
    (line,) = [ln for ln in _ci_lines() if "sglang_venv.sh" in ln]
    stub = tmp_path / "sglang_venv.sh"
    stub.write_text('echo "PYTHONPATH=${PYTHONPATH-unset}"\n')
    script = f"set -euo pipefail\nexport PYTHONPATH={REPO}\n{line.replace('.ci/sglang_venv.sh', str(stub))}\n"
    script += 'echo "$EPIC_SLIME_SGLANG_PYTHON"\n'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "PYTHONPATH=unset", done.stdout


def _bad_yaml(tmp_path) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text("epic_delta_low: 0\n")
    return str(path)


@pytest.mark.parametrize("where", ["yaml", "flag"])
def test_a_bad_loss_value_is_named_before_a_taken_default_folder(tmp_path, monkeypatch, capsys, where):
    """After command 1 the default folder is taken; a bad value must still be the error shown."""
    monkeypatch.chdir(tmp_path)  # the default folder is relative: here it is tmp_path's, not the checkout's
    occupy(tmp_path / DEFAULT_RUN)
    argv = ["--config", _bad_yaml(tmp_path)] if where == "yaml" else ["--epic-delta-low", "0"]
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    assert "delta_low=0" in err and "already holds" not in err, err


@pytest.mark.parametrize("argv", [[], ["--epic-delta-low", "1e-3"]], ids=["defaults", "a good loss value"])
def test_a_good_config_still_gets_the_taken_folder_refusal(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    occupy(tmp_path / DEFAULT_RUN)
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    assert re.match(rf"epic-slime train: error: --output-dir {DEFAULT_RUN} already holds a run", err), err
