"""Responses with tool spans, and the same responses with the spans cut out (issue 44, item 2).

A multi-turn agent's response interleaves model tokens (loss mask 1) with tool-output tokens
(loss mask 0, slime's ``Sample.append_response_tokens(..., trainable=False)``: rollout log-prob 0.0
as a placeholder). Everything computed from a response must treat it exactly like the response with
its tool spans removed. ``with_spans`` inserts spans whose every per-token value is absurd (log-probs
+50 and -1e4, advantages 1e6, Top-K entries NaN), so that any leak shows in the loss, the gradient
or a metric; ``model_index`` maps the cut response's tokens to their places in the spanned one.
"""

from __future__ import annotations

import torch

ABSURD_LOG_PROBS = (50.0, -1e4)  # a "probability" of e^50, and one of e^-10000
ABSURD_ADVANTAGE = 1e6


def span_layout(n_model: int, spans: list[tuple[int, int]]) -> tuple[list[bool], list[int]]:
    """(is_model per response position, the response position of each model token) for ``n_model``
    model tokens and ``spans`` = [(model tokens before the span, span length)], sorted."""
    is_model, model_index = [], []
    cuts = dict(spans)
    for j in range(n_model + 1):
        is_model += [False] * cuts.get(j, 0)
        if j < n_model:
            model_index.append(len(is_model))
            is_model.append(True)
    return is_model, model_index


def absurd_values(n: int, dtype=torch.float64) -> torch.Tensor:
    """Alternating +50 / -1e4: placeholder and trainer log-probs no log-prob could have."""
    return torch.tensor([ABSURD_LOG_PROBS[i % 2] for i in range(n)], dtype=dtype)


def with_spans(model_values: torch.Tensor, is_model: list[bool], fill: torch.Tensor) -> torch.Tensor:
    """A response row (first dim) holding ``model_values`` at model positions and ``fill`` (one row
    per tool position, in order) at tool positions."""
    out = torch.empty((len(is_model), *model_values.shape[1:]), dtype=model_values.dtype)
    keep = torch.tensor(is_model)
    out[keep] = model_values
    out[~keep] = fill.to(model_values.dtype)
    return out
