"""The mechanism study's runtime parts: the paper's optimizer settings (lr warmup, low_var_kl, AdamW
beta2 / weight decay), TIS against the rollout log-probs, rollout-only router noise and the fib task."""

from __future__ import annotations

import math
import random

import pytest
import torch

from epic_slime.losses.kl import kl_penalty
from epic_slime.runtime.config import ConfigError
from epic_slime.runtime.model import ModelConfig, build_policy, response_log_probs
from epic_slime.runtime.rollout import PolicyEngine
from epic_slime.runtime.task import TaskConfig, Tokenizer
from epic_slime.runtime.task_fib import make_fib_problem, slipped_solution, split_of
from epic_slime.runtime.tasks import split_problems, train_problem, validate_task_config
from epic_slime.losses.tis import tis_weights
from epic_slime.runtime.trainer import warmup_factor
from support.runtime_helpers import tiny_config, tiny_trainer

TOK = Tokenizer()


# ---- lr warmup ----
def test_warmup_factor_at_its_boundaries():
    assert warmup_factor(0, 10) == pytest.approx(0.1)
    assert warmup_factor(8, 10) == pytest.approx(0.9)
    assert warmup_factor(9, 10) == 1.0 and warmup_factor(10, 10) == 1.0 and warmup_factor(500, 10) == 1.0
    assert warmup_factor(0, 0) == 1.0 and warmup_factor(0, 1) == 1.0


def test_trainer_applies_the_warmup_per_adam_step_and_keeps_counting_across_steps():
    trainer, samples, _ = tiny_trainer(lr=1e-3, lr_warmup_steps=3, update_depth=2)
    m1 = trainer.train_step(samples)  # Adam steps 0, 1: lr 1/3, 2/3 of 1e-3
    assert m1["train/lr"] == pytest.approx(1e-3 * (1 / 3 + 2 / 3) / 2)
    m2 = trainer.train_step(samples)  # Adam steps 2, 3: full lr
    assert m2["train/lr"] == pytest.approx(1e-3) and trainer.adam_steps == 4
    assert trainer.state()["adam_steps"] == 4


def test_adamw_gets_table2_beta2_and_weight_decay():
    trainer, _, _ = tiny_trainer(adam_beta2=0.98, weight_decay=0.1)
    group = trainer.opt.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["weight_decay"] == 0.1


# ---- low_var_kl ----
def _k3_float64(log_pi: float, log_ref: float) -> float:
    x = log_ref - log_pi
    return math.exp(x) - x - 1.0


def test_low_var_kl_matches_float64_k3_and_clamps_at_10():
    # e^x - x - 1 = 10 at x = 2.6093...: just below stays, just above clamps
    log_pi = torch.tensor([0.0, -0.3, -2.0, -2.60, -2.62, -5.0, -1e-4])
    log_ref = torch.zeros_like(log_pi)
    ours = kl_penalty(log_pi, log_ref, "low_var_kl")
    for got, lp in zip(ours.tolist(), log_pi.tolist()):
        want = min(_k3_float64(lp, 0.0), 10.0)
        assert got == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert ours[3] < 10 and ours[4] == 10.0 and ours[5] == 10.0
    assert kl_penalty(log_pi, log_ref, "k3")[5] == pytest.approx(_k3_float64(-5.0, 0.0), rel=1e-5)


def test_trainer_kl_term_uses_the_configured_estimator():
    losses = {}
    for kind in ("k3", "low_var_kl"):
        trainer, samples, _ = tiny_trainer(kl_loss_coef=1.0, kl_loss_type=kind, update_depth=1, lr=1e-9)
        with torch.no_grad():  # a reference far from the policy: k3 exceeds 10 on some tokens
            for p in trainer.ref.parameters():
                p.mul_(-6.0)
        losses[kind] = trainer.train_step(samples)["train/kl_loss"]
    # the same tokens: the clamp lowers the mean only if some token's k3 exceeds 10
    assert losses["low_var_kl"] <= 10.0 and losses["low_var_kl"] < losses["k3"] - 0.1


# ---- TIS ----
def test_tis_weights_match_float64_and_truncate_at_the_clip():
    old = torch.tensor([[-1.0, -0.5, -2.0, 0.0]])
    mu = torch.tensor([[-1.2, -0.5, -0.1, 0.0]])
    mask = torch.tensor([[True, True, True, False]])
    w = tis_weights(old, mu, mask, clip=2.0)
    want = [min(math.exp(-1.0 + 1.2), 2.0), 1.0, min(math.exp(-2.0 + 0.1), 2.0), 0.0]
    assert w[0].tolist() == pytest.approx(want, rel=1e-6)
    w_clip = tis_weights(torch.tensor([[math.log(2.0) + 1e-3]]), torch.tensor([[0.0]]), torch.tensor([[True]]), 2.0)
    assert w_clip.item() == 2.0


def test_tis_without_mismatch_trains_like_no_tis_and_with_noise_reweights():
    t_plain, samples, _ = tiny_trainer(update_depth=1)
    t_tis, _, _ = tiny_trainer(update_depth=1, use_tis=True)
    m_plain, m_tis = t_plain.train_step(samples), t_tis.train_step(samples)
    assert m_tis["train/pg_loss"] == pytest.approx(m_plain["train/pg_loss"], abs=1e-5)
    assert m_tis["train/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    # rollout log-probs shifted by -0.3 on every token: weights exp(0.3) = 1.35, the gap 0.3
    t_shift, _, _ = tiny_trainer(update_depth=1, use_tis=True)
    shifted = [{**s, "behavior_log_probs": [x - 0.3 for x in s["behavior_log_probs"]]} for s in samples]
    m = t_shift.train_step(shifted)
    assert m["train/tis_weight_mean"] == pytest.approx(math.exp(0.3), rel=1e-3)
    assert m["train/logprob_abs_diff_step_start"] == pytest.approx(0.3, abs=1e-3)


def test_config_refuses_tis_with_a_top_k_mode_and_bad_beta2(tmp_path):
    with pytest.raises(ConfigError, match="use_tis"):
        tiny_config(tmp_path, "--use-tis", "--policy-loss", "dppo_topk_tv")
    with pytest.raises(ConfigError, match="adam_beta2"):
        tiny_config(tmp_path, "--adam-beta2", "1.0")
    with pytest.raises(ConfigError, match="rollout_router_noise"):
        tiny_config(tmp_path, "--rollout-router-noise=-0.1")
    cfg = tiny_config(tmp_path, "--lr-warmup-steps", "10", "--kl-loss-type", "low_var_kl", "--adam-beta2", "0.98")
    d = cfg.to_dict()  # what config.json records
    assert (d["lr_warmup_steps"], d["kl_loss_type"], d["adam_beta2"], d["use_tis"]) == (10, "low_var_kl", 0.98, False)


# ---- router noise ----
def _engine_and_requests(noise: float):
    torch.manual_seed(0)
    state = {
        k: v.clone()
        for k, v in build_policy(ModelConfig(), TOK.vocab_size, TOK.pad_id, TOK.bos_id, TOK.eos_id, seed=0)
        .state_dict()
        .items()
    }
    for k in state:  # routers start at zero weights: give them logits with near-ties to break
        if k.endswith("gate.weight"):
            state[k] = torch.randn_like(state[k])
    reqs = [(i, train_problem(i, 0, TaskConfig())) for i in range(4)]
    return PolicyEngine(ModelConfig(), state, 0, router_noise=noise), reqs, state


def _gap(engine, groups, state) -> float:
    trainer_model = build_policy(ModelConfig(), TOK.vocab_size, TOK.pad_id, TOK.bos_id, TOK.eos_id, seed=0)
    trainer_model.load_state_dict(state)
    samples = [s for g in groups for s in g.samples]
    with torch.no_grad():
        lp, mask = response_log_probs(
            trainer_model, [s["prompt_ids"] for s in samples], [s["response_ids"] for s in samples], 1.0, TOK.pad_id
        )
    mu = torch.zeros_like(lp)
    for i, s in enumerate(samples):
        mu[i, : len(s["behavior_log_probs"])] = torch.tensor(s["behavior_log_probs"])
    return float(((lp - mu).abs() * mask).sum() / mask.sum())


def test_router_noise_is_rollout_only_zero_is_exact_and_sigma_opens_a_gap():
    kw = dict(n_samples=4, temperature=1.0, top_p=1.0, max_new_tokens=12, seed=3)
    base, reqs, state = _engine_and_requests(0.0)
    zero, _, _ = _engine_and_requests(0.0)
    from epic_slime.runtime.mismatch import install_router_noise

    assert install_router_noise(zero.model, 0.0, torch.Generator()) == ModelConfig().num_layers
    g0, gz = base.generate(reqs, **kw), zero.generate(reqs, **kw)
    assert [s["behavior_log_probs"] for g in g0 for s in g.samples] == [
        s["behavior_log_probs"] for g in gz for s in g.samples
    ]
    noisy, _, _ = _engine_and_requests(1.0)
    gn, gn2 = noisy.generate(reqs, **kw), noisy.generate(reqs, **kw)
    assert [s["response_ids"] for g in gn for s in g.samples] == [s["response_ids"] for g in gn2 for s in g.samples]
    assert _gap(base, g0, state) < 1e-5 < 1e-3 < _gap(noisy, gn, state)
    with pytest.raises(ValueError, match="rollout_router_noise"):
        install_router_noise(noisy.model, float("nan"), torch.Generator())


# ---- the fib task ----
def _fib_answer(a: int, op: str, b: int, steps: int) -> int:
    """Independent: '+' is x_{N+1} = F_N a + F_{N+1} b (mod 10) with F_0 = 0, F_1 = 1."""
    if op == "+":
        f = [0, 1]
        while len(f) < steps + 2:
            f.append(f[-1] + f[-2])
        return (f[steps] * a + f[steps + 1] * b) % 10
    seq = [a, b]
    for _ in range(steps):
        seq.append((seq[-2] - seq[-1]) % 10)
    return seq[-1]


@pytest.mark.parametrize("steps,tokens", [(8, 51), (100, 603), (300, 1803)])
def test_fib_problems_are_exact_and_6n_plus_3_tokens(steps, tokens):
    for a, op, b in [(3, "+", 7), (0, "-", 9), (9, "+", 9), (5, "-", 5)]:
        p = make_fib_problem(a, op, b, steps)
        assert p.answer == _fib_answer(a, op, b, steps)
        assert len(TOK.encode(p.solution)) + 1 == tokens  # + <eos>


def test_fib_splits_are_disjoint_and_the_config_rules_hold():
    cfg = TaskConfig(min_operands=8, max_operands=8, name="fib", eval_num_prompts=30)
    val, test = split_problems("validation", cfg), split_problems("test", cfg)
    assert not {p.prompt for p in val} & {p.prompt for p in test}
    assert all(split_of(p.prompt) == "train" for p in (train_problem(i, 1, cfg) for i in range(200)))
    with pytest.raises(ValueError, match="task_min_operands"):
        validate_task_config(TaskConfig(min_operands=7, max_operands=8, name="fib"))
    with pytest.raises(ValueError, match="task_ops"):
        validate_task_config(TaskConfig(min_operands=8, max_operands=8, name="fib", ops="+*"))
    with pytest.raises(ValueError, match="only"):
        split_problems("test", TaskConfig(min_operands=8, max_operands=8, name="fib", eval_num_prompts=100))


def test_fib_warm_start_slips_carry_on_with_exact_copies():
    p = make_fib_problem(3, "+", 7, 40)
    assert slipped_solution(p, random.Random(0), 0.0) == p.solution
    slipped = slipped_solution(p, random.Random(1), 0.3)
    assert slipped != p.solution
    steps = slipped.split(";")[:-1]
    for prev, cur in zip(steps, steps[1:]):  # each step copies b and c of the step before
        assert cur[0] == prev[2] and cur[2] == prev[4]


def test_router_noise_has_the_configured_standard_deviation():
    """The rollout's router logits get sigma * N(0, 1) from the run's generator: against the same draws made
    independently, at two sigmas (a noise not scaled by sigma would be N(0, 1) at any setting)."""
    import types

    from epic_slime.runtime.mismatch import _noisy_router_forward

    torch.manual_seed(0)
    hidden, experts = 8, 4
    weight = torch.randn(experts, hidden)
    h = torch.randn(5, hidden)
    clean = h @ weight.T
    for sigma in (0.05, 0.5):
        router = types.SimpleNamespace(
            hidden_dim=hidden,
            weight=weight,
            top_k=2,
            norm_topk_prob=True,
            router_noise_sigma=sigma,
            router_noise_generator=torch.Generator().manual_seed(7),
        )
        logits, _, _ = _noisy_router_forward(router, h)
        draws = torch.randn(clean.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float32)
        torch.testing.assert_close(logits, clean + sigma * draws, rtol=0, atol=1e-6)
