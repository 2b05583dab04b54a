"""Trainer: GRPO advantages, D minibatch updates with the core loss, KL term, versions (no Ray)."""

import copy
import math

import pytest
import torch

from support.runtime_helpers import tiny_trainer
from epic_slime.runtime.model import ModelConfig, build_policy, response_log_probs
from epic_slime.runtime.rollout import PolicyEngine
from epic_slime.runtime.task import TaskConfig, Tokenizer
from epic_slime.runtime.tasks import train_problem
from epic_slime.runtime.trainer import PolicyTrainer, group_advantages

TOK = Tokenizer()


def test_group_advantages_reference():
    r = [1.0, 0.0, 0.0, 1.0, 1.0]
    mean = 0.6
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / 5)
    assert group_advantages(r) == pytest.approx([(x - mean) / (std + 1e-6) for x in r])
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    assert group_advantages([]) == []


def test_train_step_updates_weights_and_version_and_reports_metrics():
    trainer, samples, state = tiny_trainer(kl_loss_coef=1e-3)
    m = trainer.train_step(samples)
    assert trainer.version == 1 and m["train/version"] == 1
    assert m["train/logprob_abs_diff_step_start"] < 1e-5  # same weights sampled and train
    assert 0.0 <= m["train/policy/clipfrac"] <= 1.0 and "train/kl_loss" in m
    new = trainer.get_weights()
    assert any(not torch.equal(new[k], state[k]) for k in state)
    # the update moved log-probs of positive-advantage samples up relative to negative ones
    pos = [s for s in samples if s["advantage"] > 0]
    neg = [s for s in samples if s["advantage"] < 0]

    def mean_seq_lp(weights, batch):
        model = build_policy(ModelConfig(), TOK.vocab_size, TOK.pad_id, TOK.bos_id, TOK.eos_id, 0)
        model.load_state_dict(weights)
        with torch.no_grad():
            lp, mask = response_log_probs(
                model.eval(), [s["prompt_ids"] for s in batch], [s["response_ids"] for s in batch], 1.0, TOK.pad_id
            )
        return float(((lp * mask).sum(1) / mask.sum(1)).mean())

    d_pos = mean_seq_lp(new, pos) - mean_seq_lp(state, pos)
    d_neg = mean_seq_lp(new, neg) - mean_seq_lp(state, neg)
    assert d_pos > d_neg


def test_batch_must_split_into_update_depth():
    trainer, samples, _ = tiny_trainer(update_depth=3)
    with pytest.raises(ValueError, match="update_depth=3"):
        trainer.train_step(samples[:16])


def test_state_round_trip_gives_identical_next_step():
    t1, samples, _ = tiny_trainer()
    t1.train_step(samples)
    saved = t1.state()
    m1 = t1.train_step(samples)
    t2, _, _ = tiny_trainer(seed=5)  # a different minibatch RNG until the state is loaded
    t2.load_state(saved)
    m2 = t2.train_step(samples)
    assert m2["train/pg_loss"] == m1["train/pg_loss"] and m2["train/grad_norm"] == m1["train/grad_norm"]
    assert all(torch.equal(a, b) for a, b in zip(t1.get_weights().values(), t2.get_weights().values()))


def test_topk_mode_gets_the_behaviour_top_k_set_and_trains():
    torch.set_num_threads(1)
    state = {
        k: v.clone()
        for k, v in build_policy(ModelConfig(), TOK.vocab_size, TOK.pad_id, TOK.bos_id, TOK.eos_id, seed=0)
        .state_dict()
        .items()
    }
    engine = PolicyEngine(ModelConfig(), state, 0)
    reqs = [(i, train_problem(i, 0, TaskConfig())) for i in range(4)]
    groups = engine.generate(reqs, n_samples=4, temperature=0.8, top_p=1.0, max_new_tokens=12, seed=0, topk=3)
    samples = [
        {**s, "advantage": a}
        for g in groups
        for s, a in zip(g.samples, group_advantages([float(j % 2) for j in range(len(g))]))
    ]
    # reference: the 3 largest entries of the trainer's log_softmax(logits / T) at each response position
    with torch.no_grad():
        _, mask, all_lp = response_log_probs(
            engine.model,
            [s["prompt_ids"] for s in samples],
            [s["response_ids"] for s in samples],
            0.8,
            TOK.pad_id,
            return_all=True,
        )
    for i, s in enumerate(samples):
        n = len(s["response_ids"])
        assert len(s["topk_ids"]) == n and all(len(row) == 3 for row in s["topk_ids"])
        ref = torch.topk(all_lp[i, :n], 3, dim=-1)
        assert torch.allclose(torch.tensor(s["topk_log_probs"]), ref.values, atol=2e-5)
        assert all(set(a) == set(b) for a, b in zip(s["topk_ids"], ref.indices.tolist()))
    trainer = PolicyTrainer(
        model_cfg=ModelConfig(),
        init_state=state,
        policy_loss="dppo_topk_tv",
        policy_loss_params={},
        policy_loss_aggregation=None,
        update_depth=2,
        lr=1e-3,
        weight_decay=0.0,
        clip_grad=1.0,
        kl_loss_coef=0.0,
        temperature=0.8,
        seed=0,
    )
    m = trainer.train_step(samples)
    assert math.isfinite(m["train/pg_loss"]) and trainer.version == 1
    with pytest.raises(ValueError, match="topk_ids"):
        trainer.train_step([{k: v for k, v in s.items() if k not in ("topk_ids",)} for s in samples])


def test_bad_tokens_are_skipped_and_counted_with_the_kl_term_finite():
    trainer, samples, _ = tiny_trainer(kl_loss_coef=1e-3, on_bad_tokens="skip", max_bad_token_frac=0.05)
    samples[3] = {**samples[3], "behavior_log_probs": [float("nan")] + list(samples[3]["behavior_log_probs"][1:])}
    samples[7] = {**samples[7], "behavior_log_probs": [0.5] + list(samples[7]["behavior_log_probs"][1:])}
    m = trainer.train_step(samples)
    assert m["train/policy/bad_tokens"] == 2 and m["train/policy/skipped_steps"] == 0
    valid = sum(len(s["response_ids"]) for s in samples)  # every response token is on the mask here
    assert m["train/policy/bad_token_frac"] == pytest.approx(2 / valid)
    assert all(math.isfinite(v) for k, v in m.items() if isinstance(v, float)), m
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    raising, samples, _ = tiny_trainer(on_bad_tokens="raise")
    samples[3] = {**samples[3], "behavior_log_probs": [float("nan")] + list(samples[3]["behavior_log_probs"][1:])}
    from epic_slime.losses import PolicyLossInputError

    with pytest.raises(PolicyLossInputError, match="behavior_log_probs has a non-finite value"):
        raising.train_step(samples)


def test_non_finite_gradient_skips_the_optimizer_step_and_counts_it(monkeypatch):
    real_clip = torch.nn.utils.clip_grad_norm_
    calls = []

    def first_norm_is_nan(params, max_norm):  # what a NaN/inf gradient makes clip_grad_norm_ return
        calls.append(1)
        norm = real_clip(params, max_norm)
        return torch.tensor(float("nan")) if len(calls) == 1 else norm

    trainer, samples, state = tiny_trainer(on_bad_tokens="skip")
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", first_norm_is_nan)
    m = trainer.train_step(samples)
    assert m["train/policy/skipped_steps"] == 1 and trainer.version == 1
    assert trainer.opt.state_dict()["state"][0]["step"] == 1  # 2 minibatches, one update
    calls.clear()
    raising, samples, _ = tiny_trainer(on_bad_tokens="raise")
    with pytest.raises(FloatingPointError, match="gradient norm is nan"):
        raising.train_step(samples)


def _k3_kl(model, ref, samples) -> float:
    """Independent reference: mean over rows of the token-mean k3 estimator of KL(pi || ref)."""
    with torch.no_grad():
        prompts, responses = [s["prompt_ids"] for s in samples], [s["response_ids"] for s in samples]
        lp, mask = response_log_probs(model, prompts, responses, 1.0, TOK.pad_id)
        ref_lp, _ = response_log_probs(ref, prompts, responses, 1.0, TOK.pad_id)
    total = 0.0
    for i in range(len(samples)):
        d = (ref_lp[i] - lp[i])[mask[i]].double()  # log ref - log pi on the valid tokens
        total += float((d.exp() - 1 - d).mean())
    return total / len(samples)


def test_kl_term_pulls_the_policy_back_to_the_reference():
    """With zero advantages only the KL term has a gradient: training must shrink KL(pi || ref)."""
    trainer, samples, _ = tiny_trainer(kl_loss_coef=1.0, lr=3e-3, update_depth=1)
    samples = [{**s, "advantage": 0.0} for s in samples]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # move the policy away from the frozen reference (its initial weights)
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    before = _k3_kl(trainer.model, trainer.ref, samples)
    assert before > 1e-3
    kls = []
    for _ in range(3):
        m = trainer.train_step(samples)
        kls.append(m["train/kl_loss"])
    after = _k3_kl(trainer.model, trainer.ref, samples)
    assert kls[0] == pytest.approx(before, rel=1e-3)  # the logged term is the KL measured here
    assert after < 0.8 * before, (before, after)


def test_evaluate_scores_each_prompt_with_its_own_samples(monkeypatch):
    """correct[i][j] is sample j of prompt i (sample() returns rows in prompt-major order)."""
    import epic_slime.runtime.rollout as rollout
    from epic_slime.runtime.task import Problem

    torch.set_num_threads(1)
    state = build_policy(ModelConfig(), TOK.vocab_size, TOK.pad_id, TOK.bos_id, TOK.eos_id, seed=0).state_dict()
    engine = PolicyEngine(ModelConfig(), state, 0)
    problems = [Problem(prompt=f"{a}+1=", solution="", answer=a + 1) for a in (2, 5, 7)]
    k = 2
    answer_of = {tuple(engine._prompt_ids(p)): p.answer for p in problems}

    def fake_sample(model, prompts, **kw):
        # sample 0 of every prompt right, sample 1 wrong: only prompt-major indexing gives [[T, F], ...]
        assert len(prompts) == len(problems) * k
        out = []
        for row, ids in enumerate(prompts):
            answer = answer_of[tuple(ids)] + (row % k)
            out.append({"response_ids": TOK.encode(f"Answer:{answer}") + [TOK.eos_id]})
        return out

    monkeypatch.setattr(rollout, "sample", fake_sample)
    correct = engine.evaluate(problems, k=k, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0)
    assert correct == [[True, False]] * len(problems)


# ---- from issue 46's fresh mutation pass: the TIS truncation fraction against a count made by hand, and
# the lr warmup after load_state (each test names its mutants)
# mutants: tis_truncated_frac_strict, tis_truncated_frac_counts_padding, runtime_tis_diagnostics_default_clip
def test_the_runtime_tis_truncated_fraction_is_the_hand_counted_share_of_valid_tokens():
    """Every 3rd valid token gets mu = pi_old - log 3 (weight 3, truncated to C = 1.5); every other valid
    token mu = pi_old (weight 1). The fraction is then a count over the valid tokens (responses have
    different lengths: padding must not count) and the mean weight follows from the same count."""
    trainer, samples, _ = tiny_trainer(update_depth=1, use_tis=True, tis_clip=1.5, lr=0.0)
    old = trainer._old_log_probs(samples)
    truncated = valid = 0
    shifted = []
    for s in samples:
        lp = list(old[id(s)])
        mu = []
        for j, x in enumerate(lp):
            if j % 3 == 0:
                mu.append(x - math.log(3.0))
                truncated += 1
            else:
                mu.append(x)
            valid += 1
        shifted.append({**s, "behavior_log_probs": mu})
    lengths = {len(s["response_ids"]) for s in samples}
    assert len(lengths) > 1, "the hand count needs padding: responses of different lengths"
    metrics = trainer.train_step(shifted)
    frac = truncated / valid
    assert metrics["train/tis_truncated_frac"] == pytest.approx(frac, abs=1e-6)
    assert metrics["train/tis_weight_mean"] == pytest.approx(1.5 * frac + 1.0 * (1 - frac), rel=1e-5)


# mutants: warmup_restarts_after_load_state, adam_steps_not_saved (fresh pass: warmup_not_restored_on_resume)
def test_a_loaded_trainer_continues_the_lr_warmup_where_the_saved_one_stood():
    """Warmup over 8 Adam steps, 2 per train step: after one step the saved trainer stands at Adam step 2.
    The one loaded from its state trains step 2 at lr (3/8, 4/8), as the uninterrupted one does, and
    ends with the same weights (a warmup restarted at 0 would train at 1/8, 2/8)."""
    lr, warmup = 1e-3, 8
    a, samples, _ = tiny_trainer(lr=lr, lr_warmup_steps=warmup, update_depth=2)
    a.train_step(samples)
    saved = copy.deepcopy(a.state())
    b, _, _ = tiny_trainer(lr=lr, lr_warmup_steps=warmup, update_depth=2)
    b.load_state(saved)
    assert b.adam_steps == 2
    m_b = b.train_step(samples)
    m_a = a.train_step(samples)
    assert m_b["train/lr"] == pytest.approx(lr * (3 / 8 + 4 / 8) / 2, rel=1e-12)
    assert m_a["train/lr"] == pytest.approx(m_b["train/lr"], rel=1e-12)
    assert b.opt.param_groups[0]["lr"] == pytest.approx(lr * 4 / 8, rel=1e-12)
    for (name, wa), wb in zip(a.get_weights().items(), b.get_weights().values()):
        assert torch.equal(wa, wb), name
