"""--weight-push-mode (epic_slime.slime.push_mode): the flag and its checks, the train hook around
slime 624b824a's own UpdateWeightFromDistributed.update_weights (run against the SGLang stand-in
over HTTP), and the rollout hook's prefix-cache keys on slime's own rollout functions."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import re
import sys
import types

import pytest

from epic_slime.slime import push_mode
from epic_slime.slime.cli.command_line import driver_argv
from epic_slime.slime.cli.dry_run import check_argv
from epic_slime.slime.cli.flags import PUSH_TRAIN_HOOK_PATH, ROLLOUT_FUNCTION_PATH, ProjectFlagError
from epic_slime.slime.routing import HOOK_PATH as R3_TRAIN_HOOK
from support.slime_push import OneRankDist

BASE = [
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
]
_SLIME = importlib.util.find_spec("slime") is not None and importlib.util.find_spec("megatron") is not None
needs_slime = pytest.mark.skipif(not _SLIME, reason="needs slime's source on the path (SLIME_PATH) and megatron-core")


def _init_path(argv):
    out = driver_argv(argv)
    return out[out.index("--custom-megatron-init-path") + 1] if "--custom-megatron-init-path" in out else None


def test_default_push_mode_is_abort_and_still_gets_the_push_hook_for_its_name_check():
    """Every push is name-checked on the train ranks, also in abort mode without R3 (the hook's
    holding half stays off there: test_without_the_flag_the_mode_is_abort_and_no_hook_is_installed)."""
    config, args, _ = check_argv(BASE)
    assert args.weight_push_mode == "abort"
    assert _init_path(BASE) == PUSH_TRAIN_HOOK_PATH
    assert _init_path(BASE + ["--use-rollout-routing-replay"]) == PUSH_TRAIN_HOOK_PATH
    check_argv(BASE + ["--use-rollout-routing-replay", "--custom-megatron-init-path", R3_TRAIN_HOOK])  # still accepted


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_holding_modes_install_the_push_hook_which_also_carries_r3(mode):
    assert _init_path(BASE + ["--weight-push-mode", mode]) == PUSH_TRAIN_HOOK_PATH
    argv = BASE + ["--weight-push-mode", mode, "--use-rollout-routing-replay"]
    assert _init_path(argv) == PUSH_TRAIN_HOOK_PATH
    check_argv(argv + ["--custom-megatron-init-path", PUSH_TRAIN_HOOK_PATH])  # R3's check accepts it


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--colocate", "--max-staleness", "0"], "--colocate"),
        (["--update-weight-transport", "disk"], "--update-weight-transport disk"),
        (["--custom-megatron-init-path", "my.init"], "'my.init'"),
    ],
)
@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_holding_modes_refuse_what_their_hook_cannot_reach(extra, message, mode):
    with pytest.raises(ProjectFlagError, match=f"--weight-push-mode {mode} .*{re.escape(message)}"):
        check_argv(BASE + ["--weight-push-mode", mode] + extra)
    check_argv(BASE + extra)  # fine in abort mode


def test_check_names_a_bad_mode_from_a_config_file():
    assert "'later'" in push_mode.check_push_setup(argparse.Namespace(weight_push_mode="later"))


def test_the_train_hook_chains_r3_in_either_mode(monkeypatch):
    from epic_slime.slime import routing

    from epic_slime.slime.stream import push_recovery

    calls = []
    monkeypatch.setattr(routing, "install_train_hook", lambda args: calls.append(args))
    # and the reset of a killed driver's leftover update group before slime's connect (push_recovery)
    monkeypatch.setattr(push_recovery, "install_stale_group_reset", lambda: calls.append("stale group reset"))
    args = argparse.Namespace(
        use_rollout_routing_replay=True, rollout_function_path=ROLLOUT_FUNCTION_PATH, weight_push_mode="abort"
    )
    push_mode.install_train_hook(args)
    assert calls == [args, "stale group reset"]


# ---- the train hook on slime's own update_weights, against the stand-in


@pytest.fixture
def slime_updater(monkeypatch, tmp_path):
    """start(mode) -> (stand-in, engine actor, slime's updater) with the push-mode train hook
    installed for ``mode``; slime's class is restored afterwards."""
    if not _SLIME:
        pytest.skip("needs slime's source on the path (SLIME_PATH) and megatron-core")
    from support.sglang_client import standin_factory
    from support.slime_push import EngineActorStandIn, RayStandIn, make_updater, updater_module

    module = updater_module()
    monkeypatch.setattr(module, "ray", RayStandIn)
    monkeypatch.setattr(module, "dist", OneRankDist)
    monkeypatch.setattr(module, "get_gloo_group", lambda: None)
    monkeypatch.setattr(
        module.UpdateWeightFromDistributed, "update_weights", module.UpdateWeightFromDistributed.update_weights
    )
    # the train hook also wraps slime's connect (push_recovery): restored afterwards as well
    monkeypatch.setattr(
        module, "connect_rollout_engines_from_distributed", module.connect_rollout_engines_from_distributed
    )

    with standin_factory(tmp_path) as start_server:

        def start(mode):
            from epic_slime.runtime.model import ModelConfig, build_policy
            from epic_slime.runtime.task import Tokenizer

            server = start_server(
                "--long-every",
                "1",
                "--long-min-new-tokens",
                "48",
                "--long-max-new-tokens",
                "48",
                "--step-seconds",
                "0.03",
            )
            push_mode.install_train_hook(argparse.Namespace(weight_push_mode=mode, use_rollout_routing_replay=False))
            engine = EngineActorStandIn(server.url, flush_retry_s=0.05)
            tok = Tokenizer()
            model = build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=1)
            return server, engine, make_updater(argparse.Namespace(), model, [engine])

        yield start


def _push_meets_a_running_request(server, updater):
    from support.sglang_client import tokens_of

    answer = server.submit(tokens_of("12+7="))
    server.wait_for(lambda s: s.get("decode_steps", 0) >= 3)
    updater.update_weights()
    return answer.result(60), server.stats()


def test_in_place_hook_pauses_slimes_updater_in_place_without_a_flush(slime_updater):
    server, engine, updater = slime_updater("in_place")
    assert push_mode.installed()["train"]
    got, stats = _push_meets_a_running_request(server, updater)
    assert got["meta_info"]["finish_reason"]["type"] == "length" and len(got["output_ids"]) == 48
    assert got["meta_info"]["weight_version"] == "1"  # slime's version + 1, reported at answer time
    assert stats.get("aborted", 0) == 0 and stats["pauses_in_place"] == 1 and stats.get("flush_calls", 0) == 0
    assert stats["spanning_answers"] == 1 and stats["weight_buckets"] == 3
    assert engine.calls == [
        "init_weights_update_group",
        "pause_generation {'mode': 'in_place'}",
        *["update_weights_from_distributed"] * 3,
        "continue_generation {}",
    ]
    assert updater.rollout_engines == [engine]  # the views last one push


def test_retract_hook_pauses_slimes_updater_with_retract_without_a_flush(slime_updater):
    """The running request goes back to the queue with its tokens and finishes on the new weights:
    one answer, all 48 tokens, one retraction, the new version; no abort, no flush."""
    server, engine, updater = slime_updater("retract")
    assert push_mode.installed()["train"]
    got, stats = _push_meets_a_running_request(server, updater)
    meta = got["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and len(got["output_ids"]) == 48
    assert meta["weight_version"] == "1" and meta["num_retractions"] == 1
    assert stats.get("aborted", 0) == 0 and stats["pauses_retract"] == 1 and stats["retracted"] == 1
    assert stats.get("flush_calls", 0) == 0 and stats.get("pauses_in_place", 0) == 0
    assert engine.calls == [
        "init_weights_update_group",
        "pause_generation {'mode': 'retract'}",
        *["update_weights_from_distributed"] * 3,
        "continue_generation {}",
    ]


def test_without_the_hook_slimes_updater_aborts_and_flushes(slime_updater):
    server, engine, updater = slime_updater("abort")
    assert not push_mode.installed()["train"]
    got, stats = _push_meets_a_running_request(server, updater)
    assert got["meta_info"]["finish_reason"]["type"] == "abort" and len(got["output_ids"]) < 48
    assert stats["pauses_abort"] == 1 and stats["flushes"] == 1 and stats.get("flush_failed", 0) == 0
    assert engine.calls[1:3] == ["pause_generation {}", "flush_cache"]


# ---- the rollout hook on slime's own rollout functions


@needs_slime
def test_rollout_hook_keys_each_group_submission_and_each_eval(monkeypatch):
    from slime.rollout import sglang_rollout
    from slime.utils import http_utils

    sent = []

    async def post(url, payload, max_retries=60, headers=None):
        sent.append((url, payload))
        return {}

    async def group_call(args, group, sampling_params, evaluation=False):  # the shape of generate_and_rm_group
        await asyncio.gather(
            *[asyncio.create_task(sglang_rollout.post("http://r/generate", {"input_ids": [s]})) for s in group]
        )

    async def eval_call(args, rollout_id):
        await asyncio.gather(
            *[asyncio.create_task(http_utils.post("http://r/generate", {"input_ids": [i]})) for i in range(3)]
        )

    for module, name, fn in (
        (sglang_rollout, "post", post),
        (http_utils, "post", post),
        (sglang_rollout, "generate_and_rm_group", group_call),
        (sglang_rollout, "eval_rollout", eval_call),
    ):
        monkeypatch.setattr(module, name, fn)
    assert not push_mode.install_rollout_hook(argparse.Namespace(weight_push_mode="abort"))
    assert sglang_rollout.generate_and_rm_group is group_call
    assert push_mode.install_rollout_hook(argparse.Namespace(weight_push_mode="in_place"))
    assert push_mode.install_rollout_hook(argparse.Namespace(weight_push_mode="in_place"))  # idempotent
    assert push_mode.install_rollout_hook(argparse.Namespace(weight_push_mode="retract"))  # retract keys too

    async def run():
        await sglang_rollout.generate_and_rm_group(None, [1, 2, 3], {})
        await sglang_rollout.generate_and_rm_group(None, [4, 5], {})
        await sglang_rollout.eval_rollout(None, 0)
        await sglang_rollout.post("http://r/generate", {"input_ids": [9]})  # outside any submission
        await sglang_rollout.post("http://r/abort_request", {"abort_all": True})

    asyncio.run(run())
    keys = [p.get("extra_key") for _, p in sent]
    assert len(set(keys[:3])) == 1 and len(set(keys[3:5])) == 1 and len(set(keys[5:8])) == 1
    assert len({keys[0], keys[3], keys[5], keys[8]}) == 4 and all(k.startswith(push_mode.KEY_PREFIX) for k in keys[:9])
    assert keys[9] is None  # not a /generate request


@pytest.mark.parametrize(
    "endpoint", ["update_weights_from_disk", "update_weights_from_tensor", "update_weights_from_distributed"]
)
def test_every_weight_update_endpoint_is_sent_without_a_cache_flush(endpoint):
    """SGLang flushes the cache after a weight update by default, which kills a server holding a request
    in place: each of the three update endpoints (disk, tensor, distributed) goes with flush_cache false."""
    payload = {"weight_version": "3"}
    assert push_mode.no_flush(endpoint, payload) == {"weight_version": "3", "flush_cache": False}
    assert payload == {"weight_version": "3"}  # the caller's payload is not changed


def test_other_endpoints_keep_their_payload():
    assert push_mode.no_flush("pause_generation", {"mode": "in_place"}) == {"mode": "in_place"}
    assert push_mode.no_flush("flush_cache", None) == {}


# ---- from the mutation pass of issue 28 item 7: the paths above leave untested in the failing state: the
# prefix-cache key on requests it must not touch, the default when the flag is absent, the engines handed
# back when slime's updater raises mid-push. No slime needed: the project's wrappers around stand-ins at
# slime's call shapes (each test names the mutants of tests/mutation/mutants.yaml it was written for).
# mutant: push_key_on_control_requests
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


# mutant: push_key_overwrites_callers_key
def test_a_callers_own_prefix_key_is_kept():
    payload = {"input_ids": [1, 2], "extra_key": "mine"}
    assert push_mode.with_prefix_key(payload, "http://h/generate") is payload
    keyed = push_mode.with_prefix_key({"input_ids": [1, 2]}, "http://h/generate/")
    assert keyed["extra_key"].startswith(push_mode.KEY_PREFIX) and keyed["input_ids"] == [1, 2]


# mutant: push_mode_default_in_place
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


# mutants: push_engines_not_handed_back, push_flush_ref_not_an_object_ref
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


# mutant: push_check_transport_default_disk
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


# mutant: driver_adds_a_second_init_path
@pytest.mark.parametrize("extra", [["--weight-push-mode", "in_place"], ["--use-rollout-routing-replay"]])
def test_a_train_hook_named_on_the_command_line_is_not_added_again(extra):
    from epic_slime.slime.cli.command_line import driver_argv
    from epic_slime.slime.cli.flags import PUSH_TRAIN_HOOK_PATH, ROLLOUT_FUNCTION_PATH
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
