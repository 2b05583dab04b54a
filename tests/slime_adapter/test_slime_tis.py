"""``--use-tis`` on the slime path (``epic_slime.slime.loss_parts.tis``), without slime: the adapter's loss and
gradient against an independent float64 reference of the formula, the same inputs through the
runtime's composition, the refusals. Through slime's own ``loss_function``: test_slime_tis_contract.py.

Formula: each valid token's per-token loss of the mode, with the ratio to pi_old (slime's recomputed
``log_probs``), is multiplied by w_t = clamp(pi_old_t / mu_t, --tis-clip-low, --tis-clip), mu the
rollout log-probs; then the mode's aggregation."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from epic_slime.losses import LOSS_MODES, compute_policy_loss
from epic_slime.losses.flags import policy_loss_config_from_args
from epic_slime.losses.tis import tis_weighted_loss, tis_weights
from epic_slime.slime.loss_parts.adapter import slime_policy_loss_from_log_probs
from epic_slime.slime.cli.checks import check_unsupported_flags
from epic_slime.slime.cli.dry_run import check_argv
from epic_slime.slime.cli.flags import ProjectFlagError
from support.loss_reference import token_terms
from support.slime_loss import full_data, loss_args, sample_mean_reducer, slime_inputs

MODES = ["epic", "grpo", "dapo", "gspo", "ctpo", "cispo"]


def tis_args(mode: str, *extra: str, clip: float = 2.0, clip_low: float = 0.0, **attrs):
    return loss_args(
        mode,
        *extra,
        **{"use_tis": True, "tis_clip": clip, "tis_clip_low": clip_low, "behavior_logprobs": None, **attrs},
    )


def with_pi_old(data, seed: int = 0):
    """Adds pi_old per sample: the fixture's log mu becomes pi_old, and a new log mu departs from it by
    a train-inference gap (small on most tokens, large on a few, both ways: weights truncated at 2 and
    weights well below 1)."""
    g = torch.Generator().manual_seed(100 + seed)
    for d in data:
        d["log_old"] = d["log_mu"]
        gap = 0.05 * torch.randn(d["resp"], generator=g, dtype=torch.float64)
        gap[1::3] += torch.tensor([1.2, -0.9] * d["resp"], dtype=torch.float64)[: len(gap[1::3])]
        d["log_mu"] = (d["log_old"] - gap).clamp(max=-1e-4)
    return data


def tis_batch(data, args):
    leaves, log_probs, batch, reducer = slime_inputs(data, 0, 1, args)
    batch = {**batch, "log_probs": [d["log_old"].clone() for d in data]}  # CP = 1: local = full response
    return leaves, log_probs, batch, reducer


def float64_reference(mode, args, data, clip, clip_low):
    """(loss as slime's reducer sums it, d loss / d log pi per sample), token by token in plain Python."""
    _, params, aggregation = policy_loss_config_from_args(args)
    params = {**LOSS_MODES[mode].defaults, **params}
    rows = token_terms(
        mode,
        [d["log_pi"].tolist() for d in data],
        [d["log_old"].tolist() for d in data],
        [d["adv"].tolist() for d in data],
        [d["mask"].tolist() for d in data],
        params,
    )
    loss, grads = 0.0, []
    for d, (valid, terms) in zip(data, rows):
        grad = [0.0] * d["resp"]
        # slime's step normaliser: the sum of sample means, or the token sum (token-mean)
        scale = 1.0 if aggregation == "token-mean" else 1.0 / len(valid)
        for t, (value, coef) in zip(valid, terms):
            w = min(max(math.exp(float(d["log_old"][t]) - float(d["log_mu"][t])), clip_low), clip)
            loss -= scale * w * value
            grad[t] = -scale * w * coef
        grads.append(torch.tensor(grad, dtype=torch.float64))
    return loss, grads


@pytest.mark.parametrize("mode", MODES)
def test_slime_loss_with_tis_matches_the_float64_formula(mode):
    clip, clip_low = 2.0, (0.5 if mode == "grpo" else 0.0)
    data = with_pi_old(full_data(5))
    args = tis_args(mode, clip=clip, clip_low=clip_low)
    leaves, log_probs, batch, reducer = tis_batch(data, args)
    loss, metrics = slime_policy_loss_from_log_probs(args, batch, log_probs, None, reducer)
    loss.backward()
    ref_loss, ref_grads = float64_reference(mode, args, data, clip, clip_low)
    assert float(loss.detach()) == pytest.approx(ref_loss, rel=1e-9, abs=1e-12)
    for leaf, grad in zip(leaves, ref_grads):
        torch.testing.assert_close(leaf.grad, grad, rtol=1e-9, atol=1e-12)
    assert any(float(g.abs().sum()) > 0 for g in ref_grads)
    # the fixture reaches both truncations and untruncated weights
    w = [torch.exp(d["log_old"] - d["log_mu"]).clamp(clip_low, clip) for d in data]
    assert any(bool((x == clip).any()) for x in w) and any(bool((x < 0.6).any()) for x in w)
    masks = [d["mask"] for d in data]
    reduce = sample_mean_reducer(
        [torch.arange(d["resp"]) for d in data], masks, [m.sum() for m in masks], args.calculate_per_token_loss
    )
    want_mean = reduce(torch.cat(w))
    torch.testing.assert_close(
        metrics["tis_truncated_frac"].double(), reduce(torch.cat(w).ge(clip).double()), rtol=1e-6, atol=1e-7
    )
    assert 0 < float(metrics["tis_truncated_frac"]) < float(reduce(torch.ones(sum(d["resp"] for d in data)).double()))
    torch.testing.assert_close(metrics["tis_weight_mean"].double(), want_mean, rtol=1e-6, atol=1e-7)


def test_the_ratio_base_is_pi_old_and_without_mismatch_tis_is_the_plain_recompute_loss():
    data = full_data(6)
    for d in data:
        d["log_old"] = d["log_mu"].clone()  # mu == pi_old: every weight is 1
    args = tis_args("epic")
    _, log_probs, batch, reducer = tis_batch(data, args)
    loss, metrics = slime_policy_loss_from_log_probs(args, batch, log_probs, None, reducer)
    plain = loss_args("epic", behavior_logprobs="recompute")
    plain_loss, _ = slime_policy_loss_from_log_probs(plain, batch, log_probs, None, reducer)
    assert float(loss.detach()) == pytest.approx(float(plain_loss.detach()), rel=1e-12)
    assert float(metrics["tis_weight_mean"]) == pytest.approx(len(data))
    # a ratio to mu with the weights on top would differ once mu moves off pi_old
    shifted = {**batch, "rollout_log_probs": [x - 0.3 for x in batch["rollout_log_probs"]]}
    shifted_loss, shifted_metrics = slime_policy_loss_from_log_probs(args, shifted, log_probs, None, reducer)
    assert float(shifted_metrics["tis_weight_mean"]) == pytest.approx(len(data) * math.exp(0.3), rel=1e-6)  # float32
    assert float(shifted_loss.detach()) == pytest.approx(math.exp(0.3) * float(plain_loss.detach()), rel=1e-9)


@pytest.mark.parametrize("mode", ["epic", "dapo", "gspo"])
def test_runtime_composition_and_slime_path_agree_on_the_same_inputs(mode):
    """The runtime trainer's composition (``compute_policy_loss`` with pi_old as the ratio base,
    ``tis_weights``, ``tis_weighted_loss``) and the slime adapter, on the same tensors."""
    data = with_pi_old(full_data(7))
    args = tis_args(mode)
    leaves, log_probs, batch, reducer = tis_batch(data, args)
    loss, _ = slime_policy_loss_from_log_probs(args, batch, log_probs, None, reducer)
    loss.backward()
    _, params, aggregation = policy_loss_config_from_args(args)
    runtime_leaves = [d["log_pi"].clone().requires_grad_(True) for d in data]
    pad = lambda xs: pad_sequence(xs, batch_first=True)  # noqa: E731
    mask = pad([d["mask"].bool() for d in data])
    old = pad([d["log_old"] for d in data])
    out = compute_policy_loss(
        mode, pad(runtime_leaves), old, pad([d["adv"] for d in data]), mask, aggregation=aggregation, **params
    )
    runtime_loss = tis_weighted_loss(
        out.per_token_loss, tis_weights(old, pad([d["log_mu"] for d in data]), mask, 2.0), mask, out.aggregation
    )
    runtime_loss.backward()
    scale = float(mask.sum()) if aggregation == "token-mean" else float(len(data))  # slime's step normaliser
    assert float(loss.detach()) == pytest.approx(scale * float(runtime_loss.detach()), rel=1e-12)
    for leaf, runtime_leaf in zip(leaves, runtime_leaves):
        torch.testing.assert_close(leaf.grad, scale * runtime_leaf.grad, rtol=1e-12, atol=1e-14)


def test_tis_weights_at_the_clips_float64():
    old = torch.tensor(
        [math.log(2.0) - 1e-9, math.log(2.0) + 1e-9, math.log(0.5) + 1e-9, math.log(0.5) - 1e-9, -3.0],
        dtype=torch.float64,
    )
    mu = torch.zeros_like(old)
    mask = torch.tensor([True, True, True, True, False])
    w = tis_weights(old, mu, mask, clip=2.0, clip_low=0.5)
    assert w.tolist()[:4] == pytest.approx([2.0 - 2e-9, 2.0, 0.5 + 5e-10, 0.5], rel=1e-12, abs=0)
    assert w[4] == 0 and not w.requires_grad


def test_bad_rollout_log_probs_are_named_or_skipped_and_counted():
    data = with_pi_old(full_data(8))
    _, log_probs, batch, reducer = tis_batch(data, tis_args("epic"))
    bad = {**batch, "rollout_log_probs": [x.clone() for x in batch["rollout_log_probs"]]}
    bad["rollout_log_probs"][1][2] = float("nan")
    with pytest.raises(ValueError, match=r"rollout_log_probs\[1\] has a bad value nan on valid local token 2"):
        slime_policy_loss_from_log_probs(tis_args("epic", on_bad_tokens="raise"), bad, log_probs, None, reducer)
    skip = tis_args("epic", on_bad_tokens="skip", max_bad_token_frac=0.05)
    loss, metrics = slime_policy_loss_from_log_probs(skip, bad, log_probs, None, reducer)
    assert math.isfinite(float(loss.detach())) and all(torch.isfinite(v).all() for v in metrics.values())
    n_valid = float(sum(d["mask"].sum() for d in data))
    assert float(metrics["policy/bad_token_frac"]) == pytest.approx(len(data) / n_valid, rel=1e-6)
    # reference: the token off the loss mask (slime's reducer keeps the batch's denominators)
    masks = [d["mask"].clone() for d in data]
    masks[1][2] = 0
    ref_reducer = sample_mean_reducer(
        [torch.arange(d["resp"]) for d in data], masks, [d["mask"].sum() for d in data], False
    )
    ref_loss, _ = slime_policy_loss_from_log_probs(skip, {**batch, "loss_masks": masks}, log_probs, None, ref_reducer)
    assert float(loss.detach()) == pytest.approx(float(ref_loss.detach()), rel=1e-12)


def test_the_loss_names_what_does_not_compose():
    data = with_pi_old(full_data(9))
    args = tis_args("epic")
    _, log_probs, batch, reducer = tis_batch(data, args)
    with pytest.raises(ValueError, match="--use-tis: the batch has no rollout_log_probs"):
        slime_policy_loss_from_log_probs(args, {**batch, "rollout_log_probs": None}, log_probs, None, reducer)
    with pytest.raises(ValueError, match="--use-tis with --use-rollout-logprobs"):
        slime_policy_loss_from_log_probs(tis_args("epic", use_rollout_logprobs=True), batch, log_probs, None, reducer)
    with pytest.raises(ValueError, match="--behavior-logprobs rollout with --use-tis"):
        slime_policy_loss_from_log_probs(tis_args("epic", behavior_logprobs="rollout"), batch, log_probs, None, reducer)
    with pytest.raises(ValueError, match=r"--tis-clip-low must be in \[0, --tis-clip = 2.0\), got 2.0"):
        slime_policy_loss_from_log_probs(tis_args("epic", clip_low=2.0), batch, log_probs, None, reducer)


BASE = [
    "--loss-type",
    "custom_loss",
    "--custom-loss-function-path",
    "epic_slime.slime.loss.policy_loss",
    "--rollout-function-path",
    "epic_slime.slime.rollout.generate_rollout",
    "--rollout-batch-size",
    "64",
    "--n-samples-per-prompt",
    "8",
]


def test_driver_accepts_use_tis_and_refuses_what_does_not_compose_in_one_line():
    config, args, _ = check_argv(BASE + ["--use-tis", "--tis-clip", "2"])
    assert config.behavior_logprobs == "recompute" and args.use_tis and args.tis_clip == 2.0
    assert check_argv(BASE + ["--use-tis", "--behavior-logprobs", "recompute"])[0].behavior_logprobs == "recompute"
    refused = [
        (["--policy-loss", "dppo_topk_tv"], "--use-tis with --policy-loss dppo_topk_tv"),
        (["--use-rollout-logprobs"], "--use-tis with --use-rollout-logprobs"),
        (["--behavior-logprobs", "rollout"], "--behavior-logprobs rollout with --use-tis"),
        (["--tis-clip", "0"], "--tis-clip must be a finite number > 0, got 0.0"),
        (["--tis-clip-low", "3"], r"--tis-clip-low must be in \[0, --tis-clip = 2.0\), got 3.0"),
    ]
    for extra, message in refused:
        with pytest.raises(ProjectFlagError, match=message) as info:
            check_argv(BASE + ["--use-tis"] + extra)
        assert "\n" not in str(info.value)
    # slime's TIS hook is read only by its built-in loss: refused with the command-line checks
    check_unsupported_flags(BASE + ["--use-tis"])
    with pytest.raises(ProjectFlagError, match="--custom-tis-function-path is not supported by the epic-slime driver"):
        check_unsupported_flags(BASE + ["--use-tis", "--custom-tis-function-path", "x.y"])
