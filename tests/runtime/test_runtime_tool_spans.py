"""The embedded runtime's trainer with tool spans (issue 44, item 2): a sample's ``loss_mask`` marks
tool tokens, and whatever behaviour log-probs those tokens carry (slime's 0.0 placeholder, or
absurd +50 / -1e4), the step's loss, gradient, every metric and the new weights are the same,
with and without TIS and the KL term. Without the mask the absurd values are refused."""

from __future__ import annotations

import pytest
import torch

from epic_slime.runtime.trainer import loss_mask_rows
from support.runtime_helpers import tiny_trainer
from support.tool_spans import absurd_values


def _with_tool_spans(samples, placeholder):
    """Every second response token of every third sample (and the first two tokens of the others) is a
    tool token, its behaviour log-prob replaced by ``placeholder(n)``."""
    out = []
    for i, s in enumerate(samples):
        n = len(s["response_ids"])
        mask = [0 if (i % 3 == 0 and t % 2 == 1) or (i % 3 != 0 and t < 2 and n > 2) else 1 for t in range(n)]
        tool = [t for t in range(n) if mask[t] == 0]
        behavior = list(s["behavior_log_probs"])
        for t, v in zip(tool, placeholder(len(tool)).tolist()):
            behavior[t] = v
        out.append({**s, "loss_mask": mask, "behavior_log_probs": behavior})
    return out


def _step(samples, **kw):
    trainer, _, _ = tiny_trainer(**kw)
    metrics = trainer.train_step(samples)
    return metrics, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("kw", [{}, {"use_tis": True}, {"kl_loss_coef": 1e-2}], ids=["plain", "tis", "kl"])
def test_tool_token_placeholders_change_nothing(kw):
    _, samples, _ = tiny_trainer()
    zeros = _with_tool_spans(samples, lambda n: torch.zeros(n, dtype=torch.float64))  # slime's placeholder
    absurd = _with_tool_spans(samples, absurd_values)
    assert sum(m == 0 for s in absurd for m in s["loss_mask"]) >= 10
    m0, w0 = _step(zeros, **kw)
    m1, w1 = _step(absurd, **kw)
    assert set(m0) == set(m1)
    for name in m0:
        assert m1[name] == m0[name] or (m0[name] != m0[name] and m1[name] != m1[name]), name
    for name in w0:
        assert torch.equal(w0[name], w1[name]), name
    # the mask is what protects: the same values on trained tokens move the weights
    m2, w2 = _step([{**s, "loss_mask": None} for s in zeros], **kw)
    assert any(not torch.equal(w0[k], w2[k]) for k in w0)


def test_without_the_mask_absurd_placeholders_are_refused():
    _, samples, _ = tiny_trainer()
    absurd = [{**s, "loss_mask": None} for s in _with_tool_spans(samples, absurd_values)]
    with pytest.raises(Exception, match="behavior_log_probs has a positive .* value 50.0"):
        _step(absurd)


def test_bad_loss_masks_name_the_sample_and_the_lengths():
    samples = [{"response_ids": [1, 2, 3], "loss_mask": [1, 0]}]
    with pytest.raises(ValueError, match=r"^sample 0: loss_mask has 2 entries for 3 response tokens$"):
        loss_mask_rows(samples, 4)
    with pytest.raises(ValueError, match=r"^sample 0: loss_mask holds 2; it must be 0 or 1"):
        loss_mask_rows([{"response_ids": [1, 2], "loss_mask": [1, 2]}], 4)
    rows = loss_mask_rows([{"response_ids": [1, 2, 3], "loss_mask": [1, 0, 1]}, {"response_ids": [5]}], 4)
    assert rows.tolist() == [[True, False, True, True], [True, True, True, True]]
