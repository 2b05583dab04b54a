"""The tiny Qwen3-MoE as a Hugging Face checkpoint (config, safetensors, tokenizer), so that the real
SGLang server and offline engine can serve the embedded runtime's model.

The tokenizer is the task's character tokenizer (``task.Tokenizer``: same ids, ``Answer:`` one token)
built offline with ``tokenizers``: a word-level vocabulary over single characters, decoded without
separators, so SGLang's detokenised ``text`` is the task's text.
"""

from __future__ import annotations

import os


def hf_tokenizer():
    """``transformers.PreTrainedTokenizerFast`` with exactly ``task.Tokenizer``'s vocabulary and ids."""
    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    from .task import ANSWER, BOS, EOS, PAD, Tokenizer as TaskTokenizer

    task = TaskTokenizer()
    core = Tokenizer(models.WordLevel(dict(task.token_to_id), unk_token=PAD))
    # "Answer:" first, then any single character: the task tokenizer's longest match
    core.pre_tokenizer = pre_tokenizers.Split(Regex(f"{ANSWER}|."), behavior="isolated")
    core.decoder = decoders.Fuse()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=PAD,
        clean_up_tokenization_spaces=False,
    )
    # SGLang's chat endpoints need a template; the task's prompt is the message itself after <bos>
    fast.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return fast


def export_checkpoint(model, folder: str | os.PathLike, dtype: str = "bfloat16") -> str:
    """Save ``model`` (the runtime's ``Qwen3MoeForCausalLM``) and the task tokenizer to ``folder``
    in ``dtype`` (the engine's serving precision; the trainer keeps float32). Returns the folder."""
    import copy

    import torch

    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    served = copy.deepcopy(model).to(getattr(torch, dtype))
    served.config.dtype = dtype
    # SGLang's Qwen3-MoE ignores tie_word_embeddings: without an lm_head.weight in the file its output
    # head stays zero and every token gets log(1/V), silently. Save the head untied, as its own tensor.
    served.config.tie_word_embeddings = False
    served.lm_head.weight = torch.nn.Parameter(served.model.embed_tokens.weight.detach().clone())
    served.save_pretrained(folder, safe_serialization=True)
    hf_tokenizer().save_pretrained(folder)
    _check_saved_head(folder)
    return folder


def checkpoint_tensors(model) -> dict:
    """``model``'s parameters under the names and layout of its saved checkpoint, as a weight push to
    SGLang must name them: per-expert ``mlp.experts.{e}.gate_proj / up_proj / down_proj.weight``
    (transformers 5 fuses them in memory as ``gate_up_proj`` / ``down_proj``, names SGLang answers
    ``success`` to and loads nothing from) and ``lm_head.weight`` as its own tensor (the runtime's
    model ties it to the embedding; SGLang's Qwen3-MoE keeps it separate). Detached views, float32."""
    from transformers.core_model_loading import revert_weight_conversion

    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    if "lm_head.weight" not in state:
        state["lm_head.weight"] = model.get_output_embeddings().weight.detach()
    out = revert_weight_conversion(model, state)
    if "lm_head.weight" not in out:
        raise RuntimeError("checkpoint_tensors: the converted state has no lm_head.weight")
    return out


def _check_saved_head(folder: str) -> None:
    from safetensors import safe_open

    names = set()
    for name in os.listdir(folder):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(folder, name), "pt") as f:
                names.update(f.keys())
    if "lm_head.weight" not in names:
        raise RuntimeError(f"exported checkpoint {folder} has no lm_head.weight: SGLang would serve a zero head")


def export_initial_checkpoint(folder: str | os.PathLike, seed: int = 0, dtype: str = "bfloat16"):
    """The runtime's freshly initialised tiny policy (``model.build_policy`` with the default size),
    exported; returns (folder, the float32 model)."""
    from .model import ModelConfig, build_policy
    from .task import Tokenizer

    tok = Tokenizer()
    model = build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=seed).eval()
    return export_checkpoint(model, folder, dtype), model
