"""Issue 46 pattern 6: EpicGRPOTrainer's `_compute_loss` beyond TRL's defaults, on the inputs TRL
hands it (TRL 1.16's `_compute_loss` reads the same keys): gradient accumulation above 1, the
behaviour log-probs of a separate sampler (vLLM), and the tool mask of tool-calling runs.

The trainer is the adapter's own class with TRL's set-up skipped (no model download, no generation):
what TRL would have set is set by hand, and its forward pass (`_get_per_token_logps_and_entropies`)
answers with given log-probs, so each expectation is the core's loss on the same tensors, computed
here independently, gradients by autograd."""

from __future__ import annotations

import types
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl", reason="TRL is not installed (CI installs it: .ci/run, the [trl] extra)")

from epic_slime.integrations.trl import EpicGRPOTrainer  # noqa: E402
from epic_slime.losses import compute_policy_loss  # noqa: E402

B, P, T = 3, 2, 5


class Recording(EpicGRPOTrainer):
    def policy_loss(self, log_probs, behaviour_log_probs, advantages, mask):
        self.given = {"behaviour": behaviour_log_probs, "mask": mask}
        return super().policy_loss(log_probs, behaviour_log_probs, advantages, mask)


def _trainer(log_probs, entropies, accumulation=1, training=True, loss_mode="epic"):
    t = Recording.__new__(Recording)  # TRL's __init__ would load a model and a tokenizer
    t.loss_mode, t.loss_params, t.loss_aggregation = loss_mode, {}, "token-mean"
    t.model = types.SimpleNamespace(training=training)
    t.current_gradient_accumulation_steps = accumulation
    t.aux_loss_enabled = False
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    t.accelerator = types.SimpleNamespace(gather=lambda x: x)

    def forward(model, input_ids, attention_mask, logits_to_keep, **kw):
        assert input_ids.shape == (B, P + T) and logits_to_keep == T
        return log_probs, entropies, None

    t._get_per_token_logps_and_entropies = forward
    return t


def _inputs(**extra):
    g = torch.Generator().manual_seed(0)
    completion_mask = torch.ones(B, T, dtype=torch.int64)
    completion_mask[1, 3:] = 0  # a shorter completion: padding
    return {
        "prompt_ids": torch.ones(B, P, dtype=torch.int64),
        "prompt_mask": torch.ones(B, P, dtype=torch.int64),
        "completion_ids": torch.ones(B, T, dtype=torch.int64),
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.0, -0.5, 0.7]),
        **{k: (v(g) if callable(v) else v) for k, v in extra.items()},
    }


def _log_probs():
    g = torch.Generator().manual_seed(1)
    return (-0.2 - torch.rand(B, T, generator=g, dtype=torch.float32)).requires_grad_(True)


def _entropies():
    return torch.arange(B * T, dtype=torch.float32).reshape(B, T) / 10


def _expected(log_probs, mu, inputs, mask, divide_by=1.0):
    lp = log_probs.detach().clone().requires_grad_(True)
    loss = compute_policy_loss("epic", lp, mu, inputs["advantages"], mask, aggregation="token-mean").loss / divide_by
    loss.backward()
    return loss.detach(), lp.grad


@pytest.mark.parametrize("accumulation, training", [(1, True), (4, True), (4, False)])
def test_the_loss_is_scaled_for_gradient_accumulation_in_training_only(accumulation, training):
    """TRL's Trainer sums the accumulated micro-batches' gradients: each loss is divided by their count
    in training (the effective lr stays that of one batch), never in evaluation."""
    log_probs = _log_probs()
    trainer = _trainer(log_probs, _entropies(), accumulation, training)
    inputs = _inputs(old_per_token_logps=log_probs.detach() - 0.05)
    loss = trainer._compute_loss(None, inputs)
    loss.backward()
    want, want_grad = _expected(
        log_probs, inputs["old_per_token_logps"], inputs, inputs["completion_mask"], accumulation if training else 1
    )
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    torch.testing.assert_close(log_probs.grad, want_grad, rtol=1e-6, atol=1e-9)
    mode = "train" if training else "eval"
    # the logged policy loss is the batch's, not the scaled one (as TRL's own losses log it)
    assert trainer._metrics[mode]["policy_loss"] == [pytest.approx(want.item() * (accumulation if training else 1))]


def test_a_separate_samplers_log_probs_are_the_behaviour_policy():
    """With vLLM generating, TRL passes the sampler's own log-probs (`sampling_per_token_logps`) and,
    over several optimizer steps per generation, the trained model's (`old_per_token_logps`): mu is the
    sampler's. Without it, the trained model's at generation; without both, the current ones detached."""
    log_probs = _log_probs()
    sampler = log_probs.detach() - 0.3
    old = log_probs.detach() - 0.1
    trainer = _trainer(log_probs, _entropies())
    inputs = _inputs(sampling_per_token_logps=sampler, old_per_token_logps=old)
    loss = trainer._compute_loss(None, inputs)
    assert torch.equal(trainer.given["behaviour"], sampler)
    want, _ = _expected(log_probs, sampler, inputs, inputs["completion_mask"])
    other, _ = _expected(log_probs, old, inputs, inputs["completion_mask"])
    assert loss.item() == pytest.approx(want.item(), rel=1e-6) and abs(want.item() - other.item()) > 1e-3

    trainer._compute_loss(None, _inputs(old_per_token_logps=old, sampling_per_token_logps=None))
    assert torch.equal(trainer.given["behaviour"], old)

    on_policy = _log_probs()
    trainer = _trainer(on_policy, _entropies())
    loss = trainer._compute_loss(None, _inputs())
    mu = trainer.given["behaviour"]
    assert not mu.requires_grad and torch.equal(mu, on_policy.detach())
    loss.backward()
    _, want_grad = _expected(on_policy, on_policy.detach(), _inputs(), _inputs()["completion_mask"])
    assert on_policy.grad.abs().sum() > 0
    torch.testing.assert_close(on_policy.grad, want_grad, rtol=1e-6, atol=1e-9)


def test_the_tool_mask_removes_tool_output_tokens_from_the_loss_and_the_entropy():
    """Tool-calling runs: TRL's `tool_mask` is 0 on the tokens a tool wrote (not sampled by the policy):
    the loss and its logged entropy cover completion_mask * tool_mask."""
    log_probs = _log_probs()
    entropies = _entropies()
    tool_mask = torch.ones(B, T, dtype=torch.int64)
    tool_mask[0, 1:3] = 0
    tool_mask[2, 4] = 0
    trainer = _trainer(log_probs, entropies)
    inputs = _inputs(old_per_token_logps=log_probs.detach() - 0.2, tool_mask=tool_mask)
    loss = trainer._compute_loss(None, inputs)
    loss.backward()
    both = inputs["completion_mask"] * tool_mask
    assert torch.equal(trainer.given["mask"], both)
    want, want_grad = _expected(log_probs, inputs["old_per_token_logps"], inputs, both)
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    torch.testing.assert_close(log_probs.grad, want_grad, rtol=1e-6, atol=1e-9)
    assert (log_probs.grad[both == 0] == 0).all()
    entropy = (entropies * both).sum().item() / both.sum().item()
    assert trainer._metrics["train"]["entropy"] == [pytest.approx(entropy, rel=1e-6)]  # float32 in the adapter
