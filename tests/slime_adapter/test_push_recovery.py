"""``epic_slime.slime.stream.push_recovery``: before slime's distributed connect, the update group a killed driver
left on each engine is destroyed (the real server refuses a second group of the same name:
tests/slime_adapter/test_real_router_driver_faults.py shows it, and the resume that needs this)."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import sys
import types

import pytest

from epic_slime.slime.stream import push_recovery


class _Engine:
    """An engine actor as slime's updater holds it: ``destroy_weights_update_group.remote`` -> a future of
    slime's answer (the server's JSON, or None where slime swallowed the HTTP error of a missing group)."""

    def __init__(self, has_group: bool, log: list):
        self.has_group, self.log = has_group, log
        self.destroy_weights_update_group = types.SimpleNamespace(remote=self._destroy)

    def _destroy(self, group_name):
        self.log.append(("destroy", group_name))
        done = concurrent.futures.Future()
        done.set_result({"success": True} if self.has_group else None)
        self.has_group = False
        return done


def _get(refs):
    return [r.result() for r in refs]


def test_every_engine_is_asked_and_the_answers_come_back_in_order():
    log = []
    engines = [_Engine(True, log), _Engine(False, log)]
    answers = push_recovery.clear_stale_update_group(engines, "slime-pp_0", _get)
    assert answers == [{"success": True}, None]
    assert log == [("destroy", "slime-pp_0"), ("destroy", "slime-pp_0")]


def test_the_reset_runs_before_the_connect_with_its_group_name_and_wraps_once(monkeypatch):
    log = []
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(get=_get))

    def connect(args, group_name, rollout_engines, engine_gpu_counts=None):
        log.append(("connect", group_name, engine_gpu_counts))
        return "group"

    wrapped = push_recovery.stale_group_reset(connect)
    assert push_recovery.stale_group_reset(wrapped) is wrapped
    engines = [_Engine(True, log)]
    assert wrapped(None, "slime-pp_1", engines, engine_gpu_counts=[1]) == "group"
    assert log == [("destroy", "slime-pp_1"), ("connect", "slime-pp_1", [1])]


@pytest.mark.skipif(
    importlib.util.find_spec("slime") is None or importlib.util.find_spec("megatron") is None,
    reason="needs slime's source and megatron.core (the slime-contract extra)",
)
def test_install_wraps_slimes_own_connect_once(monkeypatch):
    from slime.backends.megatron_utils.update_weight import update_weight_from_distributed as module

    # slime's own function (another test's train hook may have wrapped it already in this process)
    original = getattr(
        module.connect_rollout_engines_from_distributed, "__wrapped__", module.connect_rollout_engines_from_distributed
    )
    monkeypatch.setattr(module, "connect_rollout_engines_from_distributed", original)
    push_recovery.install_stale_group_reset()
    push_recovery.install_stale_group_reset()
    installed = module.connect_rollout_engines_from_distributed
    assert installed is not original and installed.__wrapped__ is original


def test_the_driver_adds_the_push_hook_for_external_engines_and_slimes_own():
    """External engines outlive a killed driver: the driver adds the push-mode train hook (which installs the
    reset) for them in abort mode; slime's own engines get it too (its name check; the reset finds no group)."""
    from epic_slime.slime.cli.command_line import driver_argv
    from epic_slime.slime.cli.flags import PUSH_TRAIN_HOOK_PATH

    base = ["--weight-push-mode", "abort"]
    external = driver_argv(base + ["--rollout-external-engine-addrs", "10.0.0.1:30000", "10.0.0.2:30000"])
    assert external[external.index("--custom-megatron-init-path") + 1] == PUSH_TRAIN_HOOK_PATH
    own = driver_argv(base)
    assert own[own.index("--custom-megatron-init-path") + 1] == PUSH_TRAIN_HOOK_PATH
