"""Tool tokens never count in the core (issue 44, item 2): every loss mode, its gradient, its metrics
and the TIS weights, with tool spans of absurd log-probs, equal the same responses with the spans
cut out, and the cut responses equal the independent float64 reference (tests/support/loss_reference.py).
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from epic_slime.losses import LOSS_MODES, compute_policy_loss
from epic_slime.losses.tis import tis_diagnostics, tis_weighted_loss, tis_weights
from epic_slime.losses.topk import TopKInputs, gather_log_probs, topk_inputs_from_logits
from support.loss_reference import loss_and_grad
from support.tool_spans import ABSURD_ADVANTAGE, absurd_values, span_layout, with_spans

ALL_MODES = sorted(LOSS_MODES)
VOCAB, K = 8, 3
# (model tokens, [(model tokens before the span, span length)]): a span first, spans back to back
# with one model token between, a span last, a row without spans, one model token in a long span.
ROWS = [
    (9, [(0, 3), (4, 2), (5, 4)]),
    (12, [(3, 1), (12, 5)]),
    (7, []),
    (1, [(0, 6), (1, 2)]),
    (10, [(2, 3), (7, 3)]),
]


def _model_rows(seed: int = 0):
    """Per row: log pi, log mu, advantage and Top-K inputs of the model tokens alone (full softmax
    policies on a small vocabulary, pi = mu's logits + noise, tokens sampled from mu)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for b, (n, spans) in enumerate(ROWS):
        mu_logits = 2.0 * torch.randn(1, n, VOCAB, generator=g, dtype=torch.float64)
        pi_logits = mu_logits + 0.6 * torch.randn(1, n, VOCAB, generator=g, dtype=torch.float64)
        sampled = torch.multinomial(torch.softmax(mu_logits[0], -1), 1, generator=g).reshape(1, n)
        topk = topk_inputs_from_logits(pi_logits, mu_logits, sampled, K)
        rows.append(
            dict(
                lp=gather_log_probs(pi_logits, sampled[..., None]).reshape(n),
                blp=gather_log_probs(mu_logits, sampled[..., None]).reshape(n),
                adv=torch.full((n,), [1.0, -0.8, 0.5, -1.2, 0.9][b], dtype=torch.float64),
                topk=[t[0].detach() for t in (topk.behavior_topk_log_probs, topk.current_topk_log_probs)],
                topk_mask=topk.topk_mask[0],
                spans=spans,
            )
        )
    return rows


def _batches(rows):
    """(cut, spanned) padded batches and, per row, the spanned positions of the model tokens."""
    cut = {k: [] for k in ("lp", "blp", "adv", "mask", "btk", "ctk", "tkm")}
    spanned = {k: [] for k in cut}
    positions = []
    for r in rows:
        n = r["lp"].numel()
        is_model, index = span_layout(n, r["spans"])
        n_tool = len(is_model) - n
        positions.append(torch.tensor(index, dtype=torch.long))
        absurd = absurd_values(n_tool)
        for target, values in (
            (cut, (r["lp"], r["blp"], r["adv"], torch.ones(n, dtype=torch.bool), *r["topk"], r["topk_mask"])),
            (
                spanned,
                (
                    with_spans(r["lp"], is_model, absurd.flip(0)),
                    with_spans(r["blp"], is_model, absurd),
                    with_spans(r["adv"], is_model, torch.full((n_tool,), ABSURD_ADVANTAGE)),
                    torch.tensor(is_model),
                    with_spans(r["topk"][0], is_model, torch.full((n_tool, K + 1), float("nan"))),
                    with_spans(r["topk"][1], is_model, torch.full((n_tool, K + 1), 50.0)),
                    with_spans(r["topk_mask"], is_model, torch.ones(n_tool, K + 1, dtype=torch.bool)),
                ),
            ),
        ):
            for key, value in zip(("lp", "blp", "adv", "mask", "btk", "ctk", "tkm"), values):
                target[key].append(value)
    pad = {k: (float("nan") if k in ("lp", "btk") else 0) for k in cut}
    out = []
    for target in (cut, spanned):
        out.append({k: pad_sequence(v, batch_first=True, padding_value=pad[k]) for k, v in target.items()})
    return out[0], out[1], positions


def _run(mode, batch, aggregation=None):
    leaf = batch["lp"].clone().requires_grad_(True)
    topk = {}
    if LOSS_MODES[mode].needs_topk:
        topk = TopKInputs(batch["btk"], batch["ctk"], batch["tkm"]).loss_kwargs()
    out = compute_policy_loss(mode, leaf, batch["blp"], batch["adv"], batch["mask"], aggregation=aggregation, **topk)
    out.loss.backward()
    return out, leaf.grad


def _model_entries(spanned: torch.Tensor, positions) -> torch.Tensor:
    return pad_sequence([row[pos] for row, pos in zip(spanned, positions)], batch_first=True)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_tool_spans_change_nothing_in_loss_gradient_or_metrics(mode):
    cut, spanned, positions = _batches(_model_rows())
    out_cut, grad_cut = _run(mode, cut)
    out_span, grad_span = _run(mode, spanned)
    # The loss, to float64 precision (zeros added into sums and prefix sums are exact).
    assert float(out_span.loss.detach()) == pytest.approx(float(out_cut.loss.detach()), rel=1e-14, abs=1e-15), mode
    # The gradient: the cut response's at each model token, exactly 0 at every tool token.
    torch.testing.assert_close(_model_entries(grad_span, positions), grad_cut, rtol=1e-13, atol=1e-15)
    tool = ~spanned["mask"]  # tool tokens and padding
    assert torch.equal(grad_span[tool], torch.zeros_like(grad_span[tool]))
    assert float(grad_cut.abs().sum()) > 0  # the check is not vacuous: the model tokens carry gradient
    # Every diagnostic the mode reports, per-position bins included.
    assert set(out_span.metrics) == set(out_cut.metrics)
    for name, value in out_cut.metrics.items():
        got = out_span.metrics[name]
        torch.testing.assert_close(got.double(), value.double(), rtol=1e-12, atol=1e-14, msg=f"{mode}: {name}")
    # Per-token outputs at model tokens; nothing clipped at a tool token.
    assert torch.equal(_model_entries(out_span.clipped, positions), out_cut.clipped)
    assert not bool(out_span.clipped[tool].any())


@pytest.mark.parametrize("mode", [m for m in ALL_MODES if not LOSS_MODES[m].needs_topk])
@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"])
def test_spanned_loss_equals_the_float64_reference_of_the_cut_responses(mode, aggregation):
    """The spanned batch against the math on the model tokens alone (an independent computation)."""
    cut, spanned, positions = _batches(_model_rows(seed=3))
    out, grad = _run(mode, spanned, aggregation)
    as_list = lambda x: x.double().tolist()  # noqa: E731
    ref_loss, ref_grad = loss_and_grad(
        mode,
        as_list(cut["lp"]),
        as_list(cut["blp"]),
        as_list(cut["adv"]),
        cut["mask"].tolist(),
        dict(LOSS_MODES[mode].defaults),
        aggregation,
    )
    assert float(out.loss.detach()) == pytest.approx(ref_loss, rel=1e-10, abs=1e-12), (mode, aggregation)
    want = torch.tensor(ref_grad, dtype=torch.float64) * cut["mask"]
    torch.testing.assert_close(_model_entries(grad, positions) * cut["mask"], want, rtol=1e-10, atol=1e-12)


def test_tis_weights_and_diagnostics_ignore_tool_spans():
    """TIS weights pi_old / mu: 0 at tool tokens whatever their placeholder, the cut responses'
    weights at model tokens; the mean weight, truncated share and weighted loss unchanged."""
    cut, spanned, positions = _batches(_model_rows(seed=5))
    old_cut = cut["lp"] + 0.3  # pi_old off mu by a gap that truncates some weights at the clip
    old_span = spanned["lp"].clone()
    for b, pos in enumerate(positions):
        old_span[b, pos] = old_cut[b, : pos.numel()]
    w_cut = tis_weights(old_cut, cut["blp"], cut["mask"], clip=1.2, clip_low=0.9)
    w_span = tis_weights(old_span, spanned["blp"], spanned["mask"], clip=1.2, clip_low=0.9)
    assert torch.equal(_model_entries(w_span, positions), w_cut)
    assert float(w_span[~spanned["mask"]].abs().sum()) == 0.0
    d_cut, d_span = tis_diagnostics(w_cut, cut["mask"], 1.2), tis_diagnostics(w_span, spanned["mask"], 1.2)
    for name in d_cut:
        assert float(d_span[name]) == pytest.approx(float(d_cut[name]), rel=1e-14), name
    assert 0 < float(d_cut["tis_truncated_frac"]) < 1
    out_cut, _ = _run("epic", cut)
    out_span, _ = _run("epic", spanned)
    for aggregation in ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum"):
        a = tis_weighted_loss(out_cut.per_token_loss, w_cut, cut["mask"], aggregation)
        b = tis_weighted_loss(out_span.per_token_loss, w_span, spanned["mask"], aggregation)
        assert float(b) == pytest.approx(float(a), rel=1e-14, abs=1e-16), aggregation
