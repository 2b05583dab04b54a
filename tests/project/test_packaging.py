"""pyproject.toml against the packages it names: every extra asked of a dependency is one that the
installed version declares, spelled as it declares it (pip matches extras by their declared name)."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _requirements() -> list[str]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return [*project["dependencies"], *(r for group in extras.values() for r in group)]


def _with_extras() -> list[tuple[str, list[str]]]:
    out = []
    for req in _requirements():
        m = re.match(r"^\s*([A-Za-z0-9._-]+)\s*\[([^\]]+)\]", req)
        if m:
            out.append((m.group(1), [e.strip() for e in m.group(2).split(",")]))
    return out


@pytest.mark.parametrize("name,extras", _with_extras(), ids=[n for n, _ in _with_extras()])
def test_each_requested_extra_is_declared_by_the_installed_package(name, extras):
    try:
        declared = importlib.metadata.metadata(name).get_all("Provides-Extra") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed here")
    for extra in extras:
        assert extra in declared, f"{name}[{extra}]: {name} declares {declared}"


def test_math_verify_is_asked_for_its_antlr_extra():
    assert ("math-verify", ["antlr4-13-2"]) in _with_extras()
