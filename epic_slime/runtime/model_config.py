"""The tiny policy's size, without torch: `runtime/config.py` reads and checks a command line with it,
so that a refused flag answers in a fraction of a second instead of after torch's import (1 s idle,
several on a busy machine)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    num_experts: int = 4
    top_k: int = 2
    moe_intermediate_size: int = 64
    max_positions: int = 64

    def validate(self) -> None:
        for name in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "num_experts",
            "top_k",
            "moe_intermediate_size",
            "max_positions",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"model_{name} must be a positive integer, got {v!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model_hidden_size ({self.hidden_size}) must be divisible by model_num_heads ({self.num_heads})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model_num_heads ({self.num_heads}) must be divisible by model_num_kv_heads ({self.num_kv_heads})"
            )
        if self.top_k > self.num_experts:
            raise ValueError(f"model_top_k ({self.top_k}) must be <= model_num_experts ({self.num_experts})")
