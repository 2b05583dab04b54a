"""What breaks against the real SGLang 0.5.15.post1 server when weights are pushed, each handled where a user
meets it (issue 38 item 4), tested on the session's real server (``real_engines``):

- the version: ``/get_weight_version`` is 404; ``served_probe.served_weight_version`` reads ``/model_info``,
  and the driver refuses the slime setting that calls the 404 (``--ci-test`` with a disk push);
- a push that answers ``success: true`` and loads nothing (transformers 5's fused expert names; the tied
  ``lm_head`` left out): ``served_probe.confirm_push`` catches it, ``hf_export.checkpoint_tensors``
  names the tensors as the server maps them;
- a flushing update while a request is held in place kills the server: the in-place engine view
  (``push_mode.HoldingEngine``) sends every weight update with ``flush_cache`` false.

Every test leaves the server on the exported initial weights at its launch version.
"""

from __future__ import annotations

import sys
from argparse import Namespace

import pytest
import torch

from support.real_sglang import MAX_NEW
from support.slime_args import slime_path

if slime_path() and slime_path() not in sys.path:  # the pushes use slime's own group set-up
    sys.path.insert(0, slime_path())


def _prompt(text: str) -> list[int]:
    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    return [tok.bos_id] + tok.encode(text)


PROBE = _prompt("9-4+8=Answer:13")


@pytest.fixture
def engines(real_engines):
    """The session's engines; afterwards back on the initial weights at the version they had."""
    from support.served_probe import served_weight_version

    version = served_weight_version(real_engines.server.url)
    yield real_engines
    assert real_engines.server.alive(), f"the real server died; log {real_engines.server.process.log_path}"
    from support.real_push import restore_initial_weights

    restore_initial_weights(real_engines, version)


def _other_model(seed: int = 1):
    from epic_slime.runtime.model import ModelConfig, build_policy
    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    return build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=seed).eval()


# ---------------------------------------------------------------- the version


def test_served_version_comes_from_model_info_where_get_weight_version_is_404(engines):
    from support.served_probe import served_weight_version

    server = engines.server
    server.post("/update_weight_version", {"new_version": "epic-7"}).raise_for_status()
    assert served_weight_version(server.url) == "epic-7"
    assert server.get("/get_weight_version").status_code == 404  # slime 624b824a's get_weight_version


@pytest.mark.parametrize(
    "transport,ci_test,refused", [("disk", True, True), ("disk", False, False), ("nccl", True, False)]
)
def test_ci_test_with_a_disk_push_is_refused_up_front(transport, ci_test, refused):
    """slime checks the version after a disk reload under --ci-test with the 404 endpoint: the driver
    refuses that pair with a one-line error naming both flags, and only that pair."""
    from epic_slime.slime.cli.checks import check_unsupported_settings
    from epic_slime.slime.cli.flags import ProjectFlagError

    args = Namespace(
        ci_test=ci_test,
        update_weight_transport=transport,
        update_weight_mode="full",
        advantage_estimator="grpo",
        use_critic=False,
    )
    if refused:
        with pytest.raises(ProjectFlagError, match="--ci-test.*--update-weight-transport disk.*/model_info"):
            check_unsupported_settings(args)
    else:
        check_unsupported_settings(args)


# ---------------------------------------------------------------- did the push take effect


def test_a_push_under_in_memory_names_answers_success_loads_nothing_and_is_caught(engines):
    """transformers 5's in-memory names (fused experts, the tied head absent): SGLang answers success and
    keeps serving the old weights; confirm_push says so."""
    from support.served_probe import PushNotApplied, confirm_push

    from support.real_push import push_distributed

    other = _other_model()
    named = {n: p.detach() for n, p in other.named_parameters() if ".mlp.experts." in n}
    assert named and all(n.endswith(("gate_up_proj", "down_proj")) for n in named)
    assert push_distributed(engines.server, named, "fused")["success"] is True
    with pytest.raises(PushNotApplied, match="does not serve the pushed weights"):
        confirm_push(engines.server.url, other, PROBE)
    confirm_push(engines.server.url, engines.model, PROBE)  # still the initial model


def test_a_push_without_the_untied_head_is_caught(engines):
    """The trainer's model is tied and the served checkpoint is not: a push of every checkpoint tensor
    but ``lm_head.weight`` leaves the served head on the old embedding."""
    from epic_slime.runtime.hf_export import checkpoint_tensors
    from support.served_probe import PushNotApplied, confirm_push

    from support.real_push import push_distributed

    other = _other_model()
    tensors = checkpoint_tensors(other)
    del tensors["lm_head.weight"]
    assert push_distributed(engines.server, tensors, "headless")["success"] is True
    with pytest.raises(PushNotApplied):
        confirm_push(engines.server.url, other, PROBE)


def test_a_push_of_the_checkpoint_tensors_takes_effect(engines):
    from epic_slime.runtime.hf_export import checkpoint_tensors
    from support.served_probe import confirm_push, mean_gap, model_logprobs, served_logprobs

    from support.real_push import push_distributed

    other = _other_model()
    assert push_distributed(engines.server, checkpoint_tensors(other), "pushed")["success"] is True
    gap = confirm_push(engines.server.url, other, PROBE)
    served = served_logprobs(engines.server.url, PROBE)
    # the pushed model's within bf16 noise, far from the initial one's
    assert gap < 0.01 < mean_gap(served, model_logprobs(engines.model, PROBE)), gap


def test_checkpoint_tensors_are_the_saved_checkpoints(tmp_path):
    """Independent reference: transformers' own save_pretrained (float32) of the same model."""
    import os

    from safetensors.torch import load_file

    from epic_slime.runtime.hf_export import checkpoint_tensors, export_checkpoint

    model = _other_model()
    export_checkpoint(model, tmp_path, "float32")
    saved = {}
    for name in os.listdir(tmp_path):
        if name.endswith(".safetensors"):
            saved.update(load_file(tmp_path / name))
    ours = checkpoint_tensors(model)
    assert sorted(ours) == sorted(saved) and "lm_head.weight" in ours
    assert all(torch.equal(ours[n].float(), saved[n]) for n in saved)


# ---------------------------------------------------------------- no flushing update while requests are held


def test_in_place_disk_update_is_sent_without_flush_and_the_server_survives(engines):
    """A request held by an in-place pause, then slime's ``update_weights_from_disk`` through the
    in-place view: sent with flush_cache false (SGLang's default flush would kill the server); the
    held request then finishes on the new version."""
    from epic_slime.slime.push_mode import HoldingEngine

    from support.slime_push import EngineActorStandIn

    class RefusesFlushingUpdates(EngineActorStandIn):
        """The test's safety net: a flushing update is not posted (it would kill the shared server)."""

        def _post(self, endpoint, payload):
            if endpoint.startswith("update_weights_from") and payload.get("flush_cache", True):
                raise AssertionError(f"flushing {endpoint} while a request is held: {payload}")
            return super()._post(endpoint, payload)

    server = engines.server
    actor = RefusesFlushingUpdates(server.url)
    view = HoldingEngine(actor, lambda: None)
    from support.conformance import wait_running

    prompt = _prompt("1+2=")
    # an idle CPU decodes the whole request in a fraction of a second: pause as soon as it runs, and try
    # again (after a continue) when it still finished first
    for _ in range(10):
        held = server.submit(
            prompt, sampling_params={"max_new_tokens": MAX_NEW - len(prompt), "temperature": 1.0, "ignore_eos": True}
        )
        wait_running(server, 1)
        view.pause_generation.remote().result(60)
        if not held.done():
            break
        view.continue_generation.remote().result(60)
        actor.calls.clear()
    assert not held.done(), "the request finished before the pause in 10 tries: nothing was held"
    try:
        view.update_weights_from_disk.remote(model_path=engines.model_dir, weight_version="in-place-disk").result(120)
    finally:
        view.continue_generation.remote().result(60)
    answer = held.result(300)
    assert answer["meta_info"]["weight_version"] == "in-place-disk"
    assert len(answer["output_ids"]) == MAX_NEW - len(prompt)
    assert server.alive()
    assert [c.split(" ", 1)[0] for c in actor.calls] == [
        "pause_generation",
        "update_weights_from_disk",
        "continue_generation",
    ]


# ---------------------------------------------------------------- the tensor path with CPU tensors

_TENSOR_PUSH_CHILD = """
import json, sys
import requests
from epic_slime.runtime.hf_export import checkpoint_tensors
from epic_slime.runtime.model import ModelConfig, build_policy
from epic_slime.runtime.task import Tokenizer
from support.tensor_push import cpu_tensor_update
tok = Tokenizer()
model = build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=1)
body, keep = cpu_tensor_update(checkpoint_tensors(model), weight_version="tensor-path")
http = requests.Session(); http.trust_env = False
reply = http.post(sys.argv[1] + "/update_weights_from_tensor", json=body, timeout=300)
print(json.dumps({"status": reply.status_code, "answer": reply.json()}), flush=True)
"""


def test_cpu_tensor_update_loads_and_holds_no_pipe_of_the_sender(engines):
    """The sender in a child process whose stdout is a pipe, as a piped test run: the update loads
    (file_system sharing; the default strategy kills the server), the pushed model is served, and the
    pipe closes when the child exits (torch_shm_manager, which outlives it, does not hold it)."""
    import json
    import os
    import subprocess

    from support.served_probe import confirm_push, served_weight_version

    from support.slime_args import REPO

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))  # support.tensor_push
    child = subprocess.Popen(
        [sys.executable, "-c", _TENSOR_PUSH_CHILD, engines.server.url],
        env=env,
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        out, _ = child.communicate(timeout=300)  # returns only once every writer of the pipe is gone
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail("the sender's stdout stayed open after it exited: a process it started holds the pipe")
    answer = json.loads(out.decode().strip().splitlines()[-1])
    assert answer["status"] == 200 and answer["answer"]["success"] is True, answer
    assert engines.server.alive() and served_weight_version(engines.server.url) == "tensor-path"
    confirm_push(engines.server.url, _other_model(seed=1), PROBE)


def test_cpu_tensor_update_copies_and_restores_the_sharing_strategy():
    import torch.multiprocessing as mp

    from support.tensor_push import cpu_tensor_update

    before = mp.get_sharing_strategy()
    weight = torch.arange(6.0).reshape(2, 3)
    body, keep = cpu_tensor_update({"w": weight}, weight_version="3")
    assert mp.get_sharing_strategy() == before
    assert not weight.is_shared() and keep[0][1].is_shared() and torch.equal(keep[0][1], weight)
    assert body["flush_cache"] is False and body["weight_version"] == "3" and len(body["serialized_named_tensors"]) == 1
    # the handle travels as a shared-memory file name, never as a file descriptor (under torch's default
    # strategy SGLang's scheduler rejects the fd connection's authentication and the server exits)
    import base64

    pickled = base64.b64decode(body["serialized_named_tensors"][0])
    assert b"rebuild_storage_filename" in pickled and b"rebuild_storage_fd" not in pickled
    with pytest.raises(ValueError, match="on the CPU"):
        cpu_tensor_update({"w": torch.empty(1, device="meta")})
