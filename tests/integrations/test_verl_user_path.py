"""verl as docs/integrations.md tells its users to install it (issue 46 item 5), not only as the main
venv carries it (verl without its dependencies, .ci/verl-no-deps.txt, for tests/integrations/test_verl.py).

``.ci/verl_venv.sh`` builds a venv of its own with verl 0.9.1 and the dependency set verl declares, then
installs this checkout into it with ``--no-deps``: the page's two commands. ``.ci/run`` builds it (cached)
and exports its python as ``EPIC_SLIME_VERL_PYTHON``; with ``EPIC_SLIME_REQUIRE_VERL_VENV=1`` (CI) its
absence fails instead of skipping.

Why not ``pip install "epic-slime[verl]"`` (what the page said before): the project's own
``math-verify[antlr4-13-2]`` pins antlr4's runtime at 4.13.2, verl's Hydra 1.3 needs 4.9, and pip resolves
the two by falling back to hydra-core 0.11 and omegaconf 1.4, with which ``verl.trainer.ppo.core_algos``
fails to import (measured: docs/integrations.md). So the page installs verl first, with its own pins, and
the plug-in beside it without touching them.
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / ".ci" / "verl_venv.sh"
PYTHON_ENV, REQUIRE_ENV = "EPIC_SLIME_VERL_PYTHON", "EPIC_SLIME_REQUIRE_VERL_VENV"


def _page_commands() -> list[str]:
    """The `pip install` lines of the verl section's first code block."""
    page = (REPO / "docs" / "integrations.md").read_text()
    section = page.split("\n## verl\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.startswith("pip install")]


def _script_commands() -> list[str]:
    """The script's installs into the venv, written the way a user types them."""
    out = []
    for line in SCRIPT.read_text().splitlines():
        m = re.search(r'"\$py" -m (pip install .*?)\s*(>&2)?\)?$', line.strip())
        if m and " -q " not in f" {m.group(1)} ":  # -q: the CI-only steps (pip itself, the CPU torch)
            out.append(m.group(1))
    return out


def test_the_pages_install_commands_are_the_ones_ci_runs():
    page = _page_commands()
    assert page == ['pip install "verl==0.9.1"', "pip install --no-deps -e ."], page
    assert _script_commands() == page
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(rf'{PYTHON_ENV}="\$\(env -u PYTHONPATH bash \.ci/verl_venv\.sh \| tail -n 1\)"', ci)
    assert f"export {PYTHON_ENV}" in ci and f"export {REQUIRE_ENV}=1" in ci


def test_there_is_no_extra_that_resolves_verl_beside_the_project():
    """`pip install "epic-slime[verl]"` resolved to hydra-core 0.11 (see the module docstring): the extra
    is gone, so nobody installs that way by habit; the page's path is the tested one."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "verl" not in extras
    assert not any("[verl]" in command for command in _page_commands())


_USER_CHECK = """
import json, sys
import verl  # loads every verl.plugins entry point: the installed epic-slime's, nothing else imports it here
from hydra import compose, initialize_config_dir
from importlib.metadata import version
from pathlib import Path
from verl.trainer.ppo import core_algos
from epic_slime.integrations import exported_modes, verl_loss_name  # the package, not its verl module

def registered(name):
    try:
        return getattr(core_algos.get_policy_loss_fn(name), "epic_slime_mode", None)
    except ValueError:
        return None

modes = {m: registered(verl_loss_name(m)) for m in exported_modes()}
adapter = sys.modules.get("epic_slime.integrations.verl")
# the page's one setting, as verl's trainer reads it: a Hydra override of verl's own ppo_trainer config
config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
with initialize_config_dir(config_dir=config_dir, version_base=None):
    cfg = compose("ppo_trainer", overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=epic"])
loss_mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
finite = None
if registered(loss_mode):
    import torch
    old = -torch.rand(2, 3, dtype=torch.float64) - 0.1
    new = (old + 0.01).requires_grad_()
    ones = torch.ones(2, 3, dtype=torch.float64)
    loss, _ = core_algos.get_policy_loss_fn(loss_mode)(old, new, ones, ones.bool(), "token-mean")
    loss.backward()
    finite = bool(torch.isfinite(loss).item() and torch.isfinite(new.grad).all().item())
print(json.dumps({
    "adapter": adapter and adapter.__file__, "loss_mode": loss_mode, "modes": modes, "loss_finite": finite,
    "versions": {p: version(p) for p in ("verl", "torch", "transformers", "hydra-core", "omegaconf")},
}))
"""


def test_verl_installed_as_the_page_says_loads_the_plugin_and_reads_the_setting():
    python = os.environ.get(PYTHON_ENV)
    if not python:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {PYTHON_ENV} is not set (.ci/run builds it with .ci/verl_venv.sh)")
        pytest.skip(f"{PYTHON_ENV} is not set: verl's own venv is built by .ci/verl_venv.sh (.ci/run does)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VERL_USE_EXTERNAL_PLUGINS")}
    out = subprocess.run(
        [python, "-c", textwrap.dedent(_USER_CHECK)], env=env, cwd="/", capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    from epic_slime.integrations import exported_modes

    got = json.loads(out.stdout.strip().splitlines()[-1])
    # every mode registered by `import verl` alone (the entry point), from this checkout (the editable install)
    assert got["modes"] == {mode: mode for mode in exported_modes()}, got["modes"]
    assert got["adapter"] and Path(got["adapter"]).resolve().is_relative_to(REPO), got["adapter"]
    assert got["loss_mode"] == "epic"
    assert got["loss_finite"]
    assert got["versions"]["verl"] == "0.9.1" and got["versions"]["hydra-core"].startswith("1."), got["versions"]
