"""Megatron -> SGLang names with slime's own code, for the push into the real server.

In the worker (`run_convert`): slime's `named_params_and_buffers` (global names), `all_gather_param`
(TP shards gathered, SwiGLU's fc1 re-joined) and `convert_to_hf(args, "qwen3_moe", ...)` (its
Qwen3-MoE converter, vocabulary padding removed to `args.vocab_size`). Two adapters at slime's
interface, each for a fact of this CPU build, both reported:
- megatron-core's local MoE experts are named `mlp.experts.local_experts.{e}.linear_fc1.weight`;
  slime's converter matches only TransformerEngine's grouped names `mlp.experts.linear_fc1.weight{e}`
  (TE is absent on CPU), and knows the attention's input norm only under TE's fused name
  `self_attention.linear_qkv.layer_norm_weight` (the local spec's `input_layernorm.weight`; megatron-core's
  local spec maps the one to the other itself for checkpoints), so the local names are rewritten to
  TE's before conversion;
- a tied model has no `output_layer` parameter, so slime's conversion yields no `lm_head.weight`,
  which SGLang's Qwen3-MoE loads as a tensor of its own: the embedding is sent under that name too.

The project's own check that a push names exactly the tensors the server loads (the real server answers
success for names it cannot map, and loads nothing) is epic_slime.slime.stream.served_weights.check_push_names.
"""

from __future__ import annotations

import re

import torch

SERVED_VOCAB = 19  # the runtime tokenizer's; the Megatron model's 20th row is vocabulary padding


def _slime_name(name: str) -> str:
    name = re.sub(r"mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.weight$", r"mlp.experts.\2.weight\1", name)
    # megatron-core's own key map for the local spec (its sharded_state_dict_keys_map): TE fuses this norm
    return re.sub(r"\.input_layernorm\.weight$", ".self_attention.linear_qkv.layer_norm_weight", name)


def install_local_name_loader() -> None:
    """slime's HF -> Megatron loader (`hf_to_megatron`, its `--load` of an HF folder) asks for the weights
    under TransformerEngine's names too: the same adapter, at the loader's interface."""
    from slime.backends.megatron_utils import hf_to_megatron

    te_loader = hf_to_megatron._LOADERS["qwen3_moe"]
    if getattr(te_loader, "local_names", False):
        return

    def local_names(name, reader, config):
        return te_loader(_slime_name(name), reader, config)

    local_names.local_names = True
    hf_to_megatron._LOADERS["qwen3_moe"] = local_names


def converter_args(cfg):
    from types import SimpleNamespace

    return SimpleNamespace(
        vocab_size=SERVED_VOCAB,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_heads,
        num_query_groups=cfg.num_kv_heads,
        kv_channels=cfg.hidden_size // cfg.num_heads,
        num_experts=cfg.num_experts,
        num_layers=cfg.num_layers,
        q_lora_rank=None,  # slime's converter asks (DeepSeek's MLA); Qwen3 has none
    )


@torch.no_grad()
def convert_for_server(cfg, ddp, tied: bool) -> dict[str, torch.Tensor]:
    from slime.backends.megatron_utils.megatron_to_hf import convert_to_hf
    from slime.backends.megatron_utils.update_weight.common import all_gather_param, named_params_and_buffers

    args = converter_args(cfg)
    out = {}
    for name, param in named_params_and_buffers(args, [ddp]):
        full = all_gather_param(name, param)
        for hf_name, tensor in convert_to_hf(args, "qwen3_moe", _slime_name(name), full):
            out[hf_name] = tensor.detach().float().clone()
    if tied and "lm_head.weight" not in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def probe_ids() -> list[int]:
    """A fixed sequence of the task's tokens (as tests/slime_adapter/test_real_sglang_pushes.py probes)."""
    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    return [tok.bos_id] + tok.encode("9-4+8=Answer:13")


def _probe_log_probs(logits, args, unconcat_tokens, total_lengths, response_lengths, **kwargs):
    """forward_only's callback: log p(token | prefix) over the served vocabulary (the padded row left
    out), from the TP-sharded logits."""
    import torch.distributed as dist
    from megatron.core import mpu

    logits = logits[0].float()
    if mpu.get_tensor_model_parallel_world_size() > 1:
        parts = [torch.empty_like(logits) for _ in range(mpu.get_tensor_model_parallel_world_size())]
        dist.all_gather(parts, logits.contiguous(), group=mpu.get_tensor_model_parallel_group())
        logits = torch.cat(parts, dim=-1)
    out, start = [], 0
    for tokens, total in zip(unconcat_tokens, total_lengths):
        scores = torch.log_softmax(logits[start : start + total - 1, :SERVED_VOCAB], dim=-1)
        out.append(scores.gather(1, tokens[1:total, None].long()).squeeze(1))
        start += total
    return logits.new_zeros(()), {"probe_log_probs": out}  # (loss, collected) as forward_only expects


def run_convert(hf, probe: list[int], build_model, optimizer, train_step) -> dict:
    """The initial model's conversion (checked against HF's checkpoint names and tensors in the test),
    then one EPIC training step, its conversion and Megatron's log-probs of `probe`."""
    from slime.backends.megatron_utils import model as slime_model
    from slime.backends.megatron_utils.data import DataIterator

    from support.megatron_data import make_args, rollout_data, sample_layout

    cfg, gpt, ddp = build_model(hf)
    tied = bool(hf.config.tie_word_embeddings)
    initial = convert_for_server(cfg, ddp, tied)
    args = make_args("epic")
    data, _ = rollout_data(hf, sample_layout())
    train_step(args, ddp, gpt, data, record_grads=False)
    trained = convert_for_server(cfg, ddp, tied)
    one = {
        "tokens": [torch.tensor(probe)],
        "total_lengths": [len(probe)],
        "response_lengths": [len(probe) - 1],
        "loss_masks": [torch.ones(len(probe) - 1, dtype=torch.int)],
    }
    forward = slime_model.forward_only(_probe_log_probs, args, [ddp], [DataIterator(one, [[0]])], [1])
    return {
        "initial": initial,
        "trained": trained,
        "probe_log_probs": forward["probe_log_probs"][0].tolist(),
        "moved": max(float((trained[n] - initial[n]).abs().max()) for n in initial),
    }
