"""The slime loss adapter against the core, on slime-shaped inputs (no slime needed).

slime hands a custom loss per-sample 1-D tensors of the rank's local response tokens, full-length
loss masks and a reducer. The reducers (tests/support/slime_loss.py) are written from slime's documented contract
(``sum_of_sample_mean``: per sample, sum of x * mask over local tokens divided by the sample's
full-response denominator, summed over samples; per-token mode: plain masked token sum).
CP = 2 runs in two gloo processes and must reproduce CP = 1's loss and gradients.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.utils.rnn import pad_sequence

from epic_slime.slime.loss_parts.adapter import approx_kl, slime_policy_loss_from_log_probs
from epic_slime.slime.loss_parts.cp import make_all_reduce_gather
from epic_slime.losses import LOSS_MODES
from support.slime_loss import full_data, loss_args, sample_mean_reducer, slime_inputs

MODES = ["epic", "grpo", "dapo", "gspo", "ctpo", "ripo", "cppo", "bandpo", "acpo"]


def _core_reference(mode, args, data, aggregation):
    """The core on padded [B, T] tensors: the loss slime's reducer must produce, and its gradient."""
    from epic_slime.losses import compute_policy_loss
    from epic_slime.losses.flags import policy_loss_config_from_args

    _, params, _ = policy_loss_config_from_args(args)
    leaves = [d["log_pi"].clone().requires_grad_(True) for d in data]
    mask = pad_sequence([d["mask"].bool() for d in data], batch_first=True)
    out = compute_policy_loss(
        mode,
        pad_sequence(leaves, batch_first=True),
        pad_sequence([d["log_mu"] for d in data], batch_first=True),
        pad_sequence([d["adv"] for d in data], batch_first=True),
        mask,
        aggregation=aggregation,
        **params,
    )
    # slime's step normaliser: number of samples (sum of sample means) or of tokens (token sum)
    scale = float(mask.sum()) if aggregation == "token-mean" else float(len(data))
    loss = out.loss * scale
    loss.backward()
    return loss.detach(), [leaf.grad for leaf in leaves], out


@pytest.mark.parametrize("mode", MODES)
def test_cp1_adapter_equals_core(mode):
    data = full_data()
    args = loss_args(mode)
    aggregation = args.policy_loss_aggregation or LOSS_MODES[mode].aggregation
    leaves, log_probs, batch, reducer = slime_inputs(data, 0, 1, args)
    loss, metrics = slime_policy_loss_from_log_probs(args, batch, log_probs, None, reducer)
    loss.backward()
    ref_loss, ref_grads, ref_out = _core_reference(mode, args, data, aggregation)
    torch.testing.assert_close(loss.detach(), ref_loss, rtol=1e-12, atol=1e-12)
    for leaf, grad in zip(leaves, ref_grads):
        torch.testing.assert_close(leaf.grad, grad, rtol=1e-12, atol=1e-12)
    assert any(float(g.abs().sum()) > 0 for g in ref_grads)
    # metrics: slime's names, the core's diagnostics weighted by the micro-batch's share
    assert set(metrics) >= {
        "loss",
        "pg_loss",
        "entropy_loss",
        "pg_clipfrac",
        "ppo_kl",
        "train_rollout_logprob_abs_diff",
    }
    # pg_clipfrac: the core's per-token clip indicator, reduced by slime's reducer
    clipped = [ref_out.clipped[i, : d["resp"]] for i, d in enumerate(data)]
    torch.testing.assert_close(
        metrics["pg_clipfrac"].double(), reducer(torch.cat(clipped).double()), rtol=1e-6, atol=1e-7
    )
    assert float(metrics["pg_clipfrac"]) > 0, "the fixture must make some tokens clip"
    # the core's diagnostics, weighted by the micro-batch's share of the step's normaliser
    weight = float(sum(d["mask"].sum() for d in data)) if aggregation == "token-mean" else len(data)
    torch.testing.assert_close(
        metrics["policy/ratio_mean"].double(),
        torch.as_tensor(float(ref_out.metrics["ratio_mean"]) * weight, dtype=torch.float64),
        rtol=1e-6,
        atol=1e-7,
    )
    assert "policy/valid_tokens" not in metrics and "policy/empty_response_frac" in metrics
    expected_kl = reducer(torch.cat([d["log_mu"] - d["log_pi"] for d in data]))
    torch.testing.assert_close(metrics["ppo_kl"].double(), expected_kl, rtol=1e-6, atol=1e-7)


def test_seq_mean_token_sum_and_kl_entropy_terms():
    data = full_data(1)
    args = loss_args(
        "epic",
        "--policy-loss-aggregation",
        "seq-mean-token-sum",
        use_kl_loss=True,
        kl_loss_coef=1e-3,
        entropy_coef=0.01,
    )
    leaves, log_probs, batch, reducer = slime_inputs(data, 0, 1, args)
    entropy = [torch.rand(len(lp), dtype=torch.float64) for lp in log_probs]
    loss, metrics = slime_policy_loss_from_log_probs(args, batch, log_probs, entropy, reducer)
    ref_loss, _, _ = _core_reference("epic", args, data, "seq-mean-token-sum")
    # KL(pi || ref) with the k3 estimator from its definition: exp(ref - pi) - 1 - (ref - pi)
    kl = [torch.exp(d["ref"] - d["log_pi"]) - 1 - (d["ref"] - d["log_pi"]) for d in data]
    kl_loss = sum((k * d["mask"]).sum() / d["mask"].sum() for k, d in zip(kl, data))
    entropy_loss = sum((e * d["mask"]).sum() / d["mask"].sum() for e, d in zip(entropy, data))
    torch.testing.assert_close(metrics["kl_loss"].double(), kl_loss, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(loss.detach(), ref_loss + 1e-3 * kl_loss - 0.01 * entropy_loss, rtol=1e-10, atol=1e-12)


def test_kl_estimators_follow_their_definitions():
    lp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    ref = torch.tensor([-1.5, -0.1, -0.5], dtype=torch.float64)
    d = lp - ref
    torch.testing.assert_close(approx_kl(lp, ref, "k1").double(), d.float().double())
    torch.testing.assert_close(approx_kl(lp, ref, "k2").double(), (d**2 / 2).float().double())
    torch.testing.assert_close(approx_kl(lp, ref, "k3").double(), (torch.exp(-d) - 1 + d).float().double())
    big = approx_kl(torch.tensor([0.0]), torch.tensor([20.0]), "low_var_kl")
    assert float(big) == 10.0  # low_var_kl is clamped
    with pytest.raises(ValueError, match="kl-loss-type"):
        approx_kl(lp, ref, "k4")


def test_missing_or_bad_inputs_are_named():
    data = full_data()
    args = loss_args("epic")
    _, log_probs, batch, reducer = slime_inputs(data, 0, 1, args)
    with pytest.raises(ValueError, match="--behavior-logprobs recompute"):
        slime_policy_loss_from_log_probs(args, {**batch, "rollout_log_probs": None}, log_probs, None, reducer)
    args_re = loss_args("epic", behavior_logprobs="recompute")
    with pytest.raises(ValueError, match="use-rollout-logprobs"):
        slime_policy_loss_from_log_probs(args_re, batch, log_probs, None, reducer)
    bad = {**batch, "advantages": [a[:-1] for a in batch["advantages"]]}
    with pytest.raises(ValueError, match=r"batch\['advantages'\]\[0\]"):
        slime_policy_loss_from_log_probs(args, bad, log_probs, None, reducer)
    with pytest.raises(ValueError, match="calculate_per_token_loss"):
        slime_policy_loss_from_log_probs(
            loss_args("dapo", calculate_per_token_loss=False), batch, log_probs, None, reducer
        )


def test_recompute_behaviour_uses_slime_log_probs():
    data = full_data(2)
    args = loss_args("grpo", behavior_logprobs="recompute")
    leaves, log_probs, batch, reducer = slime_inputs(data, 0, 1, args)
    # the recompute becomes mu; the rollout log-probs are then only a diagnostic
    batch = {
        **batch,
        "log_probs": batch["rollout_log_probs"],
        "rollout_log_probs": [x - 5 for x in batch["rollout_log_probs"]],
    }
    loss, metrics = slime_policy_loss_from_log_probs(args, batch, log_probs, None, reducer)
    ref_loss, _, _ = _core_reference("grpo", args, data, "seq-mean-token-mean")
    torch.testing.assert_close(loss.detach(), ref_loss, rtol=1e-12, atol=1e-12)
    assert float(metrics["train_rollout_logprob_abs_diff"]) == pytest.approx(5 * len(data), rel=1e-6)


# KL terms are float32 in slime (and here), so cases with KL are compared at float32 precision.
CP_CASES = [(mode, False) for mode in MODES] + [("epic", True), ("dapo", True)]


def _cp_worker(rank, world, init_file, result_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        results = {}
        gather = make_all_reduce_gather()
        for mode, kl in CP_CASES:
            data = full_data()
            args = loss_args(mode, use_kl_loss=kl, kl_loss_coef=1e-3)
            leaves, log_probs, batch, reducer = slime_inputs(data, rank, world, args)
            loss, metrics = slime_policy_loss_from_log_probs(args, batch, log_probs, None, reducer, rank, world, gather)
            loss.backward()
            results[mode, kl] = (
                loss.detach(),
                [leaf.grad.clone() for leaf in leaves],
                {k: v for k, v in metrics.items()},
            )
        torch.save(results, f"{result_file}.{rank}")
    finally:
        dist.destroy_process_group()


def test_cp2_over_gloo_equals_cp1_for_every_mode():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_cp_worker, args=(2, os.path.join(tmp, "init"), os.path.join(tmp, "out")), nprocs=2, join=True)
        ranks = [torch.load(os.path.join(tmp, f"out.{r}")) for r in range(2)]
    for mode, kl in CP_CASES:
        data = full_data()
        args = loss_args(mode, use_kl_loss=kl, kl_loss_coef=1e-3)
        leaves, log_probs, batch, reducer = slime_inputs(data, 0, 1, args)
        loss, metrics = slime_policy_loss_from_log_probs(args, batch, log_probs, None, reducer)
        loss.backward()
        tol = dict(rtol=1e-6, atol=1e-9) if kl else dict(rtol=1e-12, atol=1e-14)
        r0, r1 = ranks[0][mode, kl], ranks[1][mode, kl]
        torch.testing.assert_close(r0[0] + r1[0], loss.detach(), **tol, msg=f"{mode} kl={kl}")
        for i, leaf in enumerate(leaves):
            torch.testing.assert_close(r0[1][i] + r1[1][i], leaf.grad, **tol, msg=f"{mode} kl={kl} sample {i}")
            # every token's gradient comes from exactly one rank
            assert bool(((r0[1][i] == 0) | (r1[1][i] == 0)).all())
        # metrics add up across the CP group to the CP = 1 value, as slime's all-reduce does
        policy_names = sorted(n for n in metrics if n.startswith("policy/"))
        assert len(policy_names) > 10 and set(r0[2]) == set(r1[2]) == set(metrics)
        for name in ("pg_loss", "ppo_kl", "pg_clipfrac") + (("kl_loss",) if kl else ()) + tuple(policy_names):
            total = r0[2][name] + r1[2][name]
            torch.testing.assert_close(
                total.double(), metrics[name].double(), rtol=1e-5, atol=1e-7, msg=f"{mode} {name}"
            )


def test_unbiased_kl_weights_k3_by_the_ratio_to_the_recomputed_log_probs():
    data = full_data(3)
    args = loss_args("epic", use_kl_loss=True, kl_loss_coef=1e-3, kl_loss_type="k3", use_unbiased_kl=True)
    leaves, log_probs, batch, reducer = slime_inputs(data, 0, 1, args)
    old = [d["log_pi"] - 0.3 * (i + 1) for i, d in enumerate(data)]  # recomputed log-probs that differ
    batch = {**batch, "log_probs": old}
    _, metrics = slime_policy_loss_from_log_probs(args, batch, log_probs, None, reducer)
    k3 = [torch.exp(d["ref"] - d["log_pi"]) - 1 - (d["ref"] - d["log_pi"]) for d in data]
    weighted = [torch.exp(d["log_pi"] - o) * k for d, o, k in zip(data, old, k3)]
    expected = sum((w * d["mask"]).sum() / d["mask"].sum() for w, d in zip(weighted, data))
    plain = sum((k * d["mask"]).sum() / d["mask"].sum() for k, d in zip(k3, data))
    assert abs(float(expected) - float(plain)) > 1e-3  # the weighting matters in this fixture
    torch.testing.assert_close(metrics["kl_loss"].double(), expected, rtol=1e-6, atol=1e-9)
    # with --use-rollout-logprobs the weight is against the rollout log-probs instead
    args_r = loss_args(
        "epic", use_kl_loss=True, kl_loss_coef=1e-3, kl_loss_type="k3", use_unbiased_kl=True, use_rollout_logprobs=True
    )
    _, metrics_r = slime_policy_loss_from_log_probs(args_r, batch, log_probs, None, reducer)
    weighted_r = [torch.exp(d["log_pi"] - d["log_mu"]) * k for d, k in zip(data, k3)]
    expected_r = sum((w * d["mask"]).sum() / d["mask"].sum() for w, d in zip(weighted_r, data))
    torch.testing.assert_close(metrics_r["kl_loss"].double(), expected_r, rtol=1e-6, atol=1e-9)


def test_bad_tokens_are_skipped_on_the_cluster_path():
    from epic_slime.slime.cli.flags import add_project_arguments

    registered = add_project_arguments(argparse.ArgumentParser()).parse_args([])
    assert (registered.on_bad_tokens, registered.max_bad_token_frac) == ("skip", 0.01)  # the cluster default
    data = full_data(4)
    args = loss_args("epic", use_kl_loss=True, kl_loss_coef=1e-3, on_bad_tokens="skip", max_bad_token_frac=0.05)
    leaves, log_probs, batch, reducer = slime_inputs(data, 0, 1, args)
    bad_sample, bad_pos = 3, 4
    log_probs[bad_sample] = torch.where(
        torch.arange(len(log_probs[bad_sample])) == bad_pos,
        torch.tensor(float("nan"), dtype=torch.float64),
        log_probs[bad_sample],
    )
    loss, metrics = slime_policy_loss_from_log_probs(args, batch, log_probs, None, reducer)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(v).all() for v in metrics.values())
    assert all(torch.isfinite(leaf.grad).all() for leaf in leaves) and float(leaves[bad_sample].grad[bad_pos]) == 0
    # reference: the token simply not on the loss mask (its denominator shrinks with it)
    masks = [d["mask"].clone() for d in data]
    masks[bad_sample][bad_pos] = 0
    ref_leaves, ref_lp, ref_batch, _ = slime_inputs(data, 0, 1, args)
    ref_batch = {**ref_batch, "loss_masks": masks}
    # the bad token drops out of the core's mask; slime's reducer keeps the batch's denominators
    ref_reducer = sample_mean_reducer(
        [torch.arange(d["resp"]) for d in data], masks, [d["mask"].sum() for d in data], False
    )
    ref_loss, ref_metrics = slime_policy_loss_from_log_probs(args, ref_batch, ref_lp, None, ref_reducer)
    torch.testing.assert_close(loss.detach(), ref_loss.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(metrics["kl_loss"], ref_metrics["kl_loss"], rtol=1e-6, atol=1e-9)
    n_valid = float(sum(m.sum() for m in masks))
    assert float(metrics["policy/bad_token_frac"]) == pytest.approx(len(data) / (n_valid + 1), rel=1e-6)
    assert float(ref_metrics["policy/bad_token_frac"]) == 0
    # raise (no flag on the args) names the field
    with pytest.raises(ValueError, match="log_probs has a non-finite value"):
        slime_policy_loss_from_log_probs(loss_args("epic"), batch, log_probs, None, reducer)


def test_loss_flags_are_resolved_once_per_run_not_per_micro_batch(monkeypatch):
    import epic_slime.losses.flags as loss_flags

    resolutions = []
    resolve = loss_flags.policy_loss_config_from_args

    def counting(args):
        resolutions.append(args)
        return resolve(args)

    monkeypatch.setattr(loss_flags, "policy_loss_config_from_args", counting)
    args = loss_args("epic", "--epic-delta-high", "0.004")
    losses = []
    for seed in range(4):  # four micro-batches of one step, the same args object as slime passes
        _, log_probs, batch, reducer = slime_inputs(full_data(seed), 0, 1, args)
        losses.append(float(slime_policy_loss_from_log_probs(args, batch, log_probs, None, reducer)[0].detach()))
    assert len(resolutions) == 1
    assert len(set(losses)) == 4
    # another run's args (a test, a new process) is resolved afresh, with its own mode
    other = loss_args("grpo")
    _, log_probs, batch, reducer = slime_inputs(full_data(0), 0, 1, other)
    ref_loss, _, _ = _core_reference("grpo", other, full_data(0), "seq-mean-token-mean")
    torch.testing.assert_close(
        slime_policy_loss_from_log_probs(other, batch, log_probs, None, reducer)[0].detach(),
        ref_loss,
        rtol=1e-12,
        atol=1e-12,
    )
    assert [a is other for a in resolutions].count(True) == 2  # the reference resolves it too
    assert [a is args for a in resolutions].count(True) == 1
