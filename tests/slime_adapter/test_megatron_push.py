"""The weight push from Megatron into the real SGLang server (issue 45 item 4).

A worker (tests/support/megatron_worker.py `convert`, TP = 2) builds the runtime's tiny Qwen3-MoE as a
Megatron GPTModel, converts its parameters with slime's own code (`named_params_and_buffers`,
`all_gather_param`, `convert_to_hf(args, "qwen3_moe")`; the CPU build's name adapters are in
tests/support/megatron_push.py), trains one EPIC step, converts again, and scores a probe with
Megatron over the served vocabulary. This process pushes the converted tensors into the session's real
server under each push mode (abort / in place / retract: generation paused that way with a request in
flight, the push, generation continued), and the served log-probs must be within the bf16 gap of
Megatron's: max 0.03, mean 0.01 per token (tests/slime_adapter/test_real_sglang.py's bounds for bf16
serving of the float model; served_probe.CONFIRM_MEAN_TOL).

Before any push the conversion is checked against an independent reference: the HF model's own
checkpoint tensors (transformers' `revert_weight_conversion`, epic_slime.runtime.hf_export), exactly.
The project's own name check (epic_slime.slime.stream.served_weights.check_push_names, against the names and
shapes in the safetensors of the folder the server loaded) refuses a push naming a parameter the server
does not load, leaving one out or changing a shape, before anything is sent: the real server answers
success to such a push (tests/slime_adapter/test_real_sglang_pushes.py).
"""

from __future__ import annotations

import sys

import pytest
import torch

from support.megatron_run import finish_all, skip_reason, start
from support.slime_args import slime_path

pytestmark = pytest.mark.slow
if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)
if slime_path() not in sys.path:  # the push uses slime's own group set-up
    sys.path.insert(0, slime_path())

from epic_slime.slime.push_mode import PUSH_MODES  # noqa: E402

MAX_GAP, MEAN_GAP = 0.03, 0.01


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("megatron_push") / "convert_tp2.pt"
    (rc, log, result) = finish_all({2: start("convert", 2, out)}, {2: out}, timeout=900)[2]
    assert rc == 0 and result is not None, f"convert worker exited {rc}:\n{log}"
    return result


def test_slimes_conversion_of_the_initial_model_is_the_hf_checkpoint(converted):
    from epic_slime.runtime.hf_export import checkpoint_tensors
    from support.megatron_push import SERVED_VOCAB
    from support.megatron_qwen import hf_policy

    reference = checkpoint_tensors(hf_policy())
    assert sorted(converted["initial"]) == sorted(reference)
    for name, tensor in reference.items():
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            tensor = tensor[:SERVED_VOCAB]  # slime's remove_padding: the padded row is not served
        assert torch.equal(converted["initial"][name], tensor.float()), name
    assert converted["moved"] > 1e-4, "the training step must have moved the weights"


def test_the_push_names_exactly_what_the_server_loads(converted, tmp_path):
    from epic_slime.runtime.hf_export import export_initial_checkpoint
    from epic_slime.slime.stream.served_weights import PushNamesWrong, check_push_names, checkpoint_shapes

    folder, _ = export_initial_checkpoint(tmp_path / "served")  # as the session's server loads it
    served = checkpoint_shapes(folder)
    check_push_names(converted["trained"], served)
    bogus = {**converted["trained"], "model.layers.0.mlp.experts.gate_up_proj": torch.zeros(1)}
    with pytest.raises(PushNamesWrong, match=r"does not load: \['model.layers.0.mlp.experts.gate_up_proj'\]"):
        check_push_names(bogus, served)
    headless = {n: t for n, t in converted["trained"].items() if n != "lm_head.weight"}
    with pytest.raises(PushNamesWrong, match=r"leaves out parameters the server serves: \['lm_head.weight'\]"):
        check_push_names(headless, served)
    narrow = {**converted["trained"], "model.norm.weight": torch.zeros(3)}
    with pytest.raises(PushNamesWrong, match=r"shapes differ .*model.norm.weight"):
        check_push_names(narrow, served)


def _gaps(served, mine):
    gap = (torch.tensor(served) - torch.tensor(mine)).abs()
    return float(gap.max()), float(gap.mean())


@pytest.mark.parametrize("mode", PUSH_MODES)
def test_a_push_from_megatron_serves_megatrons_log_probs(real_engines, converted, mode):
    from epic_slime.slime.stream.served_weights import check_push_names, checkpoint_shapes
    from support.served_probe import served_logprobs, served_weight_version
    from support.megatron_push import probe_ids
    from support.real_push import push_distributed, restore_initial_weights

    server, probe = real_engines.server, probe_ids()
    version = served_weight_version(server.url)
    before = _gaps(served_logprobs(server.url, probe), converted["probe_log_probs"])
    assert before[1] > MEAN_GAP, "the served initial model must differ from Megatron's (the push has teeth)"
    tensors = converted["trained"]
    check_push_names(tensors, checkpoint_shapes(real_engines.model_dir))  # what this server loaded
    in_flight = server.submit(probe[:4], max_new_tokens=40)
    assert server.post("/pause_generation", {"mode": mode}).status_code == 200
    try:
        # abort leaves nothing queued and slime flushes; in place / retract must not flush (push_mode.py)
        answer = push_distributed(server, tensors, f"megatron-{mode}", flush_cache=mode == "abort")
        assert answer["success"] is True, answer
    finally:
        assert server.post("/continue_generation").status_code == 200
    try:
        assert "meta_info" in in_flight.result(timeout=300)
        assert served_weight_version(server.url) == f"megatron-{mode}"
        worst, mean = _gaps(served_logprobs(server.url, probe), converted["probe_log_probs"])
        print(f"push {mode}: served vs Megatron max {worst:.4f} mean {mean:.4f}; before the push {before}")
        assert worst < MAX_GAP and mean < MEAN_GAP, (mode, worst, mean, before)
    finally:
        assert server.alive(), f"the real server died; log {server.process.log_path}"
        restore_initial_weights(real_engines, version)
