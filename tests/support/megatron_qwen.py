"""The runtime's tiny Qwen3-MoE (epic_slime/runtime/model.py) as a Megatron-core GPTModel with the same
weights: the transformer config that matches Hugging Face's Qwen3-MoE, and our own HF -> Megatron weight
mapping (full tensors, then this rank's tensor-parallel shard).

Matching points: RMSNorm eps 1e-6 with per-head q/k norms (`qk_layernorm`); SwiGLU experts without
bias (Megatron's fc1 = [gate; up], the layout of HF's fused `gate_up_proj`); softmax routing over the
top-k logits, which equals HF's softmax over all experts renormalised over the top k
(`norm_topk_prob`); RoPE base 10000, non-interleaved (HF's rotate_half); tied embeddings.
"""

from __future__ import annotations

import torch

from epic_slime.runtime.model import build_policy
from epic_slime.runtime.model_config import ModelConfig
from epic_slime.runtime.task import Tokenizer

# The runtime tokenizer has 19 ids; tensor parallelism splits the vocabulary, so the model is built with
# 20 (Megatron-LM pads the vocabulary to a multiple of TP the same way). Both models hold the same 20 rows.
VOCAB = 20
SEED = 7


def hf_policy():
    tok = Tokenizer()
    return build_policy(ModelConfig(), VOCAB, tok.pad_id, tok.bos_id, tok.eos_id, seed=SEED).eval()


def transformer_config(cfg: ModelConfig, tp: int, hf_config):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_heads,
        num_query_groups=cfg.num_kv_heads,
        kv_channels=cfg.hidden_size // cfg.num_heads,
        ffn_hidden_size=2 * cfg.hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        qk_layernorm=True,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        num_moe_experts=cfg.num_experts,
        moe_router_topk=cfg.top_k,
        moe_ffn_hidden_size=cfg.moe_intermediate_size,
        moe_router_pre_softmax=False,
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        moe_token_dispatcher_type="allgather",  # the alltoall dispatcher makes a torch.cuda.Stream
        tensor_model_parallel_size=tp,
        sequence_parallel=tp > 1,  # Megatron requires SP for MoE under TP
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
    )


def build_gpt(config, cfg: ModelConfig, hf_config):
    from megatron.core.models.gpt import GPTModel

    from support.megatron_cpu import layer_spec

    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(cfg.num_layers),
        vocab_size=VOCAB,
        max_sequence_length=cfg.max_positions,
        pre_process=True,
        post_process=True,
        share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings),
        position_embedding_type="rope",
        rotary_base=int(hf_config.rope_parameters["rope_theta"]),
    )


def hf_to_megatron(hf_model, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Full (TP = 1) Megatron tensors from the HF state dict."""
    sd = {k: v.detach().float() for k, v in hf_model.state_dict().items()}
    heads, groups, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.hidden_size // cfg.num_heads
    per_group = heads // groups
    out = {"embedding.word_embeddings.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg.num_layers):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        q = sd[hf + "self_attn.q_proj.weight"].view(groups, per_group * head_dim, -1)
        k = sd[hf + "self_attn.k_proj.weight"].view(groups, head_dim, -1)
        v = sd[hf + "self_attn.v_proj.weight"].view(groups, head_dim, -1)
        # Megatron's fused QKV: per query group, its query heads then its key and value head
        out[mg + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, cfg.hidden_size)
        out[mg + "self_attention.linear_proj.weight"] = sd[hf + "self_attn.o_proj.weight"]
        out[mg + "self_attention.q_layernorm.weight"] = sd[hf + "self_attn.q_norm.weight"]
        out[mg + "self_attention.k_layernorm.weight"] = sd[hf + "self_attn.k_norm.weight"]
        out[mg + "input_layernorm.weight"] = sd[hf + "input_layernorm.weight"]
        out[mg + "pre_mlp_layernorm.weight"] = sd[hf + "post_attention_layernorm.weight"]
        out[mg + "mlp.router.weight"] = sd[hf + "mlp.gate.weight"]
        for e in range(cfg.num_experts):
            expert = mg + f"mlp.experts.local_experts.{e}."
            out[expert + "linear_fc1.weight"] = sd[hf + "mlp.experts.gate_up_proj"][e]
            out[expert + "linear_fc2.weight"] = sd[hf + "mlp.experts.down_proj"][e]
    out["decoder.final_layernorm.weight"] = sd["model.norm.weight"]
    return out


def tp_shard(name: str, full: torch.Tensor, local_shape: torch.Size, rank: int, size: int, partition_dim: int):
    """This rank's piece of a full tensor: whole when not split; SwiGLU's fc1 splits gate and up apart."""
    if tuple(full.shape) == tuple(local_shape):
        return full
    if name.endswith("linear_fc1.weight"):
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]])
    return full.chunk(size, dim=partition_dim)[rank]


@torch.no_grad()
def load_hf_weights(gpt_model, hf_model, cfg: ModelConfig) -> None:
    from megatron.core import mpu

    full = hf_to_megatron(hf_model, cfg)
    rank, size = mpu.get_tensor_model_parallel_rank(), mpu.get_tensor_model_parallel_world_size()
    names = dict(gpt_model.named_parameters())
    missing = sorted(set(names) ^ set(full))
    if missing:
        raise KeyError(f"HF -> Megatron mapping and the model's parameters differ: {missing}")
    for name, param in names.items():
        dim = getattr(param, "partition_dim", 0)
        param.copy_(tp_shard(name, full[name], param.shape, rank, size, dim))


@torch.no_grad()
def gather_full(gpt_model) -> dict[str, torch.Tensor]:
    """Every parameter whole again (TP all-gather, fc1's gate and up re-joined): the inverse of
    `load_hf_weights`' sharding, for comparing TP runs."""
    import torch.distributed as dist
    from megatron.core import mpu

    size = mpu.get_tensor_model_parallel_world_size()
    out = {}
    for name, param in gpt_model.named_parameters():
        value = param.main_grad if hasattr(param, "main_grad") else param
        out[name] = _gather(name, value.detach().clone(), param, size, mpu.get_tensor_model_parallel_group(), dist)
    return out


def _gather(name, local, param, size, group, dist):
    if size == 1 or not getattr(param, "tensor_model_parallel", False):
        return local
    pieces = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(pieces, local.contiguous(), group=group)
    if name.endswith("linear_fc1.weight"):
        gates, ups = zip(*(p.chunk(2, dim=0) for p in pieces))
        return torch.cat([*gates, *ups])
    return torch.cat(pieces, dim=param.partition_dim)
