"""The stand-in of tests/support/megatron_ray_run.py's rollout side, against the real class's source:
`megatron_ray_hook.HttpEngine` has slime's `SGLangEngine` methods with their parameters, and every engine
method slime calls on the path the run takes is one of them (the others are named, with why they are not
reached), so a slime upgrade that calls a new one is seen here rather than as a Ray error mid-run."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from support.slime_args import slime_path

if slime_path() is None:
    pytest.skip("slime's source is absent (SLIME_PATH or ../shared/vendor/slime-624b824a)", allow_module_level=True)

from support.megatron_ray_hook import HttpEngine  # noqa: E402

ROOT = Path(slime_path())
# the files whose engine calls the run reaches: the weight updater, external mode, the manager, the actor
CALLERS = (
    "slime/backends/megatron_utils/update_weight/update_weight_from_distributed.py",
    "slime/backends/sglang_utils/external.py",
    "slime/ray/rollout.py",
    "slime/backends/megatron_utils/actor.py",
    "slime/ray/actor_group.py",
)
NOT_REACHED = {
    "_get_current_node_ip_and_free_port": "port allocation for engines slime launches (not external mode)",
    "check_weights": "--check-weight-update-equal (off)",
    "post_process_weights": "compressed-tensors quantization (none)",
    "pull_weights": "the disk weight transport (the run pushes over gloo)",
    "update_weights_from_disk": "the disk weight transport",
    "release_memory_occupation": "--offload-rollout (off)",
    "resume_memory_occupation": "--offload-rollout (off)",
}


def _sglang_engine_methods() -> dict[str, list[str]]:
    tree = ast.parse((ROOT / "slime/backends/sglang_utils/sglang_engine.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SGLangEngine"]
    return {f.name: [a.arg for a in f.args.args] for f in cls.body if isinstance(f, ast.FunctionDef)}


def _stand_in_methods() -> dict[str, list[str]]:
    return {
        name: list(inspect.signature(fn).parameters)
        for name, fn in vars(HttpEngine).items()
        if inspect.isfunction(fn) and (name == "__init__" or not name.startswith("_"))
    }


def test_each_method_has_the_real_engines_name_and_parameters():
    real = _sglang_engine_methods()
    for name, params in _stand_in_methods().items():
        assert name in real, f"HttpEngine.{name} is not a method of slime's SGLangEngine"
        assert params == real[name], (name, params, real[name])


def test_every_engine_call_slime_makes_on_the_runs_path_is_forwarded():
    called = set()
    for path in CALLERS:
        called |= set(re.findall(r"engine\.(\w+)\.remote", (ROOT / path).read_text()))
    forwarded = set(_stand_in_methods()) - {"__init__"}
    assert called - forwarded == set(NOT_REACHED), sorted(called - forwarded)
