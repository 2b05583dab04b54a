"""``--use-tis`` through slime's own ``loss_function`` (slime 624b824a's source, CP = TP = DP = 1; a
stand-in only for Megatron's ``mpu`` rank queries, which need no process group at size 1).

- ``--loss-type custom_loss`` with ``args.use_tis`` set: slime's log-probs from the logits, the
  project's loss, TIS applied once, against the float64 formula (log pi from the same logits in
  float64, the per-token terms of tests/support/loss_reference.py, the chain rule to the logits).
- slime's built-in PPO loss with its own vanilla TIS against the project's ``grpo`` with ``--use-tis``:
  the same loss and gradient (the same formula, both truncations), so the custom path neither drops
  nor doubles the correction.
"""

from __future__ import annotations

import math

import pytest
import torch

from support.preconditions import slime_or_skip

with slime_or_skip("needs slime's source (set SLIME_PATH) and megatron-core==0.16.1"):
    from megatron.core import mpu
    from slime.backends.megatron_utils.loss import loss_function

from epic_slime.losses import LOSS_MODES  # noqa: E402
from epic_slime.losses.flags import policy_loss_config_from_args  # noqa: E402
from support.loss_reference import token_terms  # noqa: E402
from support.slime_loss import loss_args  # noqa: E402

SHAPES = [(9, 5), (20, 17), (7, 1), (33, 30)]
VOCAB = 11
TEMPERATURE = 0.8
CLIP, CLIP_LOW = 2.0, 0.5


@pytest.fixture
def single_rank_mpu(monkeypatch):
    """Megatron's rank queries at CP = TP = DP = 1 (slime's vocab-parallel log-prob runs unreduced
    without a process group)."""
    for name, value in (
        ("get_context_parallel_world_size", 1),
        ("get_context_parallel_rank", 0),
        ("get_tensor_model_parallel_world_size", 1),
        ("get_tensor_model_parallel_rank", 0),
        ("get_tensor_model_parallel_group", None),
        ("get_context_parallel_group", None),
    ):
        monkeypatch.setattr(mpu, name, lambda *a, _v=value, **k: _v)
    monkeypatch.setattr(mpu, "get_data_parallel_world_size", lambda *a, **k: 1)


def _response_log_probs(logits: torch.Tensor, tokens: torch.Tensor, resp: int) -> torch.Tensor:
    total = tokens.numel()
    scores = torch.log_softmax(logits[total - resp - 1 : total - 1].double() / TEMPERATURE, dim=-1)
    return scores.gather(1, tokens[total - resp :, None]).squeeze(1)


def _data(seed: int = 0):
    """Logits and tokens per sample; pi_old near pi (so the mode's clip acts somewhere) and mu off
    pi_old by a train-inference gap (weights truncated at both ends)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k, (total, resp) in enumerate(SHAPES):
        logits = torch.randn(total, VOCAB, generator=g)
        tokens = torch.randint(0, VOCAB, (total,), generator=g)
        mask = torch.ones(resp, dtype=torch.int32)
        if resp > 3:
            mask[1] = 0
        log_pi = _response_log_probs(logits, tokens, resp).float()
        log_old = (log_pi + 0.05 * torch.randn(resp, generator=g) + 0.4 * (torch.arange(resp) % 5 == 0)).clamp(
            max=-1e-3
        )
        gap = (
            0.05 * torch.randn(resp, generator=g)
            + 1.1 * (torch.arange(resp) % 3 == 1)
            - 1.1 * (torch.arange(resp) % 4 == 2)
        )
        log_mu = (log_old - gap).clamp(max=-1e-3)
        adv = torch.full((resp,), [1.0, -0.6, 0.3, -1.1][k])
        out.append(
            dict(
                total=total, resp=resp, logits=logits, tokens=tokens, mask=mask, log_old=log_old, log_mu=log_mu, adv=adv
            )
        )
    return out


def _batch(data):
    return {
        "unconcat_tokens": [d["tokens"] for d in data],
        "total_lengths": [d["total"] for d in data],
        "response_lengths": [d["resp"] for d in data],
        "loss_masks": [d["mask"] for d in data],
        "advantages": [d["adv"] for d in data],
        "log_probs": [d["log_old"] for d in data],  # slime's recompute: pi_old
        "rollout_log_probs": [d["log_mu"] for d in data],  # SGLang's: mu
        "rollout_mask_sums": torch.tensor([float(d["mask"].sum()) for d in data]),
    }


def _slime_loss(args, data):
    """slime's loss_function on one micro-batch; the loss and the logits' gradients with slime's
    rescaling (x num_microbatches / step_global_batch_size, or none in per-token mode) undone."""
    leaves = [d["logits"].clone().requires_grad_(True) for d in data]
    scaled, _, log = loss_function(args, _batch(data), 1, len(data), torch.cat(leaves)[None])
    scaled.backward()
    factor = 1.0 if args.calculate_per_token_loss else 1.0 / len(data)
    metrics = dict(zip(log["keys"], log["values"][1:].tolist()))
    return float(scaled.detach()) / factor, [leaf.grad / factor for leaf in leaves], metrics


def _common(**attrs):
    return dict(
        recompute_loss_function=False,
        allgather_cp=False,
        rollout_temperature=TEMPERATURE,
        rollout_top_p=1.0,
        log_probs_chunk_size=-1,
        use_tis=True,
        tis_clip=CLIP,
        tis_clip_low=CLIP_LOW,
        **attrs,
    )


def _project_args(mode):
    return loss_args(
        mode,
        **_common(
            loss_type="custom_loss",
            custom_loss_function_path="epic_slime.slime.loss.policy_loss",
            behavior_logprobs=None,
        ),
    )


def _weight(d, t):
    return min(max(math.exp(float(d["log_old"][t]) - float(d["log_mu"][t])), CLIP_LOW), CLIP)


@pytest.mark.parametrize("mode", ["epic", "dapo", "ctpo"])
def test_custom_loss_with_tis_through_slime_matches_the_float64_formula(single_rank_mpu, mode):
    args = _project_args(mode)
    data = _data(1)
    loss, grads, metrics = _slime_loss(args, data)
    # float64 reference: log pi from the same logits, token terms with the ratio to pi_old, times w_t
    _, params, aggregation = policy_loss_config_from_args(args)
    leaves = [d["logits"].double().requires_grad_(True) for d in data]
    log_pi = [_response_log_probs(leaf, d["tokens"], d["resp"]) for leaf, d in zip(leaves, data)]
    rows = token_terms(
        mode,
        [lp.tolist() for lp in log_pi],
        [d["log_old"].double().tolist() for d in data],
        [d["adv"].double().tolist() for d in data],
        [d["mask"].tolist() for d in data],
        {**LOSS_MODES[mode].defaults, **params},
    )
    ref_loss, dloss = 0.0, []
    for d, (valid, terms) in zip(data, rows):
        scale = 1.0 if aggregation == "token-mean" else 1.0 / len(valid)  # token sum or sum of sample means
        g = [0.0] * d["resp"]
        for t, (value, coef) in zip(valid, terms):
            ref_loss -= scale * _weight(d, t) * value
            g[t] = -scale * _weight(d, t) * coef
        dloss.append(torch.tensor(g, dtype=torch.float64))
    sum((lp * g).sum() for lp, g in zip(log_pi, dloss)).backward()  # chain rule d log pi / d logits only
    assert loss == pytest.approx(ref_loss, rel=2e-5, abs=1e-6)
    for got, leaf in zip(grads, leaves):
        torch.testing.assert_close(got.double(), leaf.grad, rtol=2e-4, atol=2e-6)
    assert any(float(leaf.grad.abs().sum()) > 0 for leaf in leaves)
    weights = [_weight(d, t) for d in data for t in range(d["resp"]) if d["mask"][t]]
    assert min(weights) == CLIP_LOW and max(weights) == CLIP and metrics["tis_truncated_frac"] > 0


def test_slime_builtin_tis_and_the_project_grpo_with_tis_agree(single_rank_mpu):
    data = _data(2)
    ours = _slime_loss(_project_args("grpo"), data)
    # slime's own PPO loss (eps 0.2 / 0.2, no dual clip: the project's grpo defaults) with vanilla TIS
    builtin_args = loss_args(
        "grpo",
        **_common(
            loss_type="policy_loss",
            advantage_estimator="grpo",
            use_opsm=False,
            eps_clip=0.2,
            eps_clip_high=0.2,
            eps_clip_c=None,
            get_mismatch_metrics=False,
            custom_tis_function_path=None,
            custom_pg_loss_reducer_function_path=None,
        ),
    )
    theirs = _slime_loss(builtin_args, data)
    assert ours[0] == pytest.approx(theirs[0], rel=1e-6, abs=1e-8)
    for a, b in zip(ours[1], theirs[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # one correction, not two: without TIS on our side the loss moves away from slime's
    plain = _slime_loss(
        loss_args(
            "grpo",
            **{
                **_common(
                    loss_type="custom_loss",
                    behavior_logprobs="recompute",
                    custom_loss_function_path="epic_slime.slime.loss.policy_loss",
                ),
                "use_tis": False,
            },
        ),
        data,
    )
    assert abs(plain[0] - theirs[0]) > 1e-3 * abs(theirs[0])
    assert ours[2]["pg_clipfrac"] == pytest.approx(theirs[2]["pg_clipfrac"], rel=1e-5)
