"""The scripts under .ci/ (not a package) loaded as modules, for the tests of their functions."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

CI = Path(__file__).resolve().parents[2] / ".ci"


def load(name: str) -> ModuleType:
    """.ci/<name>.py as a fresh module."""
    spec = importlib.util.spec_from_file_location(f"ci_{name}", CI / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
