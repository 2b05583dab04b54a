"""Conformance of the weight-update paths, on the SGLang stand-in and the real SGLang 0.5.15.post1
server (the ``engine`` fixture, tests/support/conformance.py): ``/update_weights_from_disk`` (a
Hugging Face folder), ``/update_weights_from_distributed`` over a gloo group,
``/update_weights_from_tensor``, each with its ``weight_version``; after each, the answers are
the pushed weights' (one float32 forward, within the engine's tolerance). Each test restores the
initial weights and version (a disk update with its flush, while idle): the real server is shared.

Stand-in-only, because they kill the server (never sent to the shared real one): a flushing update
during an in-place pause (test_sglang_standin.py), an unknown update group, and tensors shared
by file descriptor (below)."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("aiohttp") is None or importlib.util.find_spec("requests") is None:
    pytest.skip("the SGLang stand-in needs aiohttp and requests", allow_module_level=True)

import torch  # noqa: E402

from support.conformance import (  # noqa: E402
    LONG_NEW,
    GlooPusher,
    TensorPayload,
    forward_logprobs,
    perturbed_checkpoint,
    reference_model,
    pause_while_running,
    spliced_logprobs,
)
from support.sglang_client import standin_factory, tokens_of  # noqa: E402

PROMPT = tokens_of("17+6=")


@pytest.fixture(scope="module")
def initial():
    return reference_model()


@pytest.fixture(scope="module")
def pushed(engine, tmp_path_factory):
    """Far-from-initial weights in the engine's precision: (HF folder, float32 model)."""
    return perturbed_checkpoint(tmp_path_factory.mktemp(f"pushed_{engine.kind}"), engine.dtype)


@pytest.fixture
def restore(engine, initial):
    yield
    reply = engine.server.post(
        "/update_weights_from_disk", {"model_path": engine.original_dir, "weight_version": "default"}
    )
    assert reply.status_code == 200 and reply.json()["success"], reply.text
    _assert_serves(engine, initial)


def _assert_serves(engine, model, prompt=PROMPT) -> None:
    """Six sampled tokens, each within the engine's gap of ``model``'s float32 forward; a bf16 engine may
    stray on one: a near tie in the top-2 router flips an expert (a clean-clone run met 0.20 on the sixth
    token, the other five under 0.012). Other weights stray on most tokens."""
    answer = engine.server.submit(prompt, max_new_tokens=6).result(120)
    got = torch.tensor([v for v, _, _ in answer["meta_info"]["output_token_logprobs"]], dtype=torch.float64)
    gap = (got - forward_logprobs(model, prompt, answer["output_ids"])).abs()
    strays = int((gap >= engine.pushed_gap).sum())
    assert strays <= (1 if engine.dtype == "bfloat16" else 0) and float(gap.median()) < engine.pushed_gap, gap.tolist()


def _version(engine) -> str:
    return engine.server.get("/model_info").json()["weight_version"]


def _named(model, with_head: bool = True):
    """The model's weights under the checkpoint's names, experts one by one (SGLang's Qwen3-MoE skips
    transformers 5's fused in-memory names, answering success); the tied output head as its own
    ``lm_head.weight`` (SGLang keeps a head of its own: a push without it leaves the served head)."""
    from epic_slime.runtime.hf_export import checkpoint_tensors

    named = list(checkpoint_tensors(model).items())
    return named if with_head else [(n, t) for n, t in named if n != "lm_head.weight"]


def test_disk_update_of_a_hf_folder_while_idle(engine, initial, pushed, restore):
    folder, model = pushed
    _assert_serves(engine, initial)
    reply = engine.server.post("/update_weights_from_disk", {"model_path": folder, "weight_version": "disk-1"})
    assert reply.status_code == 200 and reply.json()["success"], reply.text
    assert _version(engine) == "disk-1"
    _assert_serves(engine, model)
    bad = engine.server.post(
        "/update_weights_from_disk", {"model_path": "/nonexistent/checkpoint", "flush_cache": False}
    )
    assert bad.status_code == 400 and bad.json()["success"] is False
    _assert_serves(engine, model)


def test_disk_update_during_an_in_place_pause_decodes_on_over_the_old_kv(engine, initial, pushed, restore):
    """in_place, update with ``flush_cache`` false, continue: the tokens before the update are the old
    weights'; after it the new weights decode over the KV the old ones computed (SGLang keeps it)."""
    folder, model = pushed
    server = engine.server
    answer, _ = pause_while_running(server, PROMPT, {"mode": "in_place"})
    reply = server.post(
        "/update_weights_from_disk", {"model_path": folder, "flush_cache": False, "weight_version": "7"}
    )
    assert reply.status_code == 200 and reply.json()["success"], reply.text
    server.post("/continue_generation", {})
    got = answer.result(120)
    assert got["meta_info"]["weight_version"] == "7" and len(got["output_ids"]) == LONG_NEW
    tokens = got["output_ids"]
    reported = torch.tensor([v for v, _, _ in got["meta_info"]["output_token_logprobs"]], dtype=torch.float64)
    old = (reported - forward_logprobs(initial, PROMPT, tokens)).abs() < engine.pushed_gap
    switch = int(old.logical_not().nonzero()[0]) if not old.all() else LONG_NEW
    assert 1 <= switch < LONG_NEW - 5 and old[:switch].all(), old.tolist()
    sequence = PROMPT + tokens

    def splice_gap(at: int) -> torch.Tensor:
        return (
            reported[at:] - spliced_logprobs(initial, model, sequence, len(PROMPT) + at - 1, len(PROMPT) + at)
        ).abs()

    # the first tokens after the update can fit the old weights within pushed_gap by chance, which puts the
    # detected switch late (the suspected cause of one clean-clone failure, median gap 0.13); the update came at or before it, at the
    # splice point that explains the tokens best
    switch = min(range(max(1, switch - 8), switch + 1), key=lambda at: float(splice_gap(at).median()))
    gap = splice_gap(switch)
    own = (reported[switch:] - forward_logprobs(model, PROMPT, tokens)[switch:]).abs()
    # bf16 KV and a top-2 router: a near tie can flip an expert and one token strays; most stay close
    assert float(gap.median()) < engine.pushed_gap and float((gap < engine.pushed_gap).double().mean()) >= 0.8, (
        gap.tolist()
    )
    assert gap.mean() < own.mean(), "the new weights' own forward fits better than over the old KV"


def test_distributed_push_over_gloo_sets_weights_and_version(engine, initial, pushed, restore):
    _, model = pushed
    _assert_serves(engine, initial)  # the prompt is now in the prefix cache, on the initial weights
    pusher = GlooPusher(engine.server)
    try:
        named = _named(model)
        assert pusher.push(named[:10])["success"]
        assert pusher.push(named[10:], weight_version="dist-1")["success"]
    finally:
        pusher.close()
    assert _version(engine) == "dist-1"
    # slime's buckets carry flush_cache false: the prompt cached before still holds the old weights' KV
    stale = engine.server.submit(PROMPT, max_new_tokens=6).result(120)
    assert stale["meta_info"]["cached_tokens"] == len(PROMPT) - 1
    tokens = stale["output_ids"]
    reported = torch.tensor([v for v, _, _ in stale["meta_info"]["output_token_logprobs"]], dtype=torch.float64)
    spliced = spliced_logprobs(initial, model, PROMPT + tokens, len(PROMPT) - 1, len(PROMPT))
    own = forward_logprobs(model, PROMPT, tokens)
    assert float((reported - own).abs().max()) > engine.pushed_gap, "served as if freshly computed"
    if engine.kind == "standin":
        # the real server's first token fits this (0.016 off) but its later ones do not (0.1-0.8 off,
        # 2026-12-06): how its decode reads a stale prefix is not pinned down; an open difference
        assert (reported - spliced).abs().max() < engine.pushed_gap, (reported - spliced).tolist()
    assert engine.server.get("/flush_cache").status_code == 200  # idle: then every prefix is the new weights'
    _assert_serves(engine, model)


def test_destroying_an_update_group_succeeds_once_then_is_refused(engine):
    """A live group is destroyed with success; a name with no group (destroyed already, or never made) is
    refused with 400 and success false. The stand-in answered success for both, so push_recovery, which
    counts the engines whose answer says success, logged leftover groups cleared where there were none."""
    import torch.distributed as dist

    pusher = GlooPusher(engine.server, group_name="conformance_destroy")
    try:
        first = engine.server.post("/destroy_weights_update_group", {"group_name": "conformance_destroy"})
    finally:
        dist.destroy_process_group(pusher.group)
    again = engine.server.post("/destroy_weights_update_group", {"group_name": "conformance_destroy"})
    never = engine.server.post("/destroy_weights_update_group", {"group_name": "conformance_never_made"})
    assert first.status_code == 200 and first.json()["success"], first.text
    for reply in (again, never):
        assert reply.status_code == 400 and reply.json()["success"] is False, reply.text
        assert "does not exist" in reply.json()["message"]
    assert engine.server.get("/health").status_code == 200  # a refused destroy leaves the server serving


def test_a_push_without_the_output_head_leaves_the_served_head(engine, initial, pushed, restore):
    """The tiny policy ties its head to the embeddings: its ``named_parameters`` have no ``lm_head``.
    Pushed without it, the engine keeps its old head and serves the new body with the old head."""
    _, model = pushed
    pusher = GlooPusher(engine.server)
    try:
        pusher.push(_named(model, with_head=False), weight_version="dist-2")
    finally:
        pusher.close()
    mixed = reference_model()
    mixed.load_state_dict(model.state_dict())
    mixed.config.tie_word_embeddings = False
    mixed.lm_head.weight = torch.nn.Parameter(initial.lm_head.weight.detach().clone())
    assert engine.server.get("/flush_cache").status_code == 200
    _assert_serves(engine, mixed)


def test_tensor_update_loads_mappable_names_and_skips_the_rest_with_success(engine, initial, pushed, restore, tmp_path):
    _, model = pushed
    payload = TensorPayload(tmp_path / "good", [(n, p.detach().clone()) for n, p in _named(model)])
    try:
        reply = engine.server.post(
            "/update_weights_from_tensor",
            {"serialized_named_tensors": [payload.serialized], "weight_version": "tensor-1"},
        )
    finally:
        payload.close()
    assert reply.status_code == 200 and reply.json()["success"], reply.text
    assert _version(engine) == "tensor-1"
    _assert_serves(engine, model)
    # transformers 5's fused in-memory expert name: SGLang cannot map it, answers success, loads nothing
    unmappable = TensorPayload(tmp_path / "bad", [("model.layers.0.mlp.experts.gate_up_proj", torch.zeros(4, 64, 64))])
    try:
        reply = engine.server.post("/update_weights_from_tensor", {"serialized_named_tensors": [unmappable.serialized]})
    finally:
        unmappable.close()
    assert reply.status_code == 200 and reply.json()["success"] is True
    _assert_serves(engine, model)


# ---- stand-in only: these end the server (the real one dies the same way; never sent to the shared one)


def test_an_unknown_update_group_ends_the_server(tmp_path):
    with standin_factory(tmp_path) as start:
        server = start()
        reply = server.post(
            "/update_weights_from_distributed",
            {"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[64]], "group_name": "never_joined"},
        )
        assert reply.status_code == 500 and "Please call `init_weights_update_group` first" in reply.json()["message"]
        assert server.proc.wait(10) == 3


def test_tensors_shared_by_file_descriptor_end_the_server(tmp_path):
    """torch's default sharing strategy: the server cannot rebuild the tensors
    (``AuthenticationError: digest sent was rejected`` in SGLang's scheduler) and dies."""
    with standin_factory(tmp_path) as start:
        server = start()
        payload = TensorPayload(tmp_path / "fd", [("model.norm.weight", torch.ones(64))], strategy="file_descriptor")
        try:
            reply = server.post("/update_weights_from_tensor", {"serialized_named_tensors": [payload.serialized]})
        finally:
            payload.close()
        assert reply.status_code == 500 and "could not rebuild the tensors" in reply.json()["message"]
        assert server.proc.wait(10) == 3
