"""What the embedded runtime prints: --version, progress lines off a terminal and their ETA (a resumed
run's too), the key settings before anything slow, the end-of-run summary, and Ray's authentication notice
quieted. No Ray: these run in seconds."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from support.runtime_helpers import tiny_config
from epic_slime.runtime.config import ConfigError
from epic_slime.runtime.run_files import run_outcome


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


# a resumed run's ETA (issue 28 item 7's mutation pass: every progress line above starts from step 0)
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
