"""configs/: every method file sets its loss mode's registry defaults, key by key; every folder is documented."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from epic_slime.losses import LOSS_MODES, resolve_params
from epic_slime.losses.flags import add_policy_loss_arguments, policy_loss_config_from_args
from epic_slime.slime.cli.config_flags import config_argv

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
METHOD_FILES = sorted((CONFIGS / "methods").glob("*.yaml"))

# Method files that run their mode away from the registry default on purpose (configs/README.md).
DEVIATIONS = {
    "dppo_tv.yaml": {"clip_low": 0.2, "clip_high": 0.2},  # published for Qwen3-30B-A3B; 0.15 is for dense models
    "grpo_r2.yaml": {"clip_high": 0.28},  # the routing-replay comparison runs GRPO with clip-higher
    "grpo_r3.yaml": {"clip_high": 0.28},
}
# Flags a method file may set besides the loss's own: slime / project flags the method needs.
METHOD_EXTRA_FLAGS = {
    "--use-routing-replay",
    "--use-rollout-routing-replay",
    "--policy-loss-topk",
    "--custom-generate-function-path",
}


def method_file_problems(path: Path, deviations: dict[str, object]) -> list[str]:
    """What in one configs/methods file differs from the registry, read the way the launchers read it
    (YAML -> command line -> the loss flags' parser)."""
    data = yaml.safe_load(path.read_text())
    problems = (
        [f"top-level keys {sorted(data)}, expected ['description', 'flags']"]
        if sorted(data) != ["description", "flags"]
        else []
    )
    parser = add_policy_loss_arguments(argparse.ArgumentParser())
    args, rest = parser.parse_known_args(config_argv([path]))
    problems += [f"unexpected flag {flag}" for flag in rest if flag.startswith("--") and flag not in METHOD_EXTRA_FLAGS]
    if "policy-loss" not in data["flags"]:
        return problems + ["no policy-loss"]
    mode, params, aggregation = policy_loss_config_from_args(args)
    spec = LOSS_MODES[mode]
    if aggregation != spec.aggregation:
        problems.append(f"aggregation {aggregation!r} != the mode's {spec.aggregation!r}")
    expected = {**spec.defaults, **deviations}
    for param, value in resolve_params(mode, params).items():
        if value != expected[param] or type(value) is not type(expected[param]):
            problems.append(f"{param} = {value!r}, expected {expected[param]!r}")
    problems += [
        f"listed deviation {param} = {value!r} is the registry default (remove it from DEVIATIONS)"
        for param, value in deviations.items()
        if spec.defaults[param] == value
    ]
    return problems


@pytest.mark.parametrize("path", METHOD_FILES, ids=lambda p: p.name)
def test_method_file_values_are_the_registry_defaults(path):
    assert method_file_problems(path, DEVIATIONS.get(path.name, {})) == []


def test_every_registered_mode_has_a_method_file_and_every_deviation_a_file():
    names = {path.stem for path in METHOD_FILES}
    assert set(LOSS_MODES) <= names
    assert set(DEVIATIONS) <= {path.name for path in METHOD_FILES}


def test_the_method_check_reports_a_wrong_value_an_unknown_flag_and_a_stale_deviation(tmp_path):
    path = tmp_path / "epic.yaml"
    path.write_text("description: x\nflags:\n  policy-loss: epic\n  epic-delta-low: 1.0e-3\n  lr: 1.0e-6\n")
    assert method_file_problems(path, {"delta_high": 0.002}) == [
        "unexpected flag --lr",
        "delta_low = 0.001, expected 0.0005",
        "listed deviation delta_high = 0.002 is the registry default (remove it from DEVIATIONS)",
    ]


def test_configs_readme_names_every_folder():
    readme = (CONFIGS / "README.md").read_text()
    folders = sorted(p.name for p in CONFIGS.iterdir() if p.is_dir())
    assert folders and [f for f in folders if f"`configs/{f}/`" not in readme] == []
