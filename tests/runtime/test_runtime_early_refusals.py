"""Refusals before torch's import (1 s idle, 4-22 s on a busy machine): a bad flag of `train` or `sweep`,
a run folder that holds a run, a --load with no checkpoint or of another config, a cross-mode flag. The
quick parser that makes this possible is the full parser but for value types, over the stored loss-flag
table."""

from __future__ import annotations

import pickle

import pytest


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
