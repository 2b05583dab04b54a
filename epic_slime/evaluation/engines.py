"""Generation engines for checkpoint evaluation, one interface: ``generate(texts, sampling) ->
one list of k responses per text`` and ``close()``.

- ``SGLangEngine``: SGLang's offline engine (``sglang.Engine``, tensor parallel), as shipped in the
  cluster image, in the process that runs ``epic-slime evaluate``. Written against sglang 0.5.15.post1:
  ``Engine(**server_args)`` (``model_path``, ``tp_size``, ``random_seed``, ...),
  ``generate(prompt=[...], sampling_params=[...])`` returning one dict per prompt with ``"text"`` and
  ``"meta_info"``, ``shutdown()``. ``device="cpu"`` runs SGLang's CPU engine without its kernel package
  (``CPU_SERVER_ARGS``, ``SGLANG_USE_CPU_ENGINE=1``; ``../shared/docs/sglang-cpu.md``): small models only.
- ``TransformersEngine``: transformers ``generate``, the CPU fallback for small models.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENGINES = ("sglang", "transformers")


@dataclass(frozen=True)
class Sampling:
    samples_per_prompt: int
    temperature: float
    top_p: float
    max_new_tokens: int

    def sglang_params(self) -> dict:
        """SGLang sampling_params of one request (one sample)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "max_new_tokens": self.max_new_tokens}


# SGLang's CPU engine without the sgl-kernel package: PyTorch attention and sampling, no overlap
# schedule, no CUDA graphs, a small KV pool (the CPU engine sizes it from host memory otherwise)
CPU_SERVER_ARGS = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "sampling_backend": "pytorch",
    "disable_overlap_schedule": True,
    "cuda_graph_backend_decode": "disabled",
    "cuda_graph_backend_prefill": "disabled",
    "max_total_tokens": 4096,
}
CPU_MEM_FRACTION_STATIC = 0.05
CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"


class EngineError(RuntimeError):
    """The engine could not be started or returned something unusable."""


def prompt_text(tokenizer, chat: list[dict]) -> str:
    """The chat template applied as slime's ``--apply-chat-template`` does; plain contents without one."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return "\n".join(m["content"] for m in chat) + "\n"


class SGLangEngine:
    def __init__(
        self,
        model_path: str,
        tp_size: int = 1,
        seed: int = 0,
        mem_fraction_static: float | None = None,
        context_length: int | None = None,
        chunk_prompts: int = 64,
        device: str | None = None,
    ):
        if device not in (None, "cuda", "cpu"):
            raise EngineError(f"--engine sglang runs on cuda or cpu, got --device {device!r}")
        if device == "cpu":
            os.environ[CPU_ENGINE_ENV] = "1"  # read when sglang is imported, and by its scheduler processes
        try:
            import sglang
        except ImportError as error:
            raise EngineError(
                f"--engine sglang needs SGLang in this environment (the cluster image has it): {error}. "
                "Without it use --engine transformers."
            ) from None
        server_args = {"model_path": model_path, "tp_size": tp_size, "random_seed": seed}
        if device == "cpu":
            server_args.update(CPU_SERVER_ARGS)
            if mem_fraction_static is None:
                mem_fraction_static = CPU_MEM_FRACTION_STATIC
        if mem_fraction_static is not None:
            server_args["mem_fraction_static"] = mem_fraction_static
        if context_length is not None:
            server_args["context_length"] = context_length
        self.engine = sglang.Engine(**server_args)
        self.chunk_prompts = chunk_prompts

    def generate(self, texts: list[str], sampling: Sampling) -> list[list[str]]:
        """Each text repeated k times in one batch (SGLang batches and samples them independently)."""
        k = sampling.samples_per_prompt
        out: list[list[str]] = []
        for start in range(0, len(texts), self.chunk_prompts):
            chunk = texts[start : start + self.chunk_prompts]
            requests = [t for t in chunk for _ in range(k)]
            answers = self.engine.generate(prompt=requests, sampling_params=[sampling.sglang_params()] * len(requests))
            if not isinstance(answers, list) or len(answers) != len(requests):
                got = len(answers) if isinstance(answers, list) else type(answers).__name__
                raise EngineError(f"sglang.Engine.generate returned {got} outputs for {len(requests)} requests")
            for i in range(len(chunk)):
                group = answers[i * k : (i + 1) * k]
                if not all(isinstance(a, dict) and isinstance(a.get("text"), str) for a in group):
                    raise EngineError(f"sglang.Engine.generate: output without a 'text' string for prompt {start + i}")
                out.append([a["text"] for a in group])
        return out

    def close(self) -> None:
        self.engine.shutdown()


class TransformersEngine:
    def __init__(self, model_path: str, tokenizer, device: str = "cpu", seed: int = 0, batch_size: int = 4):
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.model = AutoModelForCausalLM.from_pretrained(model_path).to(device).eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    def generate(self, texts: list[str], sampling: Sampling) -> list[list[str]]:
        import torch

        tokenizer = self.tokenizer
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        k = sampling.samples_per_prompt
        out: list[list[str]] = []
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            inputs = tokenizer(batch, return_tensors="pt", padding=True).to(self.model.device)
            with torch.no_grad():
                generated = self.model.generate(
                    **inputs,
                    do_sample=True,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    max_new_tokens=sampling.max_new_tokens,
                    num_return_sequences=k,
                    pad_token_id=tokenizer.pad_token_id,
                )
            decoded = tokenizer.batch_decode(generated[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
            out += [decoded[i * k : (i + 1) * k] for i in range(len(batch))]
        return out

    def close(self) -> None:
        self.model = None
