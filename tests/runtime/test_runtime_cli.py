"""The embedded runtime as a tool: run directories that never mix, resume checks, what is printed,
config.json, --version, progress off a terminal. No Ray: these run in seconds."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import pytest

from support.runtime_helpers import tiny_config
from epic_slime.provenance import versions
from epic_slime.runtime.checkpoint import resume_differences
from epic_slime.runtime.config import ConfigError
from epic_slime.runtime.driver import Run
from epic_slime.runtime.run_files import prepare_output_dir, run_outcome


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


def test_version_flag(capsys):
    from epic_slime.cli import main

    import epic_slime

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"epic-slime {epic_slime.__version__} (torch ")


def test_progress_writes_plain_lines_off_a_terminal():
    from epic_slime.runtime.progress import Progress

    stream = io.StringIO()  # not a terminal, like a log file
    bar = Progress(25, desc="epic-slime", interval=10, stream=stream)
    for step in range(1, 26):
        bar.update(step, {"reward": 0.5})
    bar.close()
    lines = stream.getvalue().splitlines()
    assert [ln.split()[2] for ln in lines] == ["10/25", "20/25", "25/25"] and "\r" not in stream.getvalue()
    assert "reward 0.5" in lines[0]

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    bar = Progress(5, desc="x", stream=tty)
    for step in range(1, 6):
        bar.update(step)
    bar.close()
    assert "\r" in tty.getvalue() and "5/5" in tty.getvalue()  # a tqdm bar on a terminal


def test_end_of_run_summary_names_reward_best_eval_staleness_and_files(tmp_path):
    from epic_slime.runtime.cli import end_of_run_lines, resume_command

    cfg = tiny_config(tmp_path)
    out = Path(cfg.output_dir)
    out.mkdir()
    # metrics.jsonl holds the shared names (epic_slime.metric_names), as the driver writes them
    rows = [
        {"step": s, "rollout/raw_reward": r, "rollout/staleness/max": lag, "train/policy/bad_tokens": b}
        for s, r, lag, b in [(1, 0.1, 0, 0), (2, 0.3, 1, 2), (3, 0.5, 1, 0), (4, 0.7, 0, 1)]
    ]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [
        {"step": 0, "eval/version": 0, "eval/heldout/mean@2": 0.2},
        {"step": 2, "eval/version": 2, "eval/heldout/mean@2": 0.4},
        {"step": 3, "eval/version": 3, "eval/heldout/mean@2": 0.4},
        {"step": 4, "eval/version": 4, "eval/heldout/mean@2": 0.3},
    ]
    (out / "eval_metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    outcome = run_outcome(out, cfg)
    assert outcome["reward_first"] == pytest.approx(0.2) and outcome["reward_last"] == pytest.approx(0.6)
    assert (outcome["eval_best"], outcome["eval_best_step"]) == (0.4, 2)  # earliest on ties
    assert (outcome["eval_final"], outcome["eval_final_step"]) == (0.3, 4)  # the score the run ends with
    assert outcome["staleness_max"] == 1 and outcome["bad_tokens"] == 3
    summary = {
        **outcome,
        "steps": 4,
        "start_step": 2,
        "steps_this_run": 2,
        "loop_s": 1.0,
        "trained_samples_per_s": 32.0,
        "accounting/dropped": 16,
        "accounting/lost": 4,
        "skipped_steps": 0,
    }
    text = "\n".join(end_of_run_lines(summary, cfg))
    for part in (
        "2 steps this run (steps 3..4 of 4)",
        "training reward 0.200 (first 2 steps) -> 0.600 (last 2)",
        "held-out mean@2: 0.200 at start, 0.300 at the last eval (step 4), best 0.400 at step 2",
        "staleness max 1 (K=2)",
        "dropped 16, lost 4",
        f"{out}/metrics.jsonl",
    ):
        assert part in text, part
    cmd = resume_command(["--config", "c.yaml", "--load", "old", "--overwrite", "--lr", "1e-4"], cfg)
    assert cmd == f"epic-slime train --config c.yaml --lr 1e-4 --load {cfg.checkpoint_dir}"


def test_key_settings_are_printed_before_anything_slow(tmp_path, capsys, monkeypatch):
    from epic_slime.runtime import driver
    from epic_slime.runtime.cli import train_main
    from support.runtime_helpers import TINY_FLAGS

    def not_yet(cfg):
        raise ConfigError("stopped before the run")

    monkeypatch.setattr(driver, "run_training", not_yet)
    flags = [f for f in TINY_FLAGS if f != "--no-progress"]
    assert train_main([*flags, "--output-dir", str(tmp_path / "r"), "--epic-delta-high", "0.003"]) == 2
    out = capsys.readouterr().out
    assert out.startswith(
        "[epic-slime] epic (delta_low=0.0005, delta_high=0.003; seq-mean-token-mean), "
        "update depth D=2, max staleness K=2 (drop), async, 4 prompts x 4 samples per step, 4 steps"
    )


def test_first_signal_asks_for_a_checkpoint_and_a_second_exits_at_once(capsys):
    import os
    import signal

    from epic_slime.runtime.signals import StopRequest

    stop = StopRequest()
    before = signal.getsignal(signal.SIGTERM)
    stop.install()
    stop.begin_steps()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal_name == "SIGTERM"
        assert "finishing the step in flight" in capsys.readouterr().out
        with pytest.raises(KeyboardInterrupt, match="second SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) is before


def test_plain_progress_lines_carry_an_eta(monkeypatch):
    from epic_slime.runtime import progress

    clock = iter([0.0, 2.0, 40.0, 60.0])  # start, then the time at each update
    monkeypatch.setattr(progress.time, "time", lambda: next(clock))
    stream = io.StringIO()
    bar = progress.Progress(100, desc="warm start", interval=10, stream=stream)
    for step in (10, 20, 100):
        bar.update(step)
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("(2 s, ETA 18 s)"), lines  # 0.2 s a step, 90 steps left
    assert lines[1].endswith("(40 s, ETA 2m40s)"), lines  # 2 s a step, 80 left
    assert lines[2].endswith("(60 s)"), lines  # done: no ETA


def _tiny_warm_start(tmp_path, monkeypatch, seen: dict):
    """load_or_train_warm_start with a stand-in trainer that records torch's thread count while it runs."""
    import torch

    from epic_slime.runtime import warmstart
    from epic_slime.runtime.model import ModelConfig
    from epic_slime.runtime.task import TaskConfig

    def recording(model_cfg, task_cfg, *, on_step=None, **kw):
        seen["threads"] = torch.get_num_threads()
        for i in range(1, kw["steps"] + 1):
            on_step(i, 1.0)
        return {"w": torch.zeros(1)}

    monkeypatch.setattr(warmstart, "supervised_warm_start", recording)
    return warmstart.load_or_train_warm_start(
        ModelConfig(),
        TaskConfig(),
        steps=20,
        lr=1e-3,
        batch_size=2,
        seed=0,
        cache_dir=tmp_path / "cache",
        progress=True,
    )


def test_the_warm_start_runs_on_one_torch_thread_and_restores_the_callers(tmp_path, monkeypatch, capsys):
    """torch's default (one per core) made the first-run warm start 7.5x slower than 1 thread with 6
    busy processes on 2 cores (bench/warm_start_threads.py): OpenMP barriers spinning."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = {}
        monkeypatch.delenv("EPIC_SLIME_TORCH_THREADS", raising=False)
        _tiny_warm_start(tmp_path, monkeypatch, seen)
        assert seen["threads"] == 1 and torch.get_num_threads() == 2
        monkeypatch.setenv("EPIC_SLIME_TORCH_THREADS", "3")
        _tiny_warm_start(tmp_path / "b", monkeypatch, seen)
        assert seen["threads"] == 3
        monkeypatch.setenv("EPIC_SLIME_TORCH_THREADS", "zero")
        with pytest.raises(ValueError, match="EPIC_SLIME_TORCH_THREADS='zero': must be a positive integer"):
            _tiny_warm_start(tmp_path / "c", monkeypatch, seen)
    finally:
        torch.set_num_threads(before)


def test_the_warm_start_says_it_is_trained_once_and_cached_with_an_eta(tmp_path, monkeypatch, capsys):
    seen = {}
    _, provenance = _tiny_warm_start(tmp_path, monkeypatch, seen)
    out = capsys.readouterr().out
    path = provenance.split(":", 1)[1]
    assert provenance.startswith("trained:") and Path(path).exists()
    assert "training 20 supervised steps, once for this config" in out and f"later runs load it from {path}" in out
    assert "[warm start (trained once, then cached)] step 2/20" in out and "ETA" in out
    _, again = _tiny_warm_start(tmp_path, monkeypatch, seen)
    assert again == f"cache:{path}" and f"warm start: cached at {path}" in capsys.readouterr().out


def test_a_signal_during_start_up_stops_at_once_without_promising_a_step(capsys):
    """Before the driver's loop there is no step in flight: the first Ctrl-C stops (it used to print
    "finishing the step in flight" and let the warm start and Ray's start run on)."""
    import os
    import signal

    from epic_slime.runtime.signals import StopRequest

    stop = StopRequest()
    stop.install()
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGINT during start-up"):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.restore()
    out = capsys.readouterr().out
    assert "during start-up, before any step: stopping now" in out and "step in flight" not in out


def test_installing_twice_restores_the_handlers_from_before_the_first(capsys):
    """The driver installs again after ray.init: restore must put back the caller's handler, not the
    first install's own (which stayed installed after the run)."""
    import signal

    from epic_slime.runtime.signals import StopRequest

    before = signal.getsignal(signal.SIGINT)
    stop = StopRequest()
    stop.install()
    stop.install()
    stop.restore()
    assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_during_the_warm_start_exits_in_seconds(tmp_path):
    """A real `epic-slime train` (its warm start, no Ray yet) sent SIGINT while it trains: exit 130
    at once, no "finishing the step in flight", no run files left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from support.runtime_helpers import TINY_FLAGS

    flags = [f for f in TINY_FLAGS if f != "--no-progress"]
    argv = [
        sys.executable,
        "-m",
        "epic_slime.cli",
        "train",
        *flags,
        "--warm-start-steps",
        "100000",
        "--output-dir",
        str(tmp_path / "run"),
        "--warm-start-cache-dir",
        str(tmp_path / "cache"),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "warm start: training" in line:  # the next thing it does is train
                break
        time.sleep(1.0)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(seen) + rest
    assert proc.returncode == 130, text
    assert "during start-up, before any step: stopping now" in text and "step in flight" not in text, text
    assert "nothing to resume" in text and took < 20, (took, text)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


# ---- refusals before torch's import ----


def test_the_stored_loss_flags_match_the_registry():
    from epic_slime.runtime.loss_flags import live_table, stored_table

    assert stored_table() == live_table(), (
        "epic_slime/runtime/loss_flags.json is stale: python -m epic_slime.runtime.loss_flags --write"
    )


def test_the_quick_parser_is_the_full_parser_but_for_value_types():
    from epic_slime.runtime.config import build_parser
    from epic_slime.runtime.loss_flags import stored_table

    def actions(parser):
        return [
            (a.option_strings, a.dest, a.default, list(a.choices) if a.choices else None, a.help, a.nargs, a.metavar)
            for a in parser._actions
        ]

    full, quick = build_parser(), build_parser(loss_table=stored_table())
    assert actions(quick) == actions(full)
    assert quick.format_help() == full.format_help()


REFUSALS = [
    ["train", "--bogus"],
    ["train", "--lr", "-1"],
    ["train", "--max-stalenes", "2"],
    ["train", "--policy-loss", "epik"],
    ["train", "--config", "/nonexistent.yaml"],
    ["train", "--help"],
    ["sweep", "--bogus"],
    ["sweep", "--policy-losses", "epik"],
]


@pytest.mark.parametrize("argv", REFUSALS, ids=[" ".join(a) for a in REFUSALS])
def test_a_refusal_answers_before_torch_is_imported(argv):
    """torch's import is 1 s idle and 4-22 s on a busy machine; a refused flag must not wait for it."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom epic_slime.cli import main\ntry:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n"
        "    rc = e.code\nprint('torch imported' if 'torch' in sys.modules else 'no torch', rc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    last = done.stdout.strip().splitlines()[-1]
    assert last in ("no torch 2", "no torch 0"), (last, done.stderr[-500:])
    if argv[-1] != "--help":
        assert done.stderr.strip().startswith(f"epic-slime {argv[0]}: error: "), done.stderr


def test_a_run_folder_load_or_mode_refusal_answers_before_torch_and_ray(tmp_path):
    """The refusals that read the disk (a folder holding a run, a --load with no checkpoint or from
    another config) and the cross-mode one come before torch's and Ray's imports too."""
    import subprocess
    import sys

    held = tmp_path / "held"
    held.mkdir()
    (held / "metrics.jsonl").write_text('{"step": 1}\n')
    other = tmp_path / "other" / "step_000002"
    other.mkdir(parents=True)
    with open(other / "driver.pkl", "wb") as f:
        pickle.dump({"step": 2, "config": {"lr": 0.5}}, f)
    cases = [
        (["--output-dir", str(held)], f"--output-dir {held} already holds a run"),
        (["--load", str(tmp_path / "none"), "--output-dir", str(tmp_path / "a")], "no checkpoint there"),
        (["--load", str(other), "--output-dir", str(tmp_path / "b")], "lr: checkpoint 0.5, now"),
        (
            ["--policy-loss", "grpo", "--epic-delta-low", "1e-3", "--output-dir", str(tmp_path / "c")],
            "--epic-delta-low=1e-3 applies to the 'epic' modes, but --policy-loss is 'grpo'",
        ),
    ]
    code = (
        "import sys\nfrom epic_slime.cli import main\nrc = main(sys.argv[1:])\n"
        "print([m for m in ('torch', 'ray') if m in sys.modules], rc)\n"
    )
    for argv, message in cases:
        done = subprocess.run([sys.executable, "-c", code, "train", *argv], capture_output=True, text=True, timeout=120)
        assert done.stdout.strip().splitlines()[-1] == "[] 2", (argv, done.stdout, done.stderr[-500:])
        assert done.stderr.startswith("epic-slime train: error: ") and message in done.stderr, done.stderr


@pytest.mark.parametrize("preset", [None, "disabled", "token"])
def test_ray_keeps_its_auth_mode_and_only_the_notice_is_quieted(monkeypatch, preset):
    """Ray 2.60 logs a token-authentication notice on every new local cluster: the driver quiets that
    logger and leaves RAY_AUTH_MODE as it was (set here, Ray's config read at import would disagree with
    the cluster it starts, which then refuses the driver)."""
    import logging
    import os

    import ray

    from epic_slime.runtime import local_ray

    monkeypatch.setenv("RAY_AUTH_MODE", "restored after the test")  # so that monkeypatch restores the variable
    if preset is None:
        monkeypatch.delenv("RAY_AUTH_MODE")
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", preset)
    notice = logging.getLogger(local_ray.RAY_AUTH_NOTICE_LOGGER)
    monkeypatch.setattr(notice, "level", logging.NOTSET)
    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.setdefault("mode", os.environ.get("RAY_AUTH_MODE")))
    local_ray.init_local_ray(1)
    assert seen["mode"] == preset
    assert not notice.isEnabledFor(logging.WARNING)


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


# ---- a resumed run's ETA (issue 28 item 7's mutation pass: every progress line above starts from step 0)
# mutant: eta_counts_resumed_steps
def test_a_resumed_runs_eta_counts_this_runs_steps_only(monkeypatch):
    """Resumed at step 50 of 100: 10 steps in 10 s is 1 s a step, 40 left; counting the 50 steps of
    the earlier process as done in this one's time would say 7 s."""
    from epic_slime.runtime import progress

    clock = iter([0.0, 10.0])
    monkeypatch.setattr(progress.time, "time", lambda: next(clock))
    stream = io.StringIO()
    bar = progress.Progress(100, initial=50, desc="epic-slime", interval=10, stream=stream)
    bar.update(60)
    assert stream.getvalue().rstrip().endswith("(10 s, ETA 40 s)"), stream.getvalue()
