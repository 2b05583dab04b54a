"""The project's loss through slime's real training path on real Megatron-core (CPU, gloo).

The runtime's tiny Qwen3-MoE (2 layers, 4 experts top-2, GQA, q/k norms, tied embeddings) is built in
Hugging Face and, with the same weights, as a Megatron GPTModel (support.megatron_qwen's mapping)
under Megatron's DDP and optimizer. slime's own `forward_only(get_log_probs_and_entropy)` and
`train_one_step` run it: DataIterator -> get_batch (THD packing) -> the model -> loss_function with
`--custom-loss-function-path epic_slime.slime.loss.policy_loss` -> backward -> Adam step; for every
loss mode (Top-K modes aside: slime 624b824a's train_one_step does not forward their batch keys, see
docs/cluster.md), at TP = 1 and TP = 2 (+ sequence parallelism, which Megatron requires for MoE
under TP). CP = 2 is not run: the harness's THD attention is per-segment and local, and under CP a
rank holds two zigzag chunks of each segment, whose attention needs the other rank's keys and values
(TransformerEngine's ring attention does that on GPU; megatron-core's local attention refuses CP).

Tolerances (float32 throughout):
- log-probs, Megatron vs HF, 1e-5 absolute: the two differ only in summation order (fused QKV and
  fc1 GEMMs, per-segment SDPA vs padded SDPA, vocab-parallel log-softmax); measured 2.4e-7 (2 ulp
  of a log-prob near 2), 40x margin, and 5000x below the behaviour drift the loss sees (0.05);
- TP 2 vs TP 1: loss 1e-6 relative, every gradient element 1e-5 of that tensor's largest element
  (all-reduce and split GEMMs reorder float32 sums);
- loss vs the core on the same log-probs: 1e-5 relative (the hook and the core run the same float32
  formula over the same tokens; the reduction order differs).
"""

from __future__ import annotations

import math

import pytest
import torch

from support.megatron_run import finish_all, skip_reason, start

pytestmark = pytest.mark.slow
if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)

from epic_slime.losses import LOSS_MODES  # noqa: E402

MODES = [m for m, spec in LOSS_MODES.items() if not spec.needs_topk]
EPIC_DIAGNOSTICS = ("abs_z_mean", "abs_L_mean", "grad_removed_frac", "abs_L_p50_position", "clipfrac_position_cv")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("megatron_loss")
    outs = {tp: tmp / f"tp{tp}.json" for tp in (1, 2)}
    done = finish_all({tp: start("modes", tp, outs[tp]) for tp in (1, 2)}, outs, timeout=900)
    for tp, (rc, log, result) in done.items():
        assert rc == 0 and result is not None, f"TP={tp} worker exited {rc}:\n{log}"
    return {tp: result for tp, (_, _, result) in done.items()}


def test_every_patch_was_applied_and_every_mode_ran(runs):
    from support.megatron_cpu import PATCHES

    for tp, result in runs.items():
        assert sorted(result["applied"]) == sorted(PATCHES), tp
        assert sorted(result["modes"]) == sorted(MODES), tp


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_log_probs_equal_the_hf_models(runs, tp):
    result = runs[tp]
    hf = result["hf_log_probs"]
    for mode, seen in result["modes"].items():
        assert [len(x) for x in seen["log_probs"]] == [len(x) for x in hf]
        for mine, theirs in zip(seen["log_probs"], hf):
            torch.testing.assert_close(torch.tensor(mine), torch.tensor(theirs), rtol=0, atol=1e-5, msg=mode)


@pytest.mark.parametrize("mode", MODES)
def test_tp2_loss_and_gradients_equal_tp1(runs, mode):
    one, two = runs[1]["modes"][mode], runs[2]["modes"][mode]
    assert two["scaled"] == pytest.approx(one["scaled"], rel=1e-6, abs=1e-7)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert sorted(one["grads"]) == sorted(two["grads"])
    moved = 0
    for name, g1 in one["grads"].items():
        g1, g2 = torch.tensor(g1), torch.tensor(two["grads"][name])
        scale = float(g1.abs().max())
        torch.testing.assert_close(g2, g1, rtol=0, atol=1e-5 * scale + 1e-12, msg=f"{mode} {name}")
        moved += scale > 0
    assert moved >= len(one["grads"]) // 2, f"{mode}: most parameters must get gradient"


def _core_loss(mode, log_probs, data):
    from torch.nn.utils.rnn import pad_sequence

    from epic_slime.losses import compute_policy_loss
    from epic_slime.losses.flags import policy_loss_config_from_args
    from support.megatron_data import make_args

    _, params, aggregation = policy_loss_config_from_args(make_args(mode))
    pad = lambda rows, dtype: pad_sequence([torch.tensor(r, dtype=dtype) for r in rows], batch_first=True)  # noqa: E731
    out = compute_policy_loss(
        mode,
        pad(log_probs, torch.float32),
        pad(data["rollout_log_probs"], torch.float32),
        pad(data["advantages"], torch.float32),
        pad(data["loss_masks"], torch.int32).bool(),
        aggregation=aggregation,
        **params,
    )
    return out, aggregation


@pytest.mark.parametrize("mode", MODES)
def test_the_loss_equals_the_cores_on_megatrons_log_probs(runs, mode):
    result = runs[1]
    seen = result["modes"][mode]
    core, aggregation = _core_loss(mode, seen["log_probs"], result["data"])
    # slime's loss_function scales a per-sample-mean loss by 1 / step_global_batch_size (the core's
    # seq-mean over the step's samples), a per-token loss is divided by `normalizer` (its token count)
    scaled = seen["scaled"] / seen["normalizer"] if aggregation == "token-mean" else seen["scaled"]
    assert scaled == pytest.approx(float(core.loss), rel=1e-5, abs=1e-7)
    if aggregation == "token-mean":
        assert seen["normalizer"] == sum(sum(m) for m in result["data"]["loss_masks"])
    assert math.isfinite(seen["grad_norm"]) and seen["grad_norm"] > 0


def test_epics_diagnostics_come_out_of_slimes_step(runs):
    for tp in (1, 2):
        seen = runs[tp]["modes"]["epic"]
        core, _ = _core_loss("epic", seen["log_probs"], runs[tp]["data"])
        for name in EPIC_DIAGNOSTICS:
            assert name in core.metrics
            assert f"policy/{name}" in seen["keys"], (tp, name)
            assert math.isfinite(seen["reduced"][f"policy/{name}"]), (tp, name)
        assert seen["reduced"]["policy/abs_z_mean"] > 0
    # the same diagnostics at TP 1 and 2
    for name in EPIC_DIAGNOSTICS:
        one, two = runs[1]["modes"]["epic"]["reduced"], runs[2]["modes"]["epic"]["reduced"]
        assert two[f"policy/{name}"] == pytest.approx(one[f"policy/{name}"], rel=1e-5, abs=1e-6), name
