"""``--weight-push-mode retract`` against the real SGLang 0.5.15.post1 server (tests/support/real_sglang.py):
requests running at a ``{"mode": "retract"}`` pause go back to the waiting queue with their tokens, the
weights change (``flush_cache: false``: a flush is refused while they wait), and after
``/continue_generation`` they are prefilled again and finish on the new weights. Each answer reports
``num_retractions`` and the new ``weight_version``; its log-probs are the old weights' up to the pause and
the new weights' after it (which is why the stream counts a retracted sample's staleness from the version
it was submitted at, ``epic_slime.slime.stream.group_stream``). The re-prefill is not the whole sequence: the
prompt's KV still sits in the radix tree (computed by the old weights, never flushed), so only the output
so far is recomputed, and the tokens after the push are the new weights over the old prompt KV.

The test puts the session server back on its own checkpoint and version afterwards."""

from __future__ import annotations

import json
import queue
import threading
import uuid

import torch

from support.real_sglang import MAX_NEW

NEW_VERSION = "retract-v1"
TOL = 0.03  # bf16 server against the float32 forward (test_real_sglang.py); the two models differ by tenths


def _prompt(text: str) -> list[int]:
    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    return [tok.bos_id] + tok.encode(text)


@torch.no_grad()
def _reference(model, prompt, tokens, temperature=1.0):
    ids = torch.tensor([prompt + tokens])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


def _stream(server, prompt, budget):
    """A streamed ``/generate`` (every chunk carries the output so far): a queue of chunk dicts, then None."""
    body = {
        "input_ids": prompt,
        "return_logprob": True,
        "stream": True,
        "extra_key": f"retract-{uuid.uuid4().hex}",
        "sampling_params": {"max_new_tokens": budget, "temperature": 1.0, "ignore_eos": True},
    }
    chunks: queue.Queue = queue.Queue()

    def read():
        try:
            with server.http.post(server.url + "/generate", json=body, stream=True, timeout=600) as answer:
                for line in answer.iter_lines():
                    if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                        chunks.put(json.loads(line[5:]))
        finally:
            chunks.put(None)

    threading.Thread(target=read, daemon=True).start()
    return chunks


def _last(chunks) -> dict:
    last = None
    while (chunk := chunks.get(timeout=600)) is not None:
        last = chunk
    assert last is not None, "the stream ended without an answer"
    return last


@torch.no_grad()
def _old_prompt_kv_reference(old, new, prompt, tokens):
    """Log-probs of ``tokens`` when the prompt's KV comes from ``old`` and every later position from ``new``."""
    seq = prompt + tokens
    head = old(input_ids=torch.tensor([prompt]), use_cache=True)
    tail = new(input_ids=torch.tensor([seq[len(prompt) :]]), past_key_values=head.past_key_values).logits[0]
    logits = torch.cat([head.logits[0, -1:], tail[:-1]]).double()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


def _split_points(got, old, new) -> list[int]:
    """Every k such that tokens [0, k) carry the old weights' log-probs and [k, n) the new ones' (several
    when a token near the pause has about the same log-prob under both)."""
    n = len(got)
    return [
        k
        for k in range(n + 1)
        if all(abs(got[i] - old[i]) < TOL for i in range(k)) and all(abs(got[i] - new[i]) < TOL for i in range(k, n))
    ]


def _streamed_two(chunks) -> bool:
    """Read a stream until it has carried 2 tokens (True: the request is running) or ended (False)."""
    while (chunk := chunks.get(timeout=600)) is not None:
        if len(chunk["meta_info"]["output_token_logprobs"]) >= 2:
            return True
    return False


def retract_push_meets_running_requests(server, model, model_dir, new_dir, new_model, requests_=2):
    """Runs the retract push against a live server; returns per request (answer, tokens sampled before the
    pause as streamed, reference log-probs: old, new, new over the old prompt KV); None when every request
    ended before the pause (nothing waits, nothing pushed)."""
    prompt = _prompt("7-3+4=")
    budget = MAX_NEW - len(prompt)
    seen = []
    streams = [_stream(server, prompt, budget) for _ in range(requests_)]
    assert all([_streamed_two(chunks) for chunks in streams]), "a request finished before it streamed 2 tokens"
    assert server.post("/pause_generation", {"mode": "retract"}).status_code == 200
    try:
        # the retracted requests wait in the queue: a flush is refused (so the push must not flush); a flush
        # that succeeds found none waiting: all ended before the pause (see the test), so no push this time
        flushed = server.post("/flush_cache").status_code
        if flushed == 200:
            return None
        assert flushed == 400
        pushed = server.post(
            "/update_weights_from_disk",
            {"model_path": str(new_dir), "flush_cache": False, "weight_version": NEW_VERSION},
        )
        assert pushed.status_code == 200 and pushed.json()["success"], pushed.text
        assert server.weight_version() == NEW_VERSION
    finally:
        assert server.post("/continue_generation").status_code == 200
    try:
        for chunks in streams:
            answer = _last(chunks)
            rows = answer["meta_info"]["output_token_logprobs"]
            tokens = [int(t) for _, t, _ in rows]
            refs = (
                _reference(model, prompt, tokens),
                _reference(new_model, prompt, tokens),
                _old_prompt_kv_reference(model, new_model, prompt, tokens),
            )
            seen.append((answer, budget, [float(v) for v, _, _ in rows], [r.tolist() for r in refs]))
    finally:
        restored = server.post("/update_weights_from_disk", {"model_path": str(model_dir), "weight_version": "default"})
        assert restored.status_code == 200 and restored.json()["success"], restored.text
    assert server.weight_version() == "default"
    return seen


def test_retract_pause_reprefills_the_output_on_the_new_weights_over_the_old_prompt_kv(real_engines, tmp_path):
    from epic_slime.runtime.hf_export import export_initial_checkpoint

    new_dir, new_model = export_initial_checkpoint(tmp_path / "pushed", seed=1)
    # on an idle CPU the real server decodes a whole request in about 0.2 s, and reading 2 tokens off each
    # stream took up to 0.34 s here: a request can end before the pause lands and answer unretracted at the old
    # version (one clean-clone run did). Such an attempt is the server's right, not a finding: try again, up
    # to 10 times (its /v1/loads cannot tell beforehand: after a retract pause of 2 requests it said 0, 1 or
    # 2). A server that never retracts fails every try and the asserts below.
    for _ in range(10):
        seen = retract_push_meets_running_requests(
            real_engines.server, real_engines.model, real_engines.model_dir, new_dir, new_model
        )
        if seen is not None and all(answer["meta_info"]["num_retractions"] == 1 for answer, *_ in seen):
            break
    assert seen is not None, "every request ended before the retract pause in 10 tries"
    for answer, budget, got, (old, new, old_prompt_kv) in seen:
        meta = answer["meta_info"]
        assert meta["weight_version"] == NEW_VERSION and meta["num_retractions"] == 1, meta
        assert len(got) == budget  # the tokens before the pause were kept, none sampled twice
        assert max(abs(a - b) for a, b in zip(old, new)) > 10 * TOL  # the two models are told apart
        # tokens [0, k) were sampled on the old weights (k >= 2: streamed before the pause), the rest on the
        # new weights, whose re-prefill recomputed the output's KV but took the prompt's from the radix tree,
        # computed under the old weights (a flush is refused while the retracted requests wait)
        splits = [k for k in _split_points(got, old, old_prompt_kv) if 2 <= k < budget]
        assert splits, (
            [round(g - o, 3) for g, o in zip(got, old)],
            [round(g - h, 3) for g, h in zip(got, old_prompt_kv)],
        )
        k = splits[-1]
        # and not the new weights' own forward over the whole sequence (what a full re-prefill would give)
        to_new = max(abs(g - n) for g, n in zip(got[k:], new[k:]))
        assert to_new > TOL
        print(
            f"retract: {k} of {budget} tokens before the pause; after it, max |log mu - reference| "
            f"{max(abs(g - h) for g, h in zip(got[k:], old_prompt_kv[k:])):.4f} against the new weights over the "
            f"old prompt KV, {to_new:.3f} against the new weights' own forward"
        )
