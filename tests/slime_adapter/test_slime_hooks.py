"""Every dotted function path the configs hand to slime resolves to a callable in this project."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
HOOK_FLAGS = (
    "custom-loss-function-path",
    "rollout-function-path",
    "eval-function-path",
    "custom-rm-path",
    "custom-eval-rollout-log-function-path",
)


def _hook_paths():
    for config in sorted((REPO / "configs").rglob("*.yaml")):
        if "local" in config.relative_to(REPO / "configs").parts:
            continue  # the local runtime's configs are not slime command lines
        flags = (yaml.safe_load(config.read_text()) or {}).get("flags") or {}
        for name in HOOK_FLAGS:
            if flags.get(name):
                yield pytest.param(flags[name], id=f"{config.stem}:{name}")


@pytest.mark.parametrize("dotted", list(_hook_paths()))
def test_hook_resolves(dotted):
    module_name, _, attr = dotted.rpartition(".")
    assert module_name.startswith("epic_slime."), f"{dotted}: the configs only point at the project's own hooks"
    module_file = REPO.joinpath(*module_name.split(".")).with_suffix(".py")
    package_dir = REPO.joinpath(*module_name.split("."))
    # a config pointing at a module that does not exist is exactly what this test is for: fail, never skip
    assert module_file.is_file() or package_dir.is_dir(), f"{dotted}: no module {module_name} in the repository"
    module = importlib.import_module(module_name)
    assert callable(getattr(module, attr, None)), f"{dotted}: {module_name} has no callable {attr!r}"
