"""The embedded runtime's ratio base (issue 47 item 4): --behavior-logprobs rollout (the engine's log-probs mu,
the default) or recompute (the trainer's own log-probs at the step start, pi_old, as slime's recompute)."""

from __future__ import annotations

import pytest
import torch

from epic_slime.runtime.config import ConfigError
from epic_slime.runtime.model import response_log_probs
from support.runtime_helpers import tiny_config, tiny_trainer


def _pi_old(trainer, samples) -> list[list[float]]:
    """The trainer's log-probs of each response before any update, computed here one sample at a time."""
    out = []
    with torch.no_grad():
        for s in samples:
            lp, _ = response_log_probs(
                trainer.model, [s["prompt_ids"]], [s["response_ids"]], trainer.temperature, trainer.tok.pad_id
            )
            out.append(lp[0, : len(s["response_ids"])].tolist())
    return out


def _weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_recompute_trains_on_pi_old_whatever_the_rollout_log_probs_say():
    """recompute with the rollout's log-probs shifted by -0.7 trains exactly as rollout fed the trainer's own
    pi_old; rollout fed the shifted ones trains differently (the base matters, so the test can fail)."""
    ref, samples, _ = tiny_trainer(update_depth=2)
    own = [{**s, "behavior_log_probs": lp} for s, lp in zip(samples, _pi_old(ref, samples))]
    shifted = [{**s, "behavior_log_probs": [x - 0.7 for x in s["behavior_log_probs"]]} for s in samples]

    by_rollout_own, _, _ = tiny_trainer(update_depth=2)
    m_own = by_rollout_own.train_step(own)
    by_recompute, _, _ = tiny_trainer(update_depth=2, behavior_logprobs="recompute")
    m_re = by_recompute.train_step(shifted)
    by_rollout_shifted, _, _ = tiny_trainer(update_depth=2)
    by_rollout_shifted.train_step(shifted)

    w_own, w_re, w_shift = _weights(by_rollout_own), _weights(by_recompute), _weights(by_rollout_shifted)
    # pi_old is computed here one sample at a time and by the trainer padded in a batch: float32 rounding
    # differs by ~1e-7, which Adam's normalised step can lift to a few 1e-6 on a weight whose gradient is ~0
    gap_recompute = max(float((w_re[k] - w_own[k]).abs().max()) for k in w_own)
    gap_shifted = max(float((w_shift[k] - w_own[k]).abs().max()) for k in w_own)
    assert gap_recompute < 1e-5 and gap_shifted > 100 * 1e-5, (gap_recompute, gap_shifted)
    assert m_re["train/pg_loss"] == pytest.approx(m_own["train/pg_loss"], abs=1e-5)
    # the step-start gap is pi_old against the rollout's: the shift, on every token
    assert m_re["train/logprob_abs_diff_step_start"] == pytest.approx(0.7, abs=1e-4)
    assert "train/tis_weight_mean" not in m_re  # no TIS without --use-tis


def test_the_trainer_refuses_an_unknown_base():
    with pytest.raises(ValueError, match="behavior_logprobs must be rollout or recompute, got 'engine'"):
        tiny_trainer(behavior_logprobs="engine")


def test_config_reads_the_base_and_refuses_recompute_with_a_top_k_mode(tmp_path):
    assert tiny_config(tmp_path).behavior_logprobs == "rollout"
    assert tiny_config(tmp_path, "--behavior-logprobs", "recompute").to_dict()["behavior_logprobs"] == "recompute"
    with pytest.raises(ConfigError, match="behavior_logprobs=recompute with policy_loss=dppo_topk_tv"):
        tiny_config(tmp_path, "--behavior-logprobs", "recompute", "--policy-loss", "dppo_topk_tv")
    with pytest.raises((ConfigError, SystemExit)):
        tiny_config(tmp_path, "--behavior-logprobs", "engine")
