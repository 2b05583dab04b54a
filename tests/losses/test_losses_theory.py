"""The identities EPIC rests on, checked exactly on a tiny enumerable autoregressive policy.

Vocabulary {0, 1, 2} with 0 = end of sequence, horizon 4: every terminal sequence is enumerated,
padded after the end with NaN under a False mask, and fed through the core's prefix statistics.
  E_mu[ sum_t exp(L_t) A^mu(s_t, a_t) ] = J(pi) - J(mu)        (performance difference)
  E_mu[ phi(exp(L_t)) ] = KL(mu(o_1:t) || pi(o_1:t))            (exact prefix KL)
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from epic_slime.losses import kl_phi
from epic_slime.losses.inputs import prepare_batch

VOCAB, HORIZON, EOS = 3, 4, 0


def _random_policy(seed: int, temperature: float):
    g = torch.Generator().manual_seed(seed)
    table = {}
    for length in range(HORIZON):
        for prefix in itertools.product(range(VOCAB), repeat=length):
            if EOS in prefix:
                continue
            logits = torch.randn(VOCAB, generator=g, dtype=torch.float64) * temperature
            table[prefix] = torch.log_softmax(logits, -1).tolist()
    return table


def _terminal_sequences():
    out = []
    for length in range(1, HORIZON + 1):
        for seq in itertools.product(range(VOCAB), repeat=length):
            if EOS in seq[:-1]:
                continue
            if length < HORIZON and seq[-1] != EOS:
                continue
            out.append(seq)
    return out


def _log_prob(policy, seq):
    return [policy[seq[:t]][seq[t]] for t in range(len(seq))]


def _setup(seed):
    mu = _random_policy(seed, 1.0)
    pi = _random_policy(seed + 100, 1.0)
    seqs = _terminal_sequences()
    g = torch.Generator().manual_seed(seed + 7)
    reward = {seq: float(torch.rand((), generator=g, dtype=torch.float64)) for seq in seqs}
    return mu, pi, seqs, reward


def _prefix_stats(mu, pi, seqs):
    B = len(seqs)
    lp = torch.full((B, HORIZON), math.nan, dtype=torch.float64)
    blp = torch.full((B, HORIZON), math.nan, dtype=torch.float64)
    mask = torch.zeros(B, HORIZON, dtype=torch.bool)
    for i, seq in enumerate(seqs):
        n = len(seq)
        lp[i, :n] = torch.tensor(_log_prob(pi, seq), dtype=torch.float64)
        blp[i, :n] = torch.tensor(_log_prob(mu, seq), dtype=torch.float64)
        mask[i, :n] = True
    batch = prepare_batch(lp, blp, torch.zeros(B, dtype=torch.float64), mask)
    weights = torch.exp(batch.log_behavior_prefix[:, -1])  # mu(seq)
    return batch, weights, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prefix_ratio_performance_difference_identity(seed):
    mu, pi, seqs, reward = _setup(seed)
    seq_prob = lambda policy, s: math.exp(sum(_log_prob(policy, s)))  # noqa: E731
    j_pi = sum(seq_prob(pi, s) * reward[s] for s in seqs)
    j_mu = sum(seq_prob(mu, s) * reward[s] for s in seqs)

    # Q^mu(prefix ending in a_t) = E_mu[R | prefix]; V^mu(s_t) = sum_a mu(a|s_t) Q^mu(s_t, a).
    def q_value(prefix):
        if prefix[-1] == EOS or len(prefix) == HORIZON:
            return reward[prefix]
        return sum(math.exp(mu[prefix][a]) * q_value(prefix + (a,)) for a in range(VOCAB))

    def advantage(prefix):
        state = prefix[:-1]
        v = sum(math.exp(mu[state][a]) * q_value(state + (a,)) for a in range(VOCAB))
        return q_value(prefix) - v

    batch, weights, mask = _prefix_stats(mu, pi, seqs)
    adv = torch.zeros_like(batch.log_prefix_ratio)
    for i, seq in enumerate(seqs):
        for t in range(len(seq)):
            adv[i, t] = advantage(seq[: t + 1])
    per_seq = (torch.exp(batch.log_prefix_ratio) * adv * mask).sum(-1)
    lhs = float((weights * per_seq).sum())
    assert float(weights.sum()) == pytest.approx(1.0, abs=1e-13)
    assert lhs == pytest.approx(j_pi - j_mu, abs=1e-12)
    assert abs(j_pi - j_mu) > 1e-3  # the identity is not trivially 0 = 0


@pytest.mark.parametrize("seed", [0, 3])
def test_phi_of_prefix_ratio_is_the_prefix_kl(seed):
    mu, pi, seqs, _ = _setup(seed)
    batch, weights, mask = _prefix_stats(mu, pi, seqs)
    for t in range(1, HORIZON + 1):
        # Sequences that ended before t keep their last prefix (the ended prefix is the event).
        col = (mask.sum(-1).clamp(max=t) - 1).long()
        log_ratio = batch.log_prefix_ratio.gather(1, col[:, None]).squeeze(1)
        lhs = float((weights * kl_phi(torch.exp(log_ratio))).sum())
        # KL between the laws of o_1:min(t, end): enumerate those truncated prefixes directly.
        kl = 0.0
        seen = {}
        for seq in seqs:
            p = seq[:t]
            seen[p] = seen.get(p, 0) + 1
        for p in seen:
            log_mu = sum(_log_prob(mu, p))
            log_pi = sum(_log_prob(pi, p))
            kl += math.exp(log_mu) * (log_mu - log_pi)
        assert lhs == pytest.approx(kl, abs=1e-12), t
        assert kl > 1e-3
