"""epic_slime.integrations.trl: a real TRL GRPOTrainer run on CPU with EPIC (TRL 1.16.0).

A tiny Qwen3 built from a config (tests/support/eval_helpers.py, no download), a word-level
tokenizer, and a rule reward: the fraction of completion words that are "1".
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl", reason="TRL is not installed (CI installs it: .ci/run, the [trl] extra)")
datasets = pytest.importorskip("datasets")

from trl import GRPOConfig  # noqa: E402

from epic_slime.integrations.trl import EpicGRPOTrainer  # noqa: E402
from epic_slime.losses import PolicyLossInputError, compute_policy_loss  # noqa: E402
from support.eval_helpers import save_tiny_checkpoint  # noqa: E402

STEPS = 8
COMPLETION_WORDS = 6


def ones_reward(completions, **_):
    """The rule reward: the fraction of the completion's words that are "1"."""
    return [sum(word == "1" for word in text.split()) / COMPLETION_WORDS for text in completions]


class RecordingTrainer(EpicGRPOTrainer):
    """Keeps what each loss call was given and returned, and what TRL passed as old log-probs."""

    def __init__(self, *args, **kwargs):
        self.calls = []
        super().__init__(*args, **kwargs)

    def _compute_loss(self, model, inputs):
        self._inputs = inputs
        return super()._compute_loss(model, inputs)

    def policy_loss(self, log_probs, behaviour_log_probs, advantages, mask):
        out = super().policy_loss(log_probs, behaviour_log_probs, advantages, mask)
        old = self._inputs.get("old_per_token_logps")
        self.calls.append(
            {
                "log_probs": log_probs.detach().clone(),
                "behaviour": behaviour_log_probs.clone(),
                "old": None if old is None else old.clone(),
                "advantages": advantages.clone(),
                "mask": mask.clone(),
                "loss": out.loss.item(),
                "clipfrac": out.metrics["clipfrac"].item(),
            }
        )
        return out


def grpo_args(tmp_path, **overrides):
    settings = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=COMPLETION_WORDS,
        steps_per_generation=2,
        gradient_accumulation_steps=1,
        max_steps=STEPS,
        learning_rate=3e-2,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
        temperature=1.0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    return GRPOConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_qwen3")
    save_tiny_checkpoint(folder)
    return folder


def prompts(n: int = 16):
    return datasets.Dataset.from_dict({"prompt": ["the 1 is 2" if i % 2 else "Answer: 3 is" for i in range(n)]})


@pytest.fixture(scope="module")
def epic_run(tiny_model_dir, tmp_path_factory):
    import transformers

    tmp_path = tmp_path_factory.mktemp("trl_run")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer = RecordingTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=ones_reward,
        args=grpo_args(tmp_path),
        train_dataset=prompts(),
        loss_mode="epic",
        loss_params={"delta_high": 2e-3, "delta_low": 5e-4},
    )
    trainer.train()
    return trainer, before


def test_the_loss_trl_logs_is_the_cores_on_the_same_batch(epic_run):
    trainer, _ = epic_run
    logged = [entry for entry in trainer.state.log_history if "policy_loss" in entry]
    assert len(trainer.calls) == len(logged) == STEPS
    for call, entry in zip(trainer.calls, logged):
        core = compute_policy_loss(
            "epic",
            call["log_probs"],
            call["behaviour"],
            call["advantages"],
            call["mask"],
            delta_high=2e-3,
            delta_low=5e-4,
        )
        assert call["loss"] == core.loss.item()
        assert entry["policy_loss"] == pytest.approx(core.loss.item(), rel=1e-12, abs=1e-15)
        # gradient accumulation is 1: the loss TRL's Trainer logs is the one returned (it rounds it)
        assert entry["loss"] == pytest.approx(core.loss.item(), abs=5e-4)
        assert entry["clip_ratio/region_mean"] == pytest.approx(core.metrics["clipfrac"].item(), abs=1e-12)


def test_the_behaviour_log_probs_are_trls_from_generation(epic_run):
    """steps_per_generation=2: TRL scores each generation batch with the model at generation time
    (old_per_token_logps); the first step of a batch is on-policy, the second one update behind."""
    trainer, _ = epic_run
    for step, call in enumerate(trainer.calls):
        assert call["old"] is not None
        assert torch.equal(call["behaviour"], call["old"])
        m = call["mask"].bool()
        gap = (call["log_probs"] - call["behaviour"])[m].abs().max().item()
        if step % 2 == 0:
            assert gap < 1e-4, (step, gap)
        else:
            assert gap > 1e-3, (step, gap)


def test_the_run_trains_with_the_reward_recorded(epic_run):
    trainer, before = epic_run
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    # TRL logs the reward of each generation batch, one every steps_per_generation = 2 steps
    assert len(rewards) == STEPS // 2 and all(0.0 <= r <= 1.0 for r in rewards)
    changed = [name for name, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert changed, "no parameter moved"
    losses = [call["loss"] for call in trainer.calls]
    assert all(math.isfinite(x) for x in losses)
    first, last = rewards[0], rewards[-1]
    print(f"TRL EpicGRPOTrainer: reward {rewards}; loss {losses}; first {first:.3f} last {last:.3f}")
    assert last > first, rewards


def test_unsupported_trl_settings_are_refused_with_the_reason(tiny_model_dir, tmp_path):
    with pytest.raises(PolicyLossInputError, match="beta=0.04: TRL's KL-to-reference term is not mapped"):
        EpicGRPOTrainer(
            model=str(tiny_model_dir),
            reward_funcs=ones_reward,
            args=grpo_args(tmp_path, beta=0.04),
            train_dataset=prompts(),
        )
    with pytest.raises(PolicyLossInputError, match="loss_mode='dppo_topk_tv' is not offered here"):
        EpicGRPOTrainer(
            model=str(tiny_model_dir),
            reward_funcs=ones_reward,
            args=grpo_args(tmp_path),
            train_dataset=prompts(),
            loss_mode="dppo_topk_tv",
        )
    with pytest.raises(PolicyLossInputError, match="delta_high=0"):
        EpicGRPOTrainer(
            model=str(tiny_model_dir),
            reward_funcs=ones_reward,
            args=grpo_args(tmp_path),
            train_dataset=prompts(),
            loss_params={"delta_high": 0},
        )


def test_vllms_importance_sampling_correction_is_refused_with_its_reason():
    """vLLM does not run here: the rule is checked on the attributes GRPOTrainer sets from its config."""
    from types import SimpleNamespace

    from epic_slime.integrations.trl import UNSUPPORTED

    def refusals(**changes):
        settings = dict(
            use_vllm=False,
            vllm_importance_sampling_correction=True,
            beta=0.0,
            top_entropy_quantile=1.0,
            _entropy_bonus_enabled=False,
            off_policy_mask_threshold=None,
            importance_sampling_level="token",
        )
        trainer = SimpleNamespace(**{**settings, **changes})
        return [reason.format(**vars(trainer)) for is_set, reason in UNSUPPORTED if is_set(trainer)]

    assert refusals() == []  # the correction is on by default but only applies with vLLM
    (reason,) = refusals(use_vllm=True)
    assert reason.startswith("vllm_importance_sampling_correction=True: the loss already uses vLLM's sampling")
    assert refusals(use_vllm=True, vllm_importance_sampling_correction=False) == []
    assert refusals(importance_sampling_level="sequence") == [
        "importance_sampling_level='sequence': each loss mode defines its own ratio; use 'token'"
    ]
