"""The project's own push-name check (epic_slime.slime.served_weights.check_push_names): the real SGLang
server answers success to a push naming a tensor it does not load (tests/slime_adapter/test_real_sglang_pushes.py),
so a push is checked, before it is sent, against the names and shapes of the checkpoint the server loaded.
The Megatron push (test_megatron_push.py) runs it on slime's conversion; this file needs no Megatron."""

from __future__ import annotations

import pytest
import torch

from epic_slime.slime.served_weights import PushNamesWrong, check_push_names, checkpoint_shapes


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
