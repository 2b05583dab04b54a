"""What an SGLang 0.5.15 server actually serves after a weight push: its version and its weights
(test-only probes; the push-name check is the package's, ``epic_slime.slime.stream.served_weights``).

- **The version.** ``GET /get_weight_version`` answers 404 in SGLang 0.5.15 ("deprecated, use
  /model_info"); slime 624b824a's ``SGLangEngine.get_weight_version`` still calls it (from
  ``actor_group.py`` under ``--ci-test`` after a disk reload, refused by ``checks``).
  ``served_weight_version`` reads ``/model_info``.
- **The weights.** A weight update answers ``{"success": true}`` for parameter names the engine cannot
  map and loads nothing. ``confirm_push`` scores a fixed probe sequence on the server (the prompt's own
  log-probs: no sampling, nothing random) and compares it with the pushed model's float forward: a push
  that loaded nothing leaves the old model's log-probs, which differ from the pushed model's by more
  than bf16 noise whenever the push changed the weights noticeably.
"""

from __future__ import annotations

import uuid
from typing import Any

# bf16 serving against the float trainer: mean |gap| about 1e-3 per token on the tiny model
# (tests/slime_adapter/test_real_sglang.py); a push that loaded nothing is off by tenths
CONFIRM_MEAN_TOL = 0.01


class PushNotApplied(RuntimeError):
    """The server answered the push but does not serve the pushed weights."""


def _http(http=None):
    if http is not None:
        return http
    import requests

    session = requests.Session()
    session.trust_env = False
    return session


def served_weight_version(url: str, http=None, timeout: float = 60) -> str:
    """The weight version the server at ``url`` serves, from ``/model_info`` (SGLang 0.5.15 answers
    404 to ``/get_weight_version``)."""
    reply = _http(http).get(f"{url.rstrip('/')}/model_info", timeout=timeout)
    reply.raise_for_status()
    body = reply.json()
    if "weight_version" not in body:
        raise RuntimeError(f"{url}/model_info has no weight_version: keys {sorted(body)}")
    return str(body["weight_version"])


def served_logprobs(url: str, ids: list[int], http=None, timeout: float = 300) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1 as the server at ``url`` computes them (its prompt
    log-probs, temperature 1). A fresh ``extra_key``: no prefix KV cached under older weights."""
    body = {
        "input_ids": list(ids),
        "return_logprob": True,
        "logprob_start_len": 0,
        "sampling_params": {"max_new_tokens": 1, "temperature": 1.0},
        "extra_key": "epic-probe-" + uuid.uuid4().hex,
    }
    reply = _http(http).post(f"{url.rstrip('/')}/generate", json=body, timeout=timeout)
    reply.raise_for_status()
    rows = reply.json()["meta_info"]["input_token_logprobs"]
    values = [row[0] for row in rows if row[0] is not None]
    if len(values) != len(ids) - 1:
        raise RuntimeError(f"{url}/generate returned {len(values)} prompt log-probs for {len(ids)} tokens")
    return [float(v) for v in values]


def model_logprobs(model: Any, ids: list[int]) -> list[float]:
    """The same log-probs from ``model``'s own forward (float64 softmax over its logits)."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0, :-1].double()
    picked = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return [float(v) for v in picked]


def mean_gap(a: list[float], b: list[float]) -> float:
    if len(a) != len(b) or not a:
        raise ValueError(f"mean_gap: lengths {len(a)} and {len(b)}")
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


def confirm_push(url: str, model: Any, ids: list[int], tol: float = CONFIRM_MEAN_TOL, http=None) -> float:
    """Raise ``PushNotApplied`` unless the server at ``url`` scores ``ids`` as ``model`` does (mean
    |log-prob gap| per token at most ``tol``); returns the gap."""
    gap = mean_gap(served_logprobs(url, ids, http), model_logprobs(model, ids))
    if gap > tol:
        raise PushNotApplied(
            f"{url} does not serve the pushed weights: mean |log-prob gap| {gap:.4g} per token on "
            f"the probe > {tol} (a push answered success but loaded nothing? check the "
            f"parameter names: per-expert checkpoint names and lm_head.weight)"
        )
    return gap
