"""The SGLang stand-in at its HTTP interface, against SGLang 0.5.15.post1's behaviour (see
tests/support/sglang_standin.py for the cited code): the three pause modes, /flush_cache refused
while requests run or wait, the weight version read at answer time, a weight update's own flush,
continuous batching across sampling settings, the long-response rule only on training requests,
the per-extra_key prefix cache, and the routed experts R3 asks for (the model's own top-k, rows
aligned under left padding; a misaligned offset fails it). Each test fails on the stand-in before these behaviours
(abort on every pause, one sampling key per batch, the long rule on every request, no cache)."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("aiohttp") is None or importlib.util.find_spec("requests") is None:
    pytest.skip("the SGLang stand-in needs aiohttp and requests", allow_module_level=True)

from support.conformance import loads, long_request, spliced_logprobs
from support.sglang_client import MAX_NEW, logprobs_under, perturbed_models, standin_factory, tokens_of


@pytest.fixture
def standin(tmp_path):
    with standin_factory(tmp_path) as start:
        yield start


LONG = ["--long-every", "1", "--long-min-new-tokens", str(MAX_NEW), "--long-max-new-tokens", str(MAX_NEW)]


def test_in_place_pause_keeps_the_request_decoding_on_the_new_weights(standin, tmp_path):
    """in_place: the running request is not aborted; /flush_cache fails while it waits; the update
    (flush_cache false) loads; after continue it decodes on, its earlier tokens drawn from the old
    weights and the later ones from the new; it reports the version at answer time."""
    old, new, path, tok = perturbed_models(tmp_path)
    server = standin("--step-seconds", "0.03")
    prompt = tokens_of("12+7=")
    answer = long_request(server, prompt, MAX_NEW)
    server.wait_for(lambda s: s.get("decode_steps", 0) >= 3)
    assert server.post("/pause_generation", {"mode": "in_place"}).status_code == 200
    assert loads(server) == (1, 0)
    flush = server.get("/flush_cache")
    assert (flush.status_code, flush.text) == (400, "Flush cache failed.\n")
    update = server.post("/update_weights_from_disk", {"model_path": path, "flush_cache": False, "weight_version": "7"})
    assert update.status_code == 200 and update.json()["success"], update.text
    assert server.post("/continue_generation").status_code == 200
    got = answer.result(60)
    meta = got["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and len(got["output_ids"]) == MAX_NEW
    assert meta["weight_version"] == "7"  # submitted under "default": the version at answer time
    tokens, reported = got["output_ids"], [lp for lp, _, _ in meta["output_token_logprobs"]]
    under_old = logprobs_under(old, tok, prompt, tokens, mask_stop=False)
    under_new = logprobs_under(new, tok, prompt, tokens, mask_stop=False)
    matches_old = [abs(a - b) < 1e-4 for a, b in zip(reported, under_old)]
    switch = matches_old.index(False)  # the first token after the update
    assert 3 <= switch < MAX_NEW, matches_old
    assert all(matches_old[:switch])
    # the new weights decode over the KV the old ones computed (SGLang keeps it): not the new model's own
    spliced = spliced_logprobs(old, new, prompt + tokens, len(prompt) + switch - 1, len(prompt) + switch).tolist()
    assert all(abs(a - b) < 1e-4 for a, b in zip(reported[switch:], spliced))
    assert any(abs(a - b) > 1e-3 for a, b in zip(reported[switch + 1 :], under_new[switch + 1 :]))
    stats = server.stats()
    assert stats.get("aborted", 0) == 0 and stats["pauses_in_place"] == 1 and stats["spanning_answers"] == 1
    assert stats["flush_failed"] == 1 and stats.get("flushes", 0) == 0


def test_an_update_that_flushes_while_requests_run_ends_the_server(standin, tmp_path):
    """SGLang asserts that the update's own flush succeeded (flush_cache defaults to true): with a
    request paused in place the scheduler dies, and the server with it."""
    _, _, path, _ = perturbed_models(tmp_path)
    server = standin(*LONG, "--step-seconds", "0.03")
    server.submit(tokens_of("3+4="))
    server.wait_for(lambda s: s.get("decode_steps", 0) >= 1)
    server.post("/pause_generation", {"mode": "in_place"})
    reply = server.post("/update_weights_from_disk", {"model_path": path})
    assert reply.status_code == 500 and "Cache flush failed after updating weights" in reply.json()["message"]
    assert server.proc.wait(10) == 3


def test_retract_requeues_the_running_request_and_prefills_it_again(standin, tmp_path):
    _, _, path, _ = perturbed_models(tmp_path)
    server = standin(*LONG, "--step-seconds", "0.03")
    answer = server.submit(tokens_of("5+5="))
    server.wait_for(lambda s: s.get("decode_steps", 0) >= 3)
    server.post("/pause_generation", {"mode": "retract"})
    assert loads(server) == (0, 1)
    assert server.get("/flush_cache").status_code == 400  # a waiting request: not idle either
    server.post("/update_weights_from_disk", {"model_path": path, "flush_cache": False, "weight_version": "2"})
    server.post("/continue_generation")
    got = answer.result(60)
    assert got["meta_info"]["finish_reason"]["type"] == "length" and len(got["output_ids"]) == MAX_NEW
    assert got["meta_info"]["num_retractions"] == 1 and got["meta_info"]["weight_version"] == "2"
    stats = server.stats()
    assert stats["retracted"] == 1 and stats["reprefill_tokens"] > 0 and stats.get("aborted", 0) == 0


def test_abort_is_the_default_mode_and_the_flush_then_succeeds(standin):
    server = standin(*LONG, "--step-seconds", "0.03")
    answer = server.submit(tokens_of("9+1="))
    server.wait_for(lambda s: s.get("decode_steps", 0) >= 3)
    server.post("/pause_generation")  # slime's body: {}
    got = answer.result(60)
    assert got["meta_info"]["finish_reason"]["type"] == "abort" and 3 <= len(got["output_ids"]) < MAX_NEW
    late = server.submit(tokens_of("1+1="))  # arrives while paused: waits before the scheduler
    flush = server.get("/flush_cache")
    assert flush.status_code == 200 and flush.text.startswith("Cache flushed.")
    assert not late.done()
    server.post("/continue_generation")
    assert late.result(60)["meta_info"]["finish_reason"]["type"] == "length"


def test_an_evaluation_with_other_sampling_settings_joins_the_running_batch(standin):
    """SGLang batches across sampling settings: an eval request (its own temperature and top-p)
    finishes while a long training request still decodes."""
    server = standin(
        "--long-every",
        "1",
        "--long-min-new-tokens",
        str(MAX_NEW),
        "--long-max-new-tokens",
        str(MAX_NEW),
        "--step-seconds",
        "0.02",
    )
    training = server.submit(tokens_of("12+7="))
    server.wait_for(lambda s: s.get("decode_steps", 0) >= 2)
    evaluation = server.submit(tokens_of("2+2="), max_new_tokens=4, temperature=0.6, top_p=0.7)
    assert evaluation.result(60)["meta_info"]["completion_tokens"] <= 4
    assert not training.done(), "the evaluation waited for the training request"
    assert server.stats()["max_batch_seen"] == 2
    assert len(training.result(60)["output_ids"]) == MAX_NEW


def test_the_long_response_rule_spares_evaluation_requests(standin):
    """Only training requests (max_new_tokens + answered = --long-max-new-tokens) must run long; an
    evaluation request (another cap) stops when the model stops."""
    server = standin("--long-every", "1", "--long-min-new-tokens", "30", "--long-max-new-tokens", "24")
    prompts = [tokens_of(f"{a}+{b}=") for a in range(4) for b in range(4)]
    evals = [server.submit(p, max_new_tokens=10) for p in prompts]
    training = [server.submit(p, max_new_tokens=24) for p in prompts[:4]]
    eval_reasons = [f.result(60)["meta_info"]["finish_reason"]["type"] for f in evals]
    assert "stop" in eval_reasons, eval_reasons
    assert all(f.result(60)["meta_info"]["finish_reason"]["type"] == "length" for f in training)
    # a resubmitted training request (prompt + 5 response tokens, cap 24 - 5) is still one
    resubmitted = server.submit(prompts[0] + tokens_of("1")[1:] * 5, max_new_tokens=19).result(60)
    assert resubmitted["meta_info"]["finish_reason"]["type"] == "length"
    assert server.stats()["long_requests"] == 5


def test_prefix_cache_is_kept_apart_by_extra_key_and_counts_old_weight_reuse(standin, tmp_path):
    """Without a flush (an in-place push) a later request without extra_key reuses prefix KV
    computed under the old weights (cached_tokens > 0, counted stale); a fresh extra_key does not;
    requests of one key sent together share their prompt."""
    _, _, path, _ = perturbed_models(tmp_path)
    server = standin()
    prompt = tokens_of("12+7=")
    first = server.submit(prompt, max_new_tokens=4).result(60)
    assert first["meta_info"]["cached_tokens"] == 0
    server.post("/pause_generation", {"mode": "in_place"})
    server.post("/update_weights_from_disk", {"model_path": path, "flush_cache": False, "weight_version": "1"})
    server.post("/continue_generation")
    again = server.submit(prompt, max_new_tokens=4).result(60)
    assert again["meta_info"]["cached_tokens"] == len(prompt) - 1
    assert server.stats()["stale_prefix_hits"] == 1
    keyed = server.submit(prompt, max_new_tokens=4, extra_key="group-2").result(60)
    assert keyed["meta_info"]["cached_tokens"] == 0
    group = [server.submit(prompt, max_new_tokens=4, extra_key="group-3") for _ in range(3)]
    cached = sorted(f.result(60)["meta_info"]["cached_tokens"] for f in group)
    assert cached[0] == 0 and cached[-1] == len(prompt) - 1
    stats = server.stats()
    assert stats["stale_prefix_hits"] == 1 and stats["prefix_hits"] >= 3
    # a flush (legal: idle) empties every key's tree
    assert server.get("/flush_cache").status_code == 200
    assert server.submit(prompt, max_new_tokens=4).result(60)["meta_info"]["cached_tokens"] == 0


def _routing_of(answer, layers, topk):
    import base64

    import numpy as np

    raw = answer["meta_info"].get("routed_experts")
    return None if raw is None else np.frombuffer(base64.b64decode(raw), dtype=np.int32).reshape(-1, layers, topk)


def test_routed_experts_are_the_models_own_top_k_of_every_computed_position(standin, tmp_path):
    """return_routed_experts: int32 base64 [input + output - 1, layers, topk], the experts the tiny
    Qwen3-MoE routes each position to (checked by one unpadded forward of the whole sequence),
    while other requests share the batch (left padding must not shift the rows); a request
    without the flag gets no routing."""
    import numpy as np
    import torch

    old, _, _, _ = perturbed_models(tmp_path)
    layers, topk = old.config.num_hidden_layers, old.config.num_experts_per_tok
    server = standin()
    prompts = [tokens_of(f"{a}+{b}=") for a, b in ((3, 4), (12, 30), (7, 7))]
    asked = [server.submit(p, return_routed_experts=True) for p in prompts]
    plain = server.submit(tokens_of("1+1="))
    for prompt, future in zip(prompts, asked):
        answer = future.result(60)
        got = _routing_of(answer, layers, topk)
        sequence = prompt + answer["output_ids"]
        assert got.shape == (len(sequence) - 1, layers, topk)
        with torch.no_grad():
            logits = old(
                input_ids=torch.tensor([sequence[:-1]]), use_cache=False, output_router_logits=True
            ).router_logits
        want = np.stack([lg.topk(topk, dim=-1).indices.numpy() for lg in logits], axis=1)
        assert np.array_equal(np.sort(got, -1), np.sort(want, -1))
    assert _routing_of(plain.result(60), layers, topk) is None
