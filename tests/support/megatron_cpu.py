"""Megatron-core 0.16.1 on CPU over gloo: the test-only patch set, slime's CPU accelerator and a
THD core attention (../shared/docs/megatron-cpu.md lists each obstacle).

Process-wide: `apply_patches` changes torch itself (a TorchFunctionMode, `torch.cuda.current_device`,
`Tensor.type`), so only a Megatron test's own worker process calls it (tests/support/megatron_worker.py).
Each patch has a name; `EPIC_SLIME_MEGATRON_SKIP_PATCH=<name>` leaves it out, and
tests/megatron/test_megatron_patches.py shows that each one is still needed (the worker fails without it).
Pinned to megatron-core 0.16.1: the patches name its internals.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F

PINNED_MEGATRON_CORE = "0.16.1"
SKIP_PATCH_ENV = "EPIC_SLIME_MEGATRON_SKIP_PATCH"
# name -> the obstacle it gets past (megatron-cpu.md's item)
PATCHES = {
    "current_device": "torch.cuda.current_device() in ~100 places (RoPE's get_emb first)",
    "cuda_device_mode": 'hard-coded device="cuda", pin_memory, .cuda(), record_stream',
    "te_general_gemm": "moe_utils.te_general_gemm undefined without TransformerEngine",
    "cuda_tensor_type": "optimizers / grad clipping assert param.grad.type() == 'torch.cuda.FloatTensor'",
    "sequence_parallel_norm": "TP > 1 with MoE needs SP; the local WrappedTorchNorm refuses SP",
    "cuda_streams": "torch.cuda.Stream / stream / current_stream / synchronize: megatron.training's get_model (a "
    "DDP side stream), the alltoall MoE dispatcher (slime's validate_args forces it) and the checkpoint writer",
    "cuda_rng_state": "megatron.training's checkpoint save / load read and restore torch.cuda's RNG state",
    "optimizer_load_state": "without Apex / TE, DistributedOptimizer.state_dict reads Adam's step from the inner "
    "torch optimizer's state, empty in a fresh optimizer that a checkpoint load asks (distrib_optimizer.py:642)",
}


def megatron_core_version() -> str | None:
    try:
        from megatron.core import package_info
    except ImportError:
        return None
    return package_info.__version__


def check_version() -> None:
    found = megatron_core_version()
    if found != PINNED_MEGATRON_CORE:
        raise RuntimeError(
            f"the CPU Megatron harness is pinned to megatron-core=={PINNED_MEGATRON_CORE} (its patches name that "
            f"version's internals); found {found!r}: re-check every patch (tests/megatron/test_megatron_patches.py) "
            "before moving the pin"
        )


def _skipped() -> set[str]:
    names = {n for n in os.environ.get(SKIP_PATCH_ENV, "").split(",") if n}
    unknown = names - set(PATCHES)
    if unknown:
        raise ValueError(f"{SKIP_PATCH_ENV}: unknown patch name(s) {sorted(unknown)}; known: {sorted(PATCHES)}")
    return names


def patch_active(name: str) -> bool:
    return name not in _skipped()


class _CudaToCpu(torch.overrides.TorchFunctionMode):
    """Rewrites a cuda or integer `device=` to cpu and drops pinning; `.cuda()`, `.pin_memory()` and
    `record_stream` become no-ops; with `report_cuda_type`, a no-argument `Tensor.type()` answers the
    cuda type name the optimizers assert on."""

    def __init__(self, report_cuda_type: bool):
        super().__init__()
        self.report_cuda_type = report_cuda_type

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and (isinstance(device, int) or "cuda" in str(device)):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        if func in (torch.Tensor.cuda, torch.Tensor.pin_memory):
            return args[0]
        if func is torch.Tensor.record_stream:
            return None
        if func is torch.Tensor.to and args and len(args) > 1 and "cuda" in str(args[1]):
            args = (args[0], "cpu", *args[2:])
        if func is torch.Tensor.type and self.report_cuda_type and len(args) == 1 and not kwargs:
            return "torch.cuda." + func(*args).split(".")[-1]
        return func(*args, **kwargs)


def apply_patches() -> list[str]:
    """Installs the patch set (after `dist.init_process_group("gloo")`); returns the names applied."""
    check_version()
    applied = []
    if patch_active("current_device"):
        torch.cuda.current_device = lambda: "cpu"
        applied.append("current_device")
    if patch_active("te_general_gemm"):
        from megatron.core.transformer.moe import moe_utils

        moe_utils.te_general_gemm = None
        applied.append("te_general_gemm")
    if patch_active("cuda_device_mode"):
        _CudaToCpu(report_cuda_type=patch_active("cuda_tensor_type")).__enter__()  # for the process's life
        applied.append("cuda_device_mode")
        if patch_active("cuda_tensor_type"):
            applied.append("cuda_tensor_type")
    if patch_active("sequence_parallel_norm"):
        applied.append("sequence_parallel_norm")  # applied where the layer spec is built (`layer_spec`)
    if patch_active("cuda_streams"):
        torch.cuda.Stream = _HostStream
        torch.cuda.current_stream = lambda device=None: _HOST_STREAM
        torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
        torch.cuda.synchronize = lambda device=None: None  # dist_checkpointing's save waits on the device
        applied.append("cuda_streams")
    if patch_active("cuda_rng_state"):
        # no CUDA generator: the checkpoint's cuda entry holds the CPU one's state (also saved as its own)
        torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
        torch.cuda.set_rng_state = lambda state, device="cuda": None
        applied.append("cuda_rng_state")
    if patch_active("optimizer_load_state"):
        _optimizer_state_before_load()
        applied.append("optimizer_load_state")
    return applied


def _optimizer_state_before_load() -> None:
    """A fresh DistributedOptimizer asked for its state dict to load into gets its optimizer states made
    first, by megatron-core's own `_init_optimizer_states_with_dummy_values` (its FSDP path does so); the
    load then overwrites them in place."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    plain = DistributedOptimizer.sharded_state_dict

    def sharded_state_dict(self, model_sharded_state_dict, is_loading=False, *args, **kwargs):
        if is_loading and not self.optimizer.state:
            self._init_optimizer_states_with_dummy_values()
        return plain(self, model_sharded_state_dict, is_loading, *args, **kwargs)

    DistributedOptimizer.sharded_state_dict = sharded_state_dict


class _HostStream:
    """A CUDA stream on the CPU: work is ordered already, so waiting and events are no-ops."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass

    def synchronize(self):
        pass

    def record_event(self, event=None):
        return self  # its synchronize() is the event's


_HOST_STREAM = _HostStream()


def install_cpu_accelerator() -> None:
    """slime's accelerator registry finds no device on CPU ("No usable accelerator was detected"):
    give it a CPU one, through its own `set_accelerator`."""
    from slime.utils import accelerator
    from slime.utils.accelerator.base import Accelerator

    class CpuAccelerator(Accelerator):
        name = device_type = "cpu"
        communication_backend_name = "gloo"  # slime's weight-update group (update_weight_from_distributed.py:296)

        def is_available(self):
            return True

        def device(self, index=None):
            return torch.device("cpu")

        def device_name(self, index=None):
            return "cpu"

        def set_device(self, index):
            pass

        def current_device(self):
            return "cpu"

        def device_count(self):
            return 1

        def synchronize(self, device=None):
            pass

        def current_stream(self, device=None):
            return None

        def empty_cache(self):
            pass

        def mem_get_info(self, device=None):
            return (0, 0)

        def memory_allocated(self, device=None):
            return 0

        def memory_reserved(self, device=None):
            return 0

    accelerator.set_accelerator(CpuAccelerator())


class ThdCoreAttention(torch.nn.Module):
    """Causal attention within each packed segment (slime's get_batch always packs into THD; the local
    DotProductAttention refuses packed input). query [t, heads, d], key / value [t, kv heads, d];
    returns [t, heads * d]. CP = 1 only: each segment must be whole on this rank."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None, **kwargs):
        super().__init__()
        self.config = config
        if config.context_parallel_size != 1:
            raise ValueError(
                f"ThdCoreAttention: context_parallel_size={config.context_parallel_size}; only 1 is supported "
                "(a CP rank holds two zigzag chunks of each segment; attention would need the other ranks' K/V)"
            )

    def forward(
        self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None
    ):
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            raise ValueError("ThdCoreAttention: only packed THD input (slime's get_batch) is supported")
        groups = query.size(1) // key.size(1)
        bounds = packed_seq_params.cu_seqlens_q.tolist()
        out = []
        for start, end in zip(bounds[:-1], bounds[1:]):
            q, k, v = (x[start:end].transpose(0, 1) for x in (query, key, value))  # [heads, s, d]
            k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
            out.append(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1))
        return torch.cat(out).reshape(query.size(0), -1)


class SequenceParallelNorm:
    """The local RMSNorm built with SP off, its parameters marked `sequence_parallel` so that
    `finalize_model_grads` still sums their gradients over TP (each rank saw a sequence shard or its
    own heads)."""

    def __new__(cls, config, hidden_size, eps=1e-5, **kwargs):
        import dataclasses

        from megatron.core.transformer.torch_norm import WrappedTorchNorm

        norm = WrappedTorchNorm(dataclasses.replace(config, sequence_parallel=False), hidden_size, eps, **kwargs)
        for p in norm.parameters():
            p.sequence_parallel = config.sequence_parallel
        return norm


def layer_spec(num_layers: int):
    """The local GPT/MoE spec with the THD core attention (and, under SP, `SequenceParallelNorm`)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    spec = get_gpt_layer_local_spec(num_experts=2, qk_layernorm=True, normalization="RMSNorm")
    norm = SequenceParallelNorm if patch_active("sequence_parallel_norm") else WrappedTorchNorm
    layer = spec.submodules
    layer.input_layernorm = layer.pre_mlp_layernorm = norm
    layer.self_attention.submodules.q_layernorm = layer.self_attention.submodules.k_layernorm = norm
    layer.self_attention.submodules.core_attention = ThdCoreAttention
    return TransformerBlockSubmodules(layer_specs=[spec] * num_layers, layer_norm=norm)
