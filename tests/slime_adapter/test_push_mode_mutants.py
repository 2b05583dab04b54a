"""--weight-push-mode's paths that test_push_mode.py leaves untested in the failing state (issue 28
item 7's mutation pass): the prefix-cache key on requests it must not touch, the default when the
flag is absent, and the engines handed back when slime's updater raises mid-push. No slime needed:
these run the project's own wrappers around stand-ins at slime's call shapes."""

from __future__ import annotations

import argparse
import sys
import types

import pytest

from epic_slime.slime import push_mode


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:30000/pause_generation",
        "http://h/continue_generation",
        "http://h/abort_request",
        "http://h/generate_from_disk",
    ],
)
def test_only_generate_requests_get_a_prefix_key(url):
    """SGLang's control requests (``PauseGenerationReqInput`` and the rest) have no ``extra_key``
    field: a key added to their body would be refused."""
    payload = {"mode": "in_place"}
    assert push_mode.with_prefix_key(payload, url) is payload


def test_a_callers_own_prefix_key_is_kept():
    payload = {"input_ids": [1, 2], "extra_key": "mine"}
    assert push_mode.with_prefix_key(payload, "http://h/generate") is payload
    keyed = push_mode.with_prefix_key({"input_ids": [1, 2]}, "http://h/generate/")
    assert keyed["extra_key"].startswith(push_mode.KEY_PREFIX) and keyed["input_ids"] == [1, 2]


def test_without_the_flag_the_mode_is_abort_and_no_hook_is_installed():
    """Args that never saw ``--weight-push-mode`` (slime's own parser, another driver) keep slime's
    abort-and-flush push."""
    assert push_mode.push_mode_of(argparse.Namespace()) == "abort"
    assert push_mode.push_mode_of(argparse.Namespace(weight_push_mode=None)) == "abort"
    assert not push_mode.install_rollout_hook(argparse.Namespace())
    assert not push_mode.install_push_hook(argparse.Namespace())


class _Engine:
    """An SGLang engine actor handle as slime's updater sees it: methods with ``.remote``."""

    def __init__(self, calls):
        self.calls = calls
        self._make_request = types.SimpleNamespace(remote=lambda path, body: calls.append((path, body)) or "ref")
        self.flush_cache = types.SimpleNamespace(remote=lambda: calls.append("flush_cache") or "ref")


def test_the_engines_are_handed_back_when_the_push_raises(monkeypatch):
    """A crash in the middle of a push (a bucket that fails to load): slime's updater object keeps
    its own engine handles, not the in-place views, so the next push wraps them once."""
    module = types.ModuleType("fake_slime_updater")
    module.ray = types.SimpleNamespace(put=lambda value: "done-ref")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    calls: list = []
    seen: list = []

    def update_weights(self):
        seen.extend(self.rollout_engines)
        for engine in self.rollout_engines:
            engine.pause_generation.remote()
            assert engine.flush_cache.remote() == "done-ref"  # skipped: SGLang refuses it while requests run
        raise RuntimeError("bucket 2 failed")

    update_weights.__module__ = module.__name__
    wrapped = push_mode.holding_update_weights(update_weights)
    assert push_mode.holding_update_weights(wrapped) is wrapped  # idempotent
    engines = [_Engine(calls), _Engine(calls)]
    updater = types.SimpleNamespace(rollout_engines=list(engines))
    with pytest.raises(RuntimeError, match="bucket 2 failed"):
        wrapped(updater)
    assert updater.rollout_engines == engines and all(e is o for e, o in zip(updater.rollout_engines, engines))
    assert all(isinstance(v, push_mode.HoldingEngine) for v in seen) and len(seen) == 2
    assert calls == [("pause_generation", {"mode": "in_place"})] * 2  # no flush_cache reached the engines


def test_in_place_from_args_without_a_transport_is_slimes_nccl_default():
    """Args built without slime's --update-weight-transport (a config file, another driver) mean
    slime's default, nccl: accepted."""
    assert push_mode.check_push_setup(argparse.Namespace(weight_push_mode="in_place")) is None
    assert (
        push_mode.check_push_setup(argparse.Namespace(weight_push_mode="in_place", update_weight_transport=None))
        is None
    )
    assert "disk" in push_mode.check_push_setup(
        argparse.Namespace(weight_push_mode="in_place", update_weight_transport="disk")
    )


@pytest.mark.parametrize("extra", [["--weight-push-mode", "in_place"], ["--use-rollout-routing-replay"]])
def test_a_train_hook_named_on_the_command_line_is_not_added_again(extra):
    from epic_slime.slime.command_line import driver_argv
    from epic_slime.slime.flags import PUSH_TRAIN_HOOK_PATH, ROLLOUT_FUNCTION_PATH
    from epic_slime.slime.routing import HOOK_PATH as R3_TRAIN_HOOK

    hook = PUSH_TRAIN_HOOK_PATH if "in_place" in extra else R3_TRAIN_HOOK
    argv = [
        "--loss-type",
        "custom_loss",
        "--custom-loss-function-path",
        "epic_slime.slime.loss.policy_loss",
        "--rollout-function-path",
        ROLLOUT_FUNCTION_PATH,
        "--rollout-batch-size",
        "64",
        "--n-samples-per-prompt",
        "8",
        *extra,
        "--custom-megatron-init-path",
        hook,
    ]
    out = driver_argv(argv)
    assert out.count("--custom-megatron-init-path") == 1 and out[out.index("--custom-megatron-init-path") + 1] == hook
