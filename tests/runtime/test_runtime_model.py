"""Tiny Qwen3-MoE, KV-cache sampler and behaviour log-probs (no Ray)."""

import math

import pytest
import torch

from epic_slime.runtime.model import ModelConfig, _top_p_filter, build_policy, response_log_probs, sample
from epic_slime.runtime.rollout import PolicyEngine
from epic_slime.runtime.task import TaskConfig, Tokenizer
from epic_slime.runtime.tasks import train_problem

TOK = Tokenizer()


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    return build_policy(ModelConfig(), TOK.vocab_size, TOK.pad_id, TOK.bos_id, TOK.eos_id, seed=0).eval()


def _prompts(n):
    # mixed operand counts -> mixed prompt lengths -> left padding in the sampler
    cfg = TaskConfig(min_operands=2, max_operands=4, max_operand=20)
    return [[TOK.bos_id] + TOK.encode(train_problem(i, 0, cfg).prompt) for i in range(n)]


def _reference_log_probs(model, prompt, response, temperature):
    """One unpadded sequence at a time, log_softmax(logits / T) read off position by position."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    out = []
    for j, tok in enumerate(response):
        row = logits[len(prompt) - 1 + j] / temperature
        out.append(float(row[tok] - torch.logsumexp(row, 0)))
    return out


def test_model_is_a_small_qwen3_moe(policy):
    cfg = policy.config
    assert type(policy).__name__ == "Qwen3MoeForCausalLM"
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.num_hidden_layers, cfg.vocab_size) == (
        4,
        2,
        2,
        TOK.vocab_size,
    )
    assert sum(p.numel() for p in policy.parameters()) < 300_000


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.8)])
def test_behaviour_log_probs_equal_trainer_log_probs(policy, temperature, top_p):
    prompts = _prompts(12)
    assert len({len(p) for p in prompts}) > 1
    res = sample(
        policy,
        prompts,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=16,
        eos_id=TOK.eos_id,
        pad_id=TOK.pad_id,
        generator=torch.Generator().manual_seed(1),
    )
    responses = [r["response_ids"] for r in res]
    with torch.no_grad():
        lp, mask = response_log_probs(policy, prompts, responses, temperature, TOK.pad_id)
    for i, r in enumerate(res):
        n = len(r["response_ids"])
        assert n >= 1 and mask[i].sum() == n
        ref = _reference_log_probs(policy, prompts[i], r["response_ids"], temperature)
        assert r["behavior_log_probs"] == pytest.approx(ref, abs=2e-5)
        assert lp[i, :n].tolist() == pytest.approx(ref, abs=2e-5)
        assert (r["status"] == "completed") == (r["response_ids"][-1] == TOK.eos_id)
        assert TOK.eos_id not in r["response_ids"][:-1]
        # the exact sampling distribution differs from the behaviour one only by the top-p renormalisation
        gaps = [b - s for b, s in zip(r["behavior_log_probs"], r["sampling_log_probs"])]
        assert all(g <= 1e-6 for g in gaps)
        if top_p == 1.0:
            assert max(abs(g) for g in gaps) < 1e-6


def test_top_p_filter_matches_definition():
    torch.manual_seed(0)
    logits = torch.randn(5, 11)
    lp = torch.log_softmax(logits, -1)
    for p in (0.3, 0.75, 0.95):
        got = _top_p_filter(lp, p)
        for row, grow in zip(lp, got):
            probs = row.exp().tolist()
            order = sorted(range(len(probs)), key=lambda i: -probs[i])
            keep, mass = [], 0.0
            for i in order:  # smallest prefix of the sorted tokens whose mass reaches p
                keep.append(i)
                mass += probs[i]
                if mass >= p:
                    break
            for i in range(len(probs)):
                if i in keep:
                    assert math.isclose(float(grow[i]), math.log(probs[i] / mass), abs_tol=1e-5)
                else:
                    assert grow[i] == float("-inf")


def test_sampler_draws_from_the_top_p_distribution(policy):
    """Empirical first-token frequencies match exp(sampling_log_prob) (chi-square-style bound)."""
    prompt = _prompts(1)[0]
    n = 3000
    res = sample(
        policy,
        [prompt] * n,
        temperature=1.0,
        top_p=0.9,
        max_new_tokens=1,
        eos_id=TOK.eos_id,
        pad_id=TOK.pad_id,
        generator=torch.Generator().manual_seed(2),
    )
    with torch.no_grad():
        logits = policy(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    expected = _top_p_filter(torch.log_softmax(logits, -1), 0.9).exp()
    counts = torch.zeros_like(expected)
    for r in res:
        counts[r["response_ids"][0]] += 1
    assert torch.all(counts[expected == 0] == 0)
    freq = counts / n
    assert torch.all((freq - expected).abs() <= 4 * torch.sqrt(expected * (1 - expected) / n) + 1e-3)


def test_bfloat16_worker_reproduces_a_train_inference_mismatch():
    torch.set_num_threads(1)
    base = build_policy(ModelConfig(), TOK.vocab_size, TOK.pad_id, TOK.bos_id, TOK.eos_id, seed=0)
    state = {k: v.clone() for k, v in base.state_dict().items()}
    reqs = [(i, train_problem(i, 0, TaskConfig())) for i in range(4)]
    kw = dict(n_samples=4, temperature=1.0, top_p=1.0, max_new_tokens=12, seed=0)
    groups = PolicyEngine(ModelConfig(), state, 0, dtype="bfloat16").generate(reqs, **kw)
    samples = [s for g in groups for s in g.samples]
    with torch.no_grad():
        lp, mask = response_log_probs(
            base.eval(), [s["prompt_ids"] for s in samples], [s["response_ids"] for s in samples], 1.0, TOK.pad_id
        )
    gap = sum(abs(a - b) for i, s in enumerate(samples) for a, b in zip(s["behavior_log_probs"], lp[i].tolist()))
    gap /= int(mask.sum())
    assert 1e-4 < gap < 0.5
    assert all(s["version"] == 0 and g.version == 0 for g in groups for s in g.samples)
