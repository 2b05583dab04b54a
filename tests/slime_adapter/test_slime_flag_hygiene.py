"""Typos, abbreviations, overrides and unsupported flags on the slime path (issue 9, defects 3, 8, 9).

The option strings come from ``epic_slime/slime/cli/option_strings.json`` (written from the real
parsers by ``launch/tools/regenerate_option_strings.py``); no slime import except the cross-check
against the vendored slime source, which skips when ../shared is absent.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from epic_slime.slime import train

from epic_slime.slime.cli import flags
from epic_slime.slime.cli.checks import UNSUPPORTED_FLAGS
from epic_slime.slime.cli.command_line import read_command_line
from epic_slime.slime.cli.dry_run import check_argv
from epic_slime.slime.cli.flags import ProjectFlagError
from epic_slime.slime.cli.option_strings import (
    FlagSpellingError,
    Override,
    check_flag_spelling,
    known_options,
    load_option_strings,
    option_kinds_of,
)

REPO = Path(__file__).resolve().parents[2]
VENDORED_SLIME = REPO.parent / "shared" / "vendor" / "slime-624b824a"
BASE = [
    "--loss-type",
    "custom_loss",
    "--custom-loss-function-path",
    "epic_slime.slime.loss.policy_loss",
    "--rollout-batch-size",
    "64",
    "--n-samples-per-prompt",
    "8",
]


def test_stored_option_strings_are_the_pinned_parsers():
    data = load_option_strings()
    assert data["versions"]["slime"] == "624b824a898ab0ec1fcb4d373004c7f3852bf515"
    assert data["versions"]["sglang"] == "0.5.15.post1"
    assert data["versions"]["megatron"].startswith("1dcf0dafa884ad52ffb243625717a3471643e087")
    parsers = data["parsers"]
    # one flag of each kind and origin the launch script relies on
    assert parsers["slime"]["--num-gpus-per-node"] == "value" and parsers["slime"]["--rollout-seed"] == "value"
    assert parsers["slime"]["--rollout-shuffle"] == "flag"
    assert parsers["megatron"]["--lr-warmup-iters"] == "value" and parsers["megatron"]["--seed"] == "value"
    assert parsers["megatron"]["--use-gated-attention"] == "flag"  # added by slime's Megatron patch
    assert parsers["sglang"]["--sglang-mem-fraction-static"] == "value"
    assert "--use-critic" not in known_options()
    assert min(len(p) for p in parsers.values()) > 200


@pytest.mark.skipif(not VENDORED_SLIME.is_dir(), reason="../shared/vendor/slime-624b824a is absent")
def test_every_literal_flag_of_the_vendored_slime_source_is_stored():
    """Independent of the regenerate script: the add_argument string literals of slime's source."""
    known = set(known_options())
    for relative in ("slime/utils/arguments.py", "slime/backends/sglang_utils/arguments.py"):
        tree = ast.parse((VENDORED_SLIME / relative).read_text())
        literals = {
            arg.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
            for arg in node.args
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--")
        }
        assert len(literals) > 5 and literals <= known, sorted(literals - known)


def test_every_flag_in_the_cluster_configs_is_a_real_flag():
    known = known_options(flags.project_option_kinds())
    paths = [
        REPO / "configs/paper/table2.yaml",
        *sorted((REPO / "configs/models").glob("*.yaml")),
        *sorted((REPO / "configs/methods").glob("*.yaml")),
    ]
    for path in paths:
        for name in yaml.safe_load(path.read_text())["flags"]:
            assert f"--{name}" in known, f"{path.name}: --{name}"


KNOWN = {
    "--sglang-mem-fraction-static": "value",
    "--sglang-mem-pool": "value",
    "--num-rollout": "value",
    "--rollout-stop": "value",
    "--colocate": "flag",
    "--router-prefill": "append",
    "--lr": "value",
}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sglang-mem-frac", "0.5"], "--sglang-mem-frac is an abbreviation of --sglang-mem-fraction-static"),
        (["--sglang-mem", "0.5"], "abbreviation of --sglang-mem-fraction-static, --sglang-mem-pool"),
        (["--num-rollouts", "3"], "unknown flag --num-rollouts: .*did you mean --num-rollout\\?"),
        (["--colocte"], "unknown flag --colocte.*did you mean --colocate\\?"),
        (["--lr=1e-6", "--zzz-qqq"], "unknown flag --zzz-qqq: no option"),  # nothing close: no suggestion
        (["--num-rolout=3"], "unknown flag --num-rolout"),
    ],
)
def test_unknown_and_abbreviated_flags_name_the_real_one(argv, message):
    with pytest.raises(FlagSpellingError, match=message):
        check_flag_spelling(argv, KNOWN)


def test_overrides_are_reported_with_every_value_and_accumulating_flags_are_not():
    argv = [
        "--num-rollout",
        "300",
        "--rollout-stop",
        "a",
        "b",
        "--colocate",
        "--router-prefill",
        "x",
        "--lr=1e-6",
        "--router-prefill",
        "y",
        "--num-rollout",
        "3",
        "--colocate",
        "--lr",
        "2e-6",
        "-1",
    ]
    overrides = check_flag_spelling(argv, KNOWN)
    assert overrides == [
        Override("--num-rollout", (("300",), ("3",))),
        Override("--colocate", ((), ())),
        Override("--lr", (("1e-6",), ("2e-6", "-1"))),
    ]
    assert overrides[0].describe() == "--num-rollout given 2 times: 300 -> 3 (the last one wins)"
    assert check_flag_spelling(["--rollout-stop", "a", "b", "--", "--lr", "1"], KNOWN) == []


def test_option_kinds_of_a_parser():
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--a", type=int)
    parser.add_argument("--b", action="store_true")
    parser.add_argument("--c", action="append")
    parser.add_argument("--d", nargs="+")
    assert option_kinds_of(parser) == {"--a": "value", "--b": "flag", "--c": "append", "--d": "value"}


@pytest.mark.parametrize("flag", sorted(UNSUPPORTED_FLAGS))
def test_flags_the_project_would_ignore_are_rejected(flag):
    with pytest.raises(ProjectFlagError, match=f"{flag} is not supported by the epic-slime driver: it "):
        read_command_line(BASE + [flag, "1"])
    if flag != "--use-critic":  # the others are real slime flags: the list must not drift from slime
        assert flag in load_option_strings()["parsers"]["slime"]


def test_a_critic_is_refused_by_the_dry_run_and_the_driver_flags():
    with pytest.raises(ProjectFlagError, match="--advantage-estimator ppo trains a critic"):
        check_argv(BASE + ["--advantage-estimator", "ppo"])
    with pytest.raises(ProjectFlagError, match="--advantage-estimator ppo trains a critic"):
        read_command_line(BASE + ["--advantage-estimator", "ppo"])


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--use-critic"], "--use-critic is not supported"),
        (["--advantage-estimator", "ppo"], "trains a critic"),
        (["--sglang-mem-frac", "0.5"], "abbreviation of --sglang-mem-fraction-static"),
        (["--eps-clip-high", "0.28"], "--eps-clip-high is not supported"),
    ],
)
def test_driver_exits_2_with_the_message_before_slime_is_needed(extra, message, capsys):
    # without slime installed the old driver died with a traceback in slime's import or in run()
    assert train.main(BASE + extra) == 2
    assert message in capsys.readouterr().err


def test_dry_run_exits_2_naming_the_flag_and_reports_overrides():
    def run(*a):
        return subprocess.run(
            [sys.executable, "-m", "epic_slime.slime.cli.dry_run", *BASE, *a],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )

    bad = run("--num-rollouts", "3")
    assert bad.returncode == 2 and "unknown flag --num-rollouts" in bad.stderr and "--num-rollout?" in bad.stderr
    good = run("--num-rollout", "300", "--num-rollout", "3")
    assert good.returncode == 0, good.stderr
    assert "override: --num-rollout given 2 times: 300 -> 3" in good.stdout


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"parsers": {}}', "non-empty 'parsers' mapping"),
        ('{"parsers": {"slime": {"num-rollout": "value"}}}', "parser 'slime' has malformed entries .*num-rollout"),
        ('{"parsers": {"slime": {"--num-rollout": "maybe"}}}', "malformed entries .*maybe"),
    ],
)
def test_a_malformed_option_strings_file_is_named(tmp_path, content, message):
    path = tmp_path / "option_strings.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_option_strings(path)


# ---- --update-weight-mode delta (issue 17, section 6) ----


@pytest.mark.parametrize("spelling", [["--update-weight-mode", "delta"], ["--update-weight-mode=delta"]])
def test_delta_weight_sync_is_refused_naming_the_flag_and_value(spelling, capsys):
    message = "--update-weight-mode delta is not supported by the epic-slime driver"
    with pytest.raises(ProjectFlagError, match=message):
        read_command_line(BASE + spelling)
    with pytest.raises(ProjectFlagError, match=message):
        check_argv(BASE + spelling)  # the dry run's validation, and validate_project_args on slime's args
    assert train.main(BASE + spelling) == 2  # before slime is imported
    assert message in capsys.readouterr().err


def test_full_weight_sync_is_accepted():
    read_command_line(BASE + ["--update-weight-mode", "full"])
    check_argv(BASE + ["--update-weight-mode", "full"])


@pytest.mark.skipif(not VENDORED_SLIME.is_dir(), reason="../shared/vendor/slime-624b824a is absent")
def test_the_refused_value_is_one_of_slimes_choices():
    """The refusal must track slime's real option: its name and its choices at the pin."""
    tree = ast.parse((VENDORED_SLIME / "slime/utils/arguments.py").read_text())
    choices = [
        ast.literal_eval(keyword.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
        and any(isinstance(a, ast.Constant) and a.value == "--update-weight-mode" for a in node.args)
        for keyword in node.keywords
        if keyword.arg == "choices"
    ]
    assert choices == [["full", "delta"]]


@pytest.mark.parametrize(
    "mode, refused", [(None, True), ("full", True), ("delta", False)], ids=["mode_unset", "full", "delta"]
)
def test_ci_test_with_a_full_disk_reload_is_refused_when_the_mode_is_left_at_its_default(mode, refused):
    """slime's --update-weight-mode defaults to full: a namespace where it is unset (None) is the full
    mode, so --ci-test with disk transport is refused there too (slime's 404 version check would end the
    first push). Delta has its own refusal, elsewhere."""
    import argparse

    from epic_slime.slime.cli.checks import ProjectFlagError, check_disk_version_check

    args = argparse.Namespace(ci_test=True, update_weight_transport="disk", update_weight_mode=mode)
    if refused:
        with pytest.raises(ProjectFlagError, match="--ci-test with --update-weight-transport disk"):
            check_disk_version_check(args)
    else:
        check_disk_version_check(args)
    check_disk_version_check(argparse.Namespace(ci_test=False, update_weight_transport="disk"))
