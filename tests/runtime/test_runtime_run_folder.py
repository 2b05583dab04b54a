"""The embedded runtime's run folder and resume checks: a run directory never mixes two runs (refused,
cleared by --overwrite, kept by --load), a checkpoint of another config or of a finished run is refused,
and config.json records resolved defaults and versions. No Ray: these run in seconds."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from support.runtime_helpers import tiny_config
from epic_slime.provenance import versions
from epic_slime.runtime.checkpoint import resume_differences
from epic_slime.runtime.config import ConfigError
from epic_slime.runtime.driver import Run
from epic_slime.runtime.run_files import prepare_output_dir


def _old_run(out: Path) -> None:
    (out / "checkpoints" / "step_000002").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "reward.png").write_bytes(b"png")
    (out / "notes.txt").write_text("mine")


def test_existing_run_directory_is_refused_naming_the_folder(tmp_path):
    cfg = tiny_config(tmp_path)
    prepare_output_dir(cfg, None)  # a fresh directory is fine
    _old_run(Path(cfg.output_dir))
    with pytest.raises(ConfigError, match=rf"--output-dir {cfg.output_dir} already holds a run .*--load .*--overwrite"):
        prepare_output_dir(cfg, None)
    prepare_output_dir(cfg, Path(cfg.output_dir) / "checkpoints" / "step_000002")  # resuming: allowed


def test_overwrite_clears_only_the_old_runs_files(tmp_path):
    cfg = tiny_config(tmp_path, "--overwrite")
    out = Path(cfg.output_dir)
    _old_run(out)
    prepare_output_dir(cfg, None)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # metrics, plots, checkpoints gone
    _old_run_again = out / "checkpoints" / "step_000004"
    _old_run_again.mkdir(parents=True)
    with pytest.raises(ConfigError, match="--overwrite would delete the checkpoint"):
        prepare_output_dir(tiny_config(tmp_path, "--overwrite", "--load", str(out / "checkpoints")), _old_run_again)


def test_cli_refuses_a_rerun_into_an_existing_run(tmp_path, capsys):
    from epic_slime.runtime.cli import train_main
    from support.runtime_helpers import TINY_FLAGS

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    assert train_main([*TINY_FLAGS, "--output-dir", str(out)]) == 2
    assert f"--output-dir {out} already holds a run" in capsys.readouterr().err


# mutant: runfiles_resume_clears_run (fresh_pass.yaml)
def test_resuming_keeps_the_earlier_runs_files_and_overwrite_clears_them(tmp_path):
    """prepare_output_dir with --load (no --overwrite) changes nothing: the resumed run appends to its
    metrics; only --overwrite (without --load) clears the earlier run's own files."""
    from epic_slime.runtime.config import parse_config
    from epic_slime.runtime.run_files import METRICS_FILE, SUMMARY_FILE, prepare_output_dir

    out = tmp_path / "run"
    ckpt = out / "checkpoints" / "step_2"
    ckpt.mkdir(parents=True)
    (out / METRICS_FILE).write_text('{"step": 1}\n{"step": 2}\n')
    (out / SUMMARY_FILE).write_text("{}")
    other = out / "notes.txt"
    other.write_text("mine")
    cfg = parse_config(["--output-dir", str(out), "--load", str(ckpt)])
    prepare_output_dir(cfg, resume_path=ckpt)
    assert (out / METRICS_FILE).read_text() == '{"step": 1}\n{"step": 2}\n' and (out / SUMMARY_FILE).exists()
    prepare_output_dir(parse_config(["--output-dir", str(out), "--overwrite"]), resume_path=None)
    assert not (out / METRICS_FILE).exists() and not (out / SUMMARY_FILE).exists() and not ckpt.exists()
    assert other.read_text() == "mine"  # nothing but the runtime's own files


def _checkpoint(cfg, step=2, **config_changes) -> Path:
    d = Path(cfg.output_dir) / "checkpoints" / f"step_{step:06d}"
    d.mkdir(parents=True)
    with open(d / "driver.pkl", "wb") as f:
        pickle.dump({"step": step, "config": {**cfg.to_dict(), **config_changes}}, f)
    return d


def test_resume_refuses_a_checkpoint_of_another_config_and_lists_the_keys(tmp_path):
    base = tiny_config(tmp_path, name="a")
    ckpt = _checkpoint(base, lr=1e-2, policy_loss="grpo", output_dir="elsewhere", num_rollout=99)
    cfg = tiny_config(tmp_path, "--load", str(ckpt), name="b")
    with pytest.raises(ConfigError, match=r"different config.*\n  lr: checkpoint 0.01, now 0.0003\n  policy_loss"):
        Run(cfg)._check_resume()
    # keys a resumed run may change (where, how long, eval / logging) are not differences
    step3 = _checkpoint(base, step=3, output_dir="x", num_rollout=2)
    (step3.parent / "latest").write_text(step3.name)
    ok = tiny_config(tmp_path, "--load", str(step3.parent), "--num-rollout", "9", name="c")
    assert Run(ok)._check_resume().name == "step_000003"


def test_resume_from_a_finished_checkpoint_says_nothing_to_train(tmp_path):
    base = tiny_config(tmp_path, name="a")
    cfg = tiny_config(tmp_path, "--load", str(_checkpoint(base, step=4)), name="b")
    with pytest.raises(ConfigError, match="at step 4, --num-rollout is 4: nothing to train"):
        Run(cfg)._check_resume()


def test_resolved_defaults_are_recorded_not_null(tmp_path):
    cfg = tiny_config(tmp_path)
    d = cfg.to_dict()
    assert d["policy_loss_params"] == {"delta_low": 5e-4, "delta_high": 2e-3}
    assert d["epic_delta_low"] == 5e-4 and d["epic_delta_high"] == 2e-3
    assert not any(k.startswith("grpo_") for k in d)  # other families' unset flags left out
    assert resume_differences(d, tiny_config(tmp_path, "--epic-delta-low", "5e-4").to_dict()) == []
    v = versions()
    import torch

    import epic_slime

    assert v["torch"] == torch.__version__ and v["epic_slime"] == epic_slime.__version__
    assert v["git_commit"] is None or len(v["git_commit"].split("-")[0]) == 40
