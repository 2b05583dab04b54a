"""What a new user trips over on the command line, each fixed: one-line errors that state the rule
(with a "did you mean"), negative numbers as values, the help's metric names and defaults, the
end-of-run file list, an interrupt before the first checkpoint, and `epic-slime report` on a run
folder. No Ray: the run itself is a stand-in where one is needed."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from support.runtime_helpers import TINY_FLAGS, tiny_config
from epic_slime.evaluation.records import EvalRecord, write_records
from epic_slime.runtime.cli import end_of_run_lines, train_main
from epic_slime.runtime.config import ConfigError, parse_config
from epic_slime.runtime.run_files import existing_run, prepare_output_dir


def _error_lines(capsys, argv) -> list[str]:
    with pytest.raises(SystemExit) as e:
        train_main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--policy-loss", "epik"], "invalid choice: 'epik' (choose from 'acpo',"),
        (["--rollout-mode", "asnc"], "did you mean 'async'?"),
        (["--max-stalenes", "2"], "unrecognized arguments: --max-stalenes 2; did you mean --max-staleness?"),
        (["--lr", "abc"], "argument --lr: invalid float value: 'abc'; --lr must be a finite number > 0"),
    ],
)
def test_a_malformed_flag_is_one_line_without_the_usage(capsys, argv, expected):
    lines = _error_lines(capsys, argv)
    assert len(lines) == 1 and lines[0].startswith("epic-slime train: error: "), lines
    assert expected in lines[0]


def test_did_you_mean_names_the_close_loss_mode(capsys):
    (line,) = _error_lines(capsys, ["--policy-loss", "epik"])
    assert line.endswith("; did you mean 'epic'?")


@pytest.mark.parametrize(
    "flag,value,rule",
    [
        ("--lr", "-1e-4", "lr: invalid value -0.0001: must be a finite number > 0"),
        ("--lr", "-1", "lr: invalid value -1.0: must be a finite number > 0"),
        ("--update-depth", "-2", "update_depth: invalid value -2: must be an integer >= 1"),
        ("--rollout-top-p", "1.5", "rollout_top_p: invalid value 1.5: must be a number in (0, 1]"),
    ],
)
def test_an_out_of_range_value_states_the_rule(tmp_path, capsys, flag, value, rule):
    assert train_main([flag, value, "--output-dir", str(tmp_path / "r")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("epic-slime train: error: ") and rule in line


def test_a_negative_number_is_a_value_not_an_option():
    """argparse alone reads `-1e-4` as an unknown option ("expected one argument"); the value check
    must see it, for the project's own flags and the loss flags alike."""
    for argv in (["--lr", "-1e-4"], ["--policy-loss", "epic", "--epic-delta-low", "-1e-4"]):
        with pytest.raises(ConfigError, match="-0.0001 must be|invalid value -0.0001: must be"):
            parse_config(argv)


def test_help_names_the_logged_metrics_and_each_default_once(capsys):
    with pytest.raises(SystemExit):
        train_main(["--help"])
    text = " ".join(capsys.readouterr().out.split("options:", 1)[1].split())  # the option list, unwrapped
    assert "train/policy/bad_tokens" in text and "train/policy/skipped_steps" in text
    assert "loss/bad_tokens" not in text.replace("train/policy/bad_tokens", "")
    assert "(default: <output- dir>/checkpoints)" in text or "(default: <output-dir>/checkpoints)" in text
    for option in (
        "--save SAVE",
        "--warm-start-seed WARM_START_SEED",
        "--warm-start-cache-dir WARM_START_CACHE_DIR",
        "--tensorboard-dir TENSORBOARD_DIR",
    ):
        entry = text.split(option, 1)[1].split(" --", 1)[0]
        assert entry.count("default:") == 1, (option, entry)


def test_end_of_run_files_line_lists_every_run_file(tmp_path):
    cfg = tiny_config(tmp_path)
    summary = {
        "output_dir": cfg.output_dir,
        "reward_first": 0.1,
        "reward_last": 0.2,
        "reward_window": 1,
        "steps_this_run": 4,
        "start_step": 0,
        "steps": 4,
        "loop_s": 1.0,
        "trained_samples_per_s": 1.0,
        "eval_key": "eval/heldout/mean@2",
        "eval_start": 0.1,
        "eval_best": 0.2,
        "eval_best_step": 2,
        "eval_final": 0.15,
        "eval_final_step": 4,
        "staleness_max": 1,
        "accounting/dropped": 0,
        "accounting/lost": 0,
        "bad_tokens": 0,
        "skipped_steps": 0,
    }
    (files,) = [ln for ln in end_of_run_lines(summary, cfg) if ln.strip().startswith("files:")]
    for name in (
        "metrics.jsonl",
        "batches.jsonl",
        "eval_metrics.jsonl",
        "eval_records.jsonl",
        "summary.json",
        "config.json",
    ):
        assert name in files, name


# ---- an interrupt before the first checkpoint ----


def _startup_interrupted_run(monkeypatch, raise_at_once: bool = False):
    """The driver up to its loop (run files opened, the warm-start evaluation written), then a
    SIGINT during start-up, or a second signal (KeyboardInterrupt), before any checkpoint."""
    from epic_slime.runtime import driver

    def start_up(self, reuse_ray, resume_path):
        self.log.open_files(None)
        self.log.evaluation(0, {"eval/heldout/mean@2": 0.5, "eval/version": 0}, 0, [[True, False]])
        self.stop.signal_name = "SIGINT"
        if raise_at_once:
            raise KeyboardInterrupt("second SIGINT")
        return {
            "steps": 0,
            "start_step": 0,
            "steps_this_run": 0,
            "interrupted": "SIGINT",
            "checkpoint": None,
            "loop_s": 0.0,
            "trained_samples_per_s": 0.0,
            "accounting/dropped": 0,
            "accounting/lost": 0,
        }

    monkeypatch.setattr(driver.Run, "_run", start_up)


@pytest.mark.parametrize("raise_at_once", [False, True])
def test_interrupt_before_the_first_checkpoint_says_so_and_a_rerun_is_accepted(
    tmp_path, capsys, monkeypatch, raise_at_once
):
    _startup_interrupted_run(monkeypatch, raise_at_once)
    argv = [*TINY_FLAGS, "--output-dir", str(tmp_path / "run"), "--warm-start-cache-dir", str(tmp_path / "w")]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    assert train_main(argv) == 130
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert "before the first checkpoint: nothing to resume" in text and "run the same command again" in text
    assert "--load" not in text
    cfg = parse_config(argv)
    assert existing_run(cfg) == []  # the same command is accepted again ...
    prepare_output_dir(cfg, None)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["notes.txt"]  # ... and the user's file stays


def test_an_interrupted_resume_keeps_the_run_it_resumes(tmp_path, capsys, monkeypatch):
    _startup_interrupted_run(monkeypatch)
    from epic_slime.runtime import driver

    first = tiny_config(tmp_path)
    ckpt = Path(first.output_dir) / "checkpoints" / "step_000002"
    ckpt.mkdir(parents=True)
    (ckpt / "driver.pkl").write_bytes(pickle.dumps({"step": 2, "config": first.to_dict()}))
    cfg = tiny_config(tmp_path, "--load", str(ckpt))
    summary = driver.Run(cfg).run()
    assert summary["interrupted"] == "SIGINT"
    assert (Path(cfg.output_dir) / "summary.json").exists() and (ckpt / "driver.pkl").exists()


# ---- `epic-slime report` on a run folder ----


def test_report_reads_a_run_folder(tmp_path, capsys):
    from epic_slime.evaluation.report import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "rollout/raw_reward": 0.5}) + "\n")
    (run / "batches.jsonl").write_text(
        json.dumps({"step": 1, "trained_group_ids": [0], "dropped_group_ids": [], "lags": [0]}) + "\n"
    )
    (run / "eval_metrics.jsonl").write_text(json.dumps({"step": 0, "eval/version": 0}) + "\n")
    write_records(
        str(run / "eval_records.jsonl"),
        [
            EvalRecord(
                run="run",
                method="epic",
                seed=1,
                step=s,
                benchmark="heldout",
                prompt_id=str(p),
                sample_idx=j,
                correct=(p + j + s) % 2 == 0,
            )
            for s in (0, 2)
            for p in range(3)
            for j in range(2)
        ],
    )
    assert main(["--records", str(run), "--benchmarks", "heldout", "--out", str(tmp_path / "rep"), "--no-plots"]) == 0
    assert "| epic |" in (tmp_path / "rep" / "table1.md").read_text()


# ---- the dispatcher ----


@pytest.mark.parametrize(
    "typed,meant", [("trian", "train"), ("reprot", "report"), ("sweeep", "sweep"), ("prepare_data", "prepare-data")]
)
def test_a_mistyped_command_gets_a_did_you_mean(capsys, typed, meant):
    from epic_slime.cli import main

    assert main([typed]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first == f"epic-slime: unknown command {typed!r}; did you mean {meant!r}?"


def test_an_unrelated_command_gets_no_guess(capsys):
    from epic_slime.cli import main

    assert main(["frobnicate"]) == 2
    assert capsys.readouterr().err.splitlines()[0] == "epic-slime: unknown command 'frobnicate'"


def test_the_readmes_short_check_runs_after_command_1(tmp_path, monkeypatch):
    """The README's short check, typed after command 1 (whose run holds runs/local-default) and typed
    twice: neither is refused (the first-hour report: 'adding --num-rollout 5' was)."""
    import re
    import shlex

    from epic_slime.runtime.cli import refuse_before_start

    repo = Path(__file__).resolve().parents[2]
    (command,) = re.findall(r"`(epic-slime train [^`]*--num-rollout 5[^`]*)`", (repo / "README.md").read_text())
    argv = [str(repo / a) if a.startswith("configs/") else a for a in shlex.split(command)[2:]]
    monkeypatch.chdir(tmp_path)  # the run folders are relative: in the checkout, here in tmp_path
    for folder in ("runs/local-default", parse_config(argv, quick=True).output_dir):  # command 1's, then its own
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "metrics.jsonl").write_text('{"step": 1}\n')
        cfg = parse_config(argv, quick=True)
        assert cfg.num_rollout == 5 and cfg.output_dir != "runs/local-default"
        refuse_before_start(cfg)  # raises ConfigError if refused
    with pytest.raises(ConfigError, match="already holds a run"):
        refuse_before_start(parse_config([a for a in argv if a != "--overwrite"], quick=True))


@pytest.mark.parametrize("command", ["train", "study"])
def test_a_yaml_syntax_error_is_one_line_naming_file_line_and_column(tmp_path, capsys, command):
    from epic_slime.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [1\nseed: 2\n")
    try:
        rc = main([command, "--config", str(bad)])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"--config {bad} line 2, column 5: not valid YAML: expected ',' or ']', but got ':'" in err, err
    assert "while parsing a flow sequence at line 1, column 5" in err


@pytest.mark.parametrize(
    "typed, meant", [("--quik", "--quick"), ("--ladr", "--ladder"), ("--analyse-only", "--analyze-only")]
)
def test_a_mistyped_study_flag_gets_a_did_you_mean_as_train_does(capsys, typed, meant):
    from epic_slime.cli import main

    with pytest.raises(SystemExit) as e:
        main(["study", typed])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("epic-slime study: error: ") and f"did you mean {meant}?" in err, err
