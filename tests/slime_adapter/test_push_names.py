"""The project's own push-name check (epic_slime.slime.stream.served_weights.check_push_names): the real SGLang
server answers success to a push naming a tensor it does not load (tests/slime_adapter/test_real_sglang_pushes.py),
so a push is checked, before it is sent, against the names and shapes of the checkpoint the server loaded.
The Megatron push (test_megatron_push.py) runs it on slime's conversion. The train hook installs it on
slime's own distributed updater, bucket by bucket (the last tests: slime's source and megatron-core)."""

from __future__ import annotations

import argparse

import pytest
import torch

from epic_slime.slime.stream.served_weights import PushNamesWrong, check_push_names, checkpoint_shapes
from support.preconditions import missing, put_slime_on_path
from support.slime_push import OneRankDist


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from epic_slime.runtime.hf_export import checkpoint_tensors, export_initial_checkpoint

    folder, model = export_initial_checkpoint(tmp_path_factory.mktemp("served"))
    return checkpoint_shapes(folder), checkpoint_tensors(model)


def test_the_checkpoint_tensors_pass_and_their_shapes_are_the_saved_ones(exported):
    served, pushed = exported
    check_push_names(pushed, served)
    check_push_names({n: tuple(t.shape) for n, t in pushed.items()}, served)  # shapes alone are accepted
    assert served["lm_head.weight"] == tuple(pushed["lm_head.weight"].shape)
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in served  # per-expert names, as SGLang loads


def test_a_name_the_server_does_not_load_is_refused(exported):
    served, pushed = exported
    fused = {n: t for n, t in pushed.items() if ".mlp.experts." not in n or not n.startswith("model.layers.0.")}
    fused["model.layers.0.mlp.experts.gate_up_proj"] = torch.zeros(1)  # transformers 5's in-memory name
    with pytest.raises(PushNamesWrong, match=r"does not load: \['model.layers.0.mlp.experts.gate_up_proj'\]"):
        check_push_names(fused, served)


def test_a_left_out_tensor_is_refused_even_one(exported):
    served, pushed = exported
    with pytest.raises(PushNamesWrong, match=r"leaves out parameters the server serves: \['lm_head.weight'\]"):
        check_push_names({n: t for n, t in pushed.items() if n != "lm_head.weight"}, served)


def test_a_wrong_shape_is_refused(exported):
    served, pushed = exported
    with pytest.raises(PushNamesWrong, match=r"shapes differ .*'model.norm.weight': \(\(3,\), \(\d+,\)\)"):
        check_push_names({**pushed, "model.norm.weight": torch.zeros(3)}, served)


def test_a_folder_without_safetensors_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors in"):
        checkpoint_shapes(tmp_path)


# ---- on the train ranks: slime's own updater with the project's train hook


@pytest.fixture
def slime_send_weights(monkeypatch, tmp_path):
    """slime's own ``UpdateWeightFromDistributed._send_weights`` on one rank, its chunks given and its
    per-bucket send recorded, with the train hook installed (slime's class restored afterwards).
    Returns (send(chunks, hf_checkpoint) -> names sent per bucket, the exported checkpoint's tensors)."""
    put_slime_on_path()
    if missing("slime", "megatron.core"):
        pytest.skip("needs slime's source on the path (SLIME_PATH) and megatron-core")
    from epic_slime.runtime.hf_export import checkpoint_tensors, export_initial_checkpoint
    from epic_slime.slime.push_mode import install_train_hook
    from support.slime_push import updater_module

    module = updater_module()
    cls = module.UpdateWeightFromDistributed
    for name in ("_on_chunk", "update_weights"):
        monkeypatch.setattr(cls, name, getattr(cls, name))
    monkeypatch.setattr(
        module, "connect_rollout_engines_from_distributed", module.connect_rollout_engines_from_distributed
    )
    monkeypatch.setattr(module, "dist", OneRankDist)
    monkeypatch.setattr(module, "get_gloo_group", lambda: None)
    folder, model = export_initial_checkpoint(tmp_path / "hf")
    install_train_hook(argparse.Namespace(weight_push_mode="abort", use_rollout_routing_replay=False))

    def send(chunks, hf_checkpoint=str(folder)):
        sent = []
        updater = object.__new__(cls)
        updater.args = argparse.Namespace(hf_checkpoint=hf_checkpoint)
        updater._iter_non_expert_chunks = lambda: iter(chunks)
        updater._iter_expert_chunks = lambda: iter([])
        updater._update_bucket_weights_from_distributed = lambda chunk, pbar=None: sent.append([n for n, _ in chunk])
        try:
            updater._send_weights(None)
        finally:
            send.sent = sent
        return sent

    return send, list(checkpoint_tensors(model).items())


def test_the_train_hook_refuses_a_bucket_naming_what_the_server_does_not_load_before_sending_it(slime_send_weights):
    """The real server answers success to a weight update naming a parameter it does not load and keeps
    its old weights (test_real_sglang_pushes.py): on the train ranks every bucket is checked first."""
    send, tensors = slime_send_weights
    buckets = [tensors[:3], tensors[3:]]
    assert send(buckets) == [[n for n, _ in b] for b in buckets]  # the checkpoint's names go through
    fused = [("model.layers.0.mlp.experts.gate_up_proj", torch.zeros(1))]  # transformers 5's in-memory name
    with pytest.raises(PushNamesWrong, match=r"does not load: \['model.layers.0.mlp.experts.gate_up_proj'\]"):
        send([tensors[:3], fused + tensors[3:5]])
    assert send.sent == [[n for n, _ in tensors[:3]]]  # the bad bucket was never sent
    name, tensor = tensors[0]
    with pytest.raises(PushNamesWrong, match=rf"shapes differ .*'{name}'"):
        send([[(name, tensor[:1])]])
    assert send.sent == []


def test_without_safetensors_to_compare_with_the_push_goes_unchecked_with_a_warning(
    slime_send_weights, tmp_path, caplog
):
    send, tensors = slime_send_weights
    fused = [("model.layers.0.mlp.experts.gate_up_proj", torch.zeros(1))]
    with caplog.at_level("WARNING", logger="epic_slime.slime.stream.served_weights"):
        assert send([fused], hf_checkpoint=str(tmp_path)) == [[fused[0][0]]]
    assert f"push-name check off: --hf-checkpoint {str(tmp_path)!r} holds no *.safetensors" in caplog.text
