"""One list of metric names for the embedded runtime and the slime path, so that a laptop run and a
cluster run show the same names in metrics.jsonl, W&B and TensorBoard.

The names are slime's: slime logs every metric its loss function returns as ``train/<name>``, its
rollout data as ``rollout/<name>``, and cannot be renamed from outside. Both paths write these
names where they make a metric: ``epic_slime.slime.loss_parts.adapter`` builds ``train/policy/<core name>``
from ``POLICY_PREFIX``, ``epic_slime.slime.rollout`` uses ``STALENESS_PREFIX``, and the runtime's
trainer and driver use the constants below.

This table is the documentation (docs/metrics.md's table is checked against it).
"""

from __future__ import annotations

SLIME_LOG_PREFIX = "train/"  # what slime puts in front of every loss-function metric
POLICY_PREFIX = "train/policy/"  # + a core diagnostic name: train/policy/clipfrac, ...
STALENESS_PREFIX = "rollout/staleness/"  # + mean, max, ...

TRAIN_LOSS = "train/loss"
PG_LOSS = "train/pg_loss"
KL_LOSS = "train/kl_loss"
GRAD_NORM = "train/grad_norm"
CLIPFRAC = POLICY_PREFIX + "clipfrac"
REWARD_MEAN = "rollout/raw_reward"
RESPONSE_LENGTH_MEAN = "rollout/response_lengths"
TRUNCATED_FRAC = "rollout/truncated"
STALENESS_MEAN = STALENESS_PREFIX + "mean"
STALENESS_MAX = STALENESS_PREFIX + "max"
# the runtime's step counts (slime cannot log a summed count; it logs bad_token_frac)
BAD_TOKENS = POLICY_PREFIX + "bad_tokens"
SKIPPED_STEPS = POLICY_PREFIX + "skipped_steps"

# name (or prefix, ending in "/") -> meaning; logged by both paths
SHARED_METRICS: dict[str, str] = {
    TRAIN_LOSS: "loss that is back-propagated (policy loss + KL term)",
    PG_LOSS: "policy loss of the chosen mode",
    KL_LOSS: "KL loss to the reference model (when --use-kl-loss)",
    GRAD_NORM: "gradient norm before clipping",
    POLICY_PREFIX: "the loss core's diagnostics: clipfrac, clipfrac_upper, ratio_mean, abs_z_mean, ...",
    REWARD_MEAN: "mean reward of the rollout batch",
    RESPONSE_LENGTH_MEAN: "mean response length, tokens",
    TRUNCATED_FRAC: "fraction of responses cut at the maximum length",
    STALENESS_PREFIX: "staleness of the trained groups (mean, max, ...) and drop counters",
}


def policy_metric(core_name: str) -> str:
    """The logged name of a loss-core diagnostic (``clipfrac`` -> ``train/policy/clipfrac``)."""
    return POLICY_PREFIX + core_name
