"""The adapters add no loss of their own (framework-free: runs without verl or TRL installed).

Every mode an adapter offers is a registry mode (documented in docs/losses.md: tests/project/test_docs.py),
and the adapters reach the core only through `compute_policy_loss`: no mode function, no registration,
no private name of the losses package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from epic_slime.integrations import PARAMS_ENV, VERL_OWN_MODES, exported_modes, params_from_env, verl_loss_name
from epic_slime.losses import LOSS_MODES, PolicyLossInputError

ADAPTERS = sorted((Path(__file__).resolve().parents[2] / "epic_slime" / "integrations").glob("*.py"))


def test_exported_modes_are_the_registry_without_the_top_k_modes():
    assert set(exported_modes()) == {m for m, spec in LOSS_MODES.items() if not spec.needs_topk}
    assert {"epic", "epic_raw_prob", "epic_cumulative", "ctpo", "ripo", "cppo", "bandpo"} <= set(exported_modes())


def test_verl_names_keep_verls_own_modes_apart():
    names = [verl_loss_name(m) for m in exported_modes()]
    assert len(set(names)) == len(names)
    assert verl_loss_name("epic") == "epic" and verl_loss_name("gspo") == "epic_slime_gspo"
    assert set(VERL_OWN_MODES) <= set(exported_modes())
    assert not set(VERL_OWN_MODES) & set(names)


@pytest.mark.parametrize("path", ADAPTERS, ids=[p.name for p in ADAPTERS])
def test_an_adapter_reaches_the_losses_only_through_the_public_entry_point(path):
    tree = ast.parse(path.read_text())
    imported = {
        (node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    from_losses = {(m, n) for m, n in imported if m and m.startswith("epic_slime.losses")}
    allowed_modules = {"epic_slime.losses", "epic_slime.losses.kl"}
    assert {m for m, _ in from_losses} <= allowed_modules, from_losses
    assert not any(n.startswith("_") or n in ("register_loss", "LossSpec", "TokenTerms") for _, n in from_losses)
    calls = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert "register_loss" not in calls


def test_the_framework_free_package_imports_no_framework():
    import subprocess
    import sys

    code = (
        "import sys, epic_slime.integrations, epic_slime.losses; "
        "print(sorted(m for m in ('verl', 'trl', 'accelerate', 'datasets') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.strip() == "[]"


def test_parameters_from_the_environment_are_a_json_object():
    assert params_from_env({}) == {}
    assert params_from_env({PARAMS_ENV: ' {"delta_high": 0.003} '}) == {"delta_high": 0.003}
    with pytest.raises(PolicyLossInputError, match=rf"{PARAMS_ENV}='\[1\]' must be a JSON object"):
        params_from_env({PARAMS_ENV: "[1]"})
    with pytest.raises(PolicyLossInputError, match=rf"{PARAMS_ENV}='{{delta' is not JSON"):
        params_from_env({PARAMS_ENV: "{delta"})


def test_only_the_adapters_import_a_framework():
    package = Path(__file__).resolve().parents[2] / "epic_slime"
    frameworks = {"verl", "trl"}
    importers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if any(name.split(".")[0] in frameworks for name in names):
                importers.add(path.relative_to(package).as_posix())
    assert importers == {"integrations/verl.py", "integrations/trl.py"}
