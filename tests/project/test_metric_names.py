"""One list of metric names: the embedded runtime's trainer and the slime loss adapter, each run on
real inputs, log the loss core's diagnostics and the losses under the same names; TensorBoard."""

from __future__ import annotations

import math
import os
import re

import pytest

from support.eval_helpers import REPO_ROOT
from support.runtime_helpers import tiny_trainer
from epic_slime import metric_names as names
from epic_slime.slime.loss_parts.adapter import slime_policy_loss_from_log_probs
from epic_slime.slime.stream.gate import StalenessGate
from support.slime_loss import full_data, loss_args, slime_inputs

# present on one path only, by design: slime drops counts (it logs the empty-response and bad-token
# fractions, which the runtime logs too) and Megatron counts its own skipped iterations
RUNTIME_ONLY = {"valid_tokens", "empty_responses", "bad_tokens", "skipped_steps"}
SLIME_ONLY = {"empty_response_frac"}


def _runtime_line():
    trainer, samples, _ = tiny_trainer(kl_loss_coef=1e-3)
    return trainer.train_step(samples)


def _slime_logged_names():
    args = loss_args("epic", use_kl_loss=True, kl_loss_coef=1e-3)
    _, log_probs, batch, reducer = slime_inputs(full_data(), 0, 1, args)
    _, metrics = slime_policy_loss_from_log_probs(args, batch, log_probs, None, reducer)
    return {names.SLIME_LOG_PREFIX + key for key in metrics}  # slime's own prefix for loss-function metrics


def test_both_paths_log_the_same_loss_names():
    runtime = set(_runtime_line())
    slime = _slime_logged_names()
    for name in (names.TRAIN_LOSS, names.PG_LOSS, names.KL_LOSS, names.CLIPFRAC):
        assert name in runtime and name in slime, name

    def policy(keys):
        return {k[len(names.POLICY_PREFIX) :] for k in keys if k.startswith(names.POLICY_PREFIX)}

    assert len(policy(runtime) & policy(slime)) >= 20  # clipfrac_*, ratio_*, abs_z_mean, bounds, ...
    assert policy(runtime) - policy(slime) == RUNTIME_ONLY
    assert policy(slime) - policy(runtime) == SLIME_ONLY
    assert not any(k.startswith("loss/") for k in runtime)  # no runtime-only spelling left
    assert names.GRAD_NORM in runtime  # slime logs train/grad_norm itself


def test_staleness_and_rollout_names_agree():
    gate = StalenessGate(max_staleness=2, stale_policy="drop")
    gate.admit(1, 8)
    slime = set(gate.metrics(prefix=names.STALENESS_PREFIX))
    assert {names.STALENESS_MEAN, names.STALENESS_MAX} <= slime  # what the runtime's driver logs
    assert names.REWARD_MEAN == "rollout/raw_reward"


def test_docs_document_the_list():
    with open(os.path.join(REPO_ROOT, "docs", "metrics.md")) as handle:
        text = handle.read()
    section = text.split("<!-- metric-names -->", 2)[1]
    documented = re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)
    assert documented == list(names.SHARED_METRICS)


def test_tensorboard_gets_the_numeric_values(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from epic_slime.runtime.tensorboard_log import log_scalars, open_tensorboard

    assert open_tensorboard(False, "", str(tmp_path)) is None
    writer = open_tensorboard(True, "", str(tmp_path))
    line = {
        "step": 3,
        names.CLIPFRAC: 0.25,
        names.REWARD_MEAN: 0.5,
        "train/version": 3,
        "note": "text",
        "flag": True,
        "bad": math.nan,
    }
    assert log_scalars(writer, line, 3) == 3
    writer.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == sorted([names.CLIPFRAC, names.REWARD_MEAN, "train/version"])
    (point,) = events.Scalars(names.CLIPFRAC)
    assert (point.step, point.value) == (3, 0.25)
