"""Each patch of the CPU Megatron harness (tests/support/megatron_cpu.py) is still needed: the worker
run with that one patch left out fails on the obstacle the patch names (one EPIC step through slime's
train_one_step; TP = 2 for the norm patch, which only SP needs). A patch that a newer megatron-core no
longer needs turns its case red here. The full set passing is shown by test_megatron_loss.py.
The harness refuses a megatron-core other than the pin, with a message naming both versions."""

from __future__ import annotations

import pytest

from support.megatron_run import finish_all, skip_reason, start

pytestmark = pytest.mark.slow
if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)

# patch -> (TP, a line the failing run's log must hold: the obstacle itself)
OBSTACLES = {
    "current_device": (1, "Torch not compiled with CUDA enabled"),
    "cuda_device_mode": (1, "Torch not compiled with CUDA enabled"),
    "te_general_gemm": (1, "name 'te_general_gemm' is not defined"),
    "cuda_tensor_type": (1, "assert param.grad.type() == 'torch.cuda.FloatTensor'"),
    "sequence_parallel_norm": (2, "sequence parallel not supported by torch LayerNorm"),
}


@pytest.fixture(scope="module")
def runs_without(tmp_path_factory):
    """All five runs at once (each a process of its own), then their logs."""
    tmp = tmp_path_factory.mktemp("megatron_patches")
    outs = {name: tmp / f"{name}.json" for name in OBSTACLES}
    procs = {
        name: start("smoke", tp, outs[name], EPIC_SLIME_MEGATRON_SKIP_PATCH=name) for name, (tp, _) in OBSTACLES.items()
    }
    return finish_all(procs, outs, timeout=600)


def test_every_patch_is_listed_here():
    from support.megatron_cpu import PATCHES

    assert set(PATCHES) == set(OBSTACLES)


@pytest.mark.parametrize("patch", sorted(OBSTACLES))
def test_the_worker_fails_on_its_obstacle_without_the_patch(runs_without, patch):
    rc, log, result = runs_without[patch]
    assert rc != 0 and result is None, f"{patch}: the worker ran without it; is the patch still needed?\n{log}"
    assert OBSTACLES[patch][1] in log, f"{patch}: failed for another reason:\n{log}"


def test_a_megatron_core_other_than_the_pin_is_refused(monkeypatch):
    from megatron.core import package_info

    from support.megatron_cpu import check_version

    check_version()  # the installed one is the pin
    monkeypatch.setattr(package_info, "__version__", "0.17.0")
    with pytest.raises(RuntimeError, match=r"pinned to megatron-core==0\.16\.1 .*found '0\.17\.0'"):
        check_version()


def test_an_unknown_patch_name_is_refused(monkeypatch):
    from support.megatron_cpu import SKIP_PATCH_ENV, patch_active

    monkeypatch.setenv(SKIP_PATCH_ENV, "current_devise")
    with pytest.raises(ValueError, match=r"unknown patch name\(s\) \['current_devise'\]"):
        patch_active("current_device")
