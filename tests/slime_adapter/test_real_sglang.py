"""The real SGLang 0.5.15.post1 server and sglang-router 0.3.2 on CPU (tests/support/real_sglang.py): the
session's server serves the embedded runtime's tiny Qwen3-MoE exported by ``epic_slime.runtime.hf_export``;
its log-probs are the float32 Hugging Face forward's within bf16 noise, it reports its version in
``/model_info``, and the router forwards to it."""

from __future__ import annotations

import pytest
import torch

from support.real_sglang import MAX_NEW


def _prompt(text: str) -> list[int]:
    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    return [tok.bos_id] + tok.encode(text)


@torch.no_grad()
def _reference_logprobs(model, prompt, tokens, temperature):
    ids = torch.tensor([prompt + tokens])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_generate_logprobs_are_the_float32_forward_within_bf16_noise(real_engines, temperature, top_p):
    prompt = _prompt("3+5-2=")
    answer = real_engines.server.submit(
        prompt, max_new_tokens=MAX_NEW - len(prompt), temperature=temperature, top_p=top_p
    ).result()
    rows = answer["meta_info"]["output_token_logprobs"]
    assert rows and all(len(r) == 3 and r[2] is None for r in rows)
    tokens = [int(t) for _, t, _ in rows]
    got = torch.tensor([float(v) for v, _, _ in rows], dtype=torch.float64)
    ref = _reference_logprobs(real_engines.model, prompt, tokens, temperature)
    gap = (got - ref).abs()
    # bf16 weights against the float32 trainer: about 1e-3 per token; a wrong head, temperature or
    # top-p renormalisation is off by tenths (a zero head gives log(1/19) everywhere)
    assert gap.max() < 0.03, gap.tolist()
    assert gap.mean() < 0.01


def test_model_info_reports_the_version_and_get_weight_version_is_gone(real_engines):
    server = real_engines.server
    assert server.get("/model_info").status_code == 200
    assert server.weight_version() == "default"
    # slime 624b824a's SGLangEngine.get_weight_version calls this; 0.5.15 answers 404 (use /model_info)
    assert server.get("/get_weight_version").status_code == 404


def test_the_router_lists_the_server_and_forwards_generate(real_engines):
    router = real_engines.router
    assert router.workers() == [real_engines.server.url]
    body = {
        "input_ids": _prompt("1+1="),
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 4, "temperature": 1.0},
    }
    answer = router.http.post(router.url + "/generate", json=body, timeout=120).json()
    assert len(answer["meta_info"]["output_token_logprobs"]) == len(answer["output_ids"]) >= 1
