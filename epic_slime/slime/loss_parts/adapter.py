"""The slime loss adapter's arithmetic, free of slime imports (so CI can test it).

Input is what slime hands a custom loss, after log-probs are computed: per-sample 1-D tensors
holding this CP rank's local response tokens (``log_probs``, ``rollout_log_probs``,
``log_probs`` recompute, ``advantages``, ``ref_log_probs``, ``entropy``), full-length
``loss_masks``, and slime's reducer ``sum_of_sample_mean``. ``epic_slime.slime.loss`` adds the
slime calls (log-probs from logits, the CP group) around it.

Per micro-batch:
  1. gather the detached local log pi, log mu and advantages to full responses (one
     collective; ``cp.py``), put the live local log pi back at the local positions;
  2. run the core ``compute_policy_loss`` on the padded full responses;
  3. keep ``per_token_loss`` at the local positions and reduce it with slime's reducer.
The core's per-token loss has gradient only through each token's own log pi (straight-through,
every mode), so the local slices of all CP ranks add up to the CP = 1 loss and gradient.
Top-K modes add pi's detached log-probs of each position's set to the same gathered rows; log mu
of the set is the batch's full-response ``rollout_topk_log_probs`` plus the sampled token's log mu.

Aggregation onto slime's reducer (slime rescales by num_microbatches / step global batch):
  - seq-mean-token-mean: ``sum_of_sample_mean`` as is (per-sample denominators are the
    full-response mask sums, or slime's ``rollout_mask_sums``);
  - token-mean (dapo, ripo): slime's per-token mode (``--calculate-per-token-loss``, set by the
    driver), where the reducer is a token sum and slime divides by the step's token count;
  - seq-mean-token-sum: each sample's tokens are multiplied by its denominator before
    ``sum_of_sample_mean``, which turns its per-sample mean into a per-sample sum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from epic_slime.metric_names import POLICY_PREFIX, SLIME_LOG_PREFIX
from epic_slime.slime.loss_parts.cp import (
    Gather,
    gather_full_responses,
    with_live_local_entries,
    zigzag_response_positions,
)
from epic_slime.slime.cli.flags import TOKEN_MEAN, resolve_behavior_logprobs
from epic_slime.slime.loss_parts.tis import (
    TisSettings,
    local_tis_weights,
    local_valid,
    tis_ratio_base,
    tis_settings_from_args,
)

Reducer = Callable[[torch.Tensor], torch.Tensor]
# slime logs a loss metric "x" as "train/x": "policy/x" becomes the shared name train/policy/x
METRIC_PREFIX = POLICY_PREFIX.removeprefix(SLIME_LOG_PREFIX)
_COUNT_METRICS = ("valid_tokens",)


@dataclasses.dataclass
class TopKLocalInputs:
    """The Top-K modes' extra inputs of one micro-batch (see ``epic_slime.slime.loss_parts.topk``)."""

    current_log_probs: list[torch.Tensor]  # per sample [n_local, K]: log pi of the set at the local tokens
    behavior_topk_log_probs: list[torch.Tensor]  # per sample [T, K - 1]: rollout top-k log mu, full response
    set_masks: list[torch.Tensor]  # per sample [T, K] bool: the set's mask, full response


@dataclasses.dataclass
class LocalPolicyLoss:
    per_token_loss: list[torch.Tensor]  # per sample, this rank's local tokens (differentiable)
    clipped: list[torch.Tensor]  # per sample, this rank's local tokens: clipped by the mode's rule
    metrics: dict[str, Any]  # the core's batch-level diagnostics over the full responses
    full_outputs: Any  # the core's PolicyLossOutput
    bad: list[torch.Tensor] | None = None  # per sample, local tokens skipped as bad (on_bad_tokens="skip")


def _check_lengths(name: str, tensors: Sequence[torch.Tensor], lengths: Sequence[int]) -> None:
    if len(tensors) != len(lengths):
        raise ValueError(f"batch[{name!r}] has {len(tensors)} samples, expected {len(lengths)}")
    for i, (t, n) in enumerate(zip(tensors, lengths)):
        if t.dim() != 1 or t.numel() != n:
            raise ValueError(f"batch[{name!r}][{i}] has shape {tuple(t.shape)}, expected ({n},) local tokens")


def local_policy_loss(
    mode: str,
    params: dict[str, Any],
    aggregation: str,
    log_probs: Sequence[torch.Tensor],
    behavior_log_probs: Sequence[torch.Tensor],
    advantages: Sequence[torch.Tensor],
    loss_masks: Sequence[torch.Tensor],
    positions: Sequence[torch.Tensor],
    gather: Gather | None,
    topk: TopKLocalInputs | None = None,
    bad_tokens: dict[str, Any] | None = None,
) -> LocalPolicyLoss:
    """The core's per-token loss at this rank's local tokens, computed on full responses.

    ``topk`` (Top-K modes): the set log-probs of pi at the local tokens travel in the same
    detached gather as log pi, log mu and the advantages; log mu of the set is the rollout top-k
    log-probs plus the gathered log mu of the sampled token. ``bad_tokens``: the core's
    ``on_bad_tokens`` / ``max_bad_token_frac`` keywords (``LocalPolicyLoss.bad`` marks the skipped
    local tokens)."""
    from epic_slime.losses import compute_policy_loss

    local_counts = [int(p.numel()) for p in positions]
    _check_lengths("log_probs", log_probs, local_counts)
    _check_lengths("behavior_log_probs", behavior_log_probs, local_counts)
    _check_lengths("advantages", advantages, local_counts)
    response_lengths = [int(m.numel()) for m in loss_masks]
    if not log_probs:
        raise ValueError("empty micro-batch: no samples")

    dtype, device = log_probs[0].dtype, log_probs[0].device
    local_rows = [
        torch.stack([lp.detach(), mu.to(device, dtype), adv.to(device, dtype)], dim=1)
        for lp, mu, adv in zip(log_probs, behavior_log_probs, advantages)
    ]
    topk_kwargs = {}
    if topk is not None:
        from epic_slime.slime.loss_parts.topk import check_topk_local_inputs

        check_topk_local_inputs(topk, local_counts, response_lengths)
        local_rows = [
            torch.cat([rows, current.detach().to(device, dtype)], dim=1)
            for rows, current in zip(local_rows, topk.current_log_probs)
        ]
    full_rows = gather_full_responses(local_rows, positions, response_lengths, gather)
    if topk is not None:
        from epic_slime.slime.loss_parts.topk import behavior_set_log_probs

        set_masks = [m.to(device) for m in topk.set_masks]
        topk_kwargs = dict(
            behavior_topk_log_probs=pad_sequence(
                [
                    behavior_set_log_probs(lps.to(device, dtype), rows[:, 1], m)
                    for lps, rows, m in zip(topk.behavior_topk_log_probs, full_rows, set_masks)
                ],
                batch_first=True,
            ),
            current_topk_log_probs=pad_sequence([rows[:, 3:] for rows in full_rows], batch_first=True),
            topk_mask=pad_sequence(set_masks, batch_first=True),
        )
    full_log_probs = [
        with_live_local_entries(rows[:, 0], pos.to(device), lp)
        for rows, pos, lp in zip(full_rows, positions, log_probs)
    ]
    padded_log_probs = pad_sequence(full_log_probs, batch_first=True)
    padded_behavior = pad_sequence([rows[:, 1] for rows in full_rows], batch_first=True)
    padded_advantages = pad_sequence([rows[:, 2] for rows in full_rows], batch_first=True)
    padded_mask = pad_sequence([m.to(device).bool() for m in loss_masks], batch_first=True)

    out = compute_policy_loss(
        mode,
        padded_log_probs,
        padded_behavior,
        padded_advantages,
        padded_mask,
        aggregation=aggregation,
        **topk_kwargs,
        **(bad_tokens or {}),
        **params,
    )
    per_token_loss = [
        out.per_token_loss[i, :n].index_select(0, pos.to(device))
        for i, (n, pos) in enumerate(zip(response_lengths, positions))
    ]
    clipped = [
        out.clipped[i, :n].index_select(0, pos.to(device))
        for i, (n, pos) in enumerate(zip(response_lengths, positions))
    ]
    bad = None
    if out.bad is not None:
        bad = [
            out.bad[i, :n].index_select(0, pos.to(device))
            for i, (n, pos) in enumerate(zip(response_lengths, positions))
        ]
    return LocalPolicyLoss(per_token_loss, clipped, dict(out.metrics), out, bad)


def approx_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kl_type: str) -> torch.Tensor:
    """slime's ``--kl-loss-type`` estimators of KL(pi || ref): the core's `kl_penalty`."""
    from epic_slime.losses.kl import KL_KINDS, kl_penalty

    if kl_type not in KL_KINDS:
        raise ValueError(f"--kl-loss-type {kl_type!r} is not one of k1, k2, k3, low_var_kl")
    return kl_penalty(log_probs, ref_log_probs, kl_type)


def _cat(tensors: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    return torch.cat(list(tensors), dim=0) if tensors else like.new_zeros(0)


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """What the loss hook reads from the run's flags, resolved and validated once per process."""

    mode: str
    params: dict[str, Any]  # the mode's parameters as set on the command line (the core fills defaults)
    aggregation: str
    behavior: str  # --behavior-logprobs, resolved (``flags.resolve_behavior_logprobs``)
    bad_tokens: dict[str, Any]  # the core's on_bad_tokens / max_bad_token_frac keywords
    tis: TisSettings | None = None  # --use-tis (``epic_slime.slime.loss_parts.tis``)


# (args, its settings): slime hands every micro-batch of a run the same args object, which does not
# change after parsing, so the flags are resolved once per process instead of once per micro-batch.
_resolved: tuple[Any, LossSettings] | None = None


def loss_settings(args: Any) -> LossSettings:
    """The loss settings of ``args``, resolved on the first call with this args object."""
    global _resolved
    if _resolved is not None and _resolved[0] is args:
        return _resolved[1]
    from epic_slime.losses.flags import bad_token_config_from_args, policy_loss_config_from_args

    mode, params, aggregation = policy_loss_config_from_args(args)
    behavior = resolve_behavior_logprobs(args)
    settings = LossSettings(
        mode, dict(params), aggregation, behavior, bad_token_config_from_args(args), tis_settings_from_args(args, mode)
    )
    _resolved = (args, settings)
    return settings


def needs_topk(mode: str) -> bool:
    from epic_slime.losses import LOSS_MODES

    return bool(LOSS_MODES[mode].needs_topk)


def behavior_log_probs_from_batch(batch: dict, behavior: str) -> list[torch.Tensor]:
    if behavior == "rollout":
        values = batch.get("rollout_log_probs")
        if not values:
            raise ValueError(
                "--behavior-logprobs rollout: the batch has no rollout_log_probs (SGLang log-probs of the "
                "sampled tokens); use a generate function that records Sample.rollout_log_probs, or set "
                "--behavior-logprobs recompute to use the trainer's recomputed log_probs"
            )
        return list(values)
    values = batch.get("log_probs")
    if not values:
        raise ValueError(
            "--behavior-logprobs recompute: the batch has no recomputed log_probs; slime skips the "
            "recompute under --use-rollout-logprobs, so drop that flag (or set --behavior-logprobs rollout)"
        )
    return list(values)


def slime_policy_loss_from_log_probs(
    args: Any,
    batch: dict,
    log_probs: Sequence[torch.Tensor],
    entropy: Sequence[torch.Tensor] | None,
    sum_of_sample_mean: Reducer,
    cp_rank: int = 0,
    cp_size: int = 1,
    gather: Gather | None = None,
    current_topk_log_probs: Sequence[torch.Tensor] | None = None,
    topk_sets: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """slime's custom-loss contract after log-probs: (scalar loss, detached metrics).

    Top-K modes also take ``current_topk_log_probs`` (per sample ``[n_local, k + 1]``: log pi of
    the set ids at this rank's tokens) and ``topk_sets`` (``epic_slime.slime.loss_parts.topk.topk_token_sets``
    of the batch, computed here when not given); the rollout top-k log-probs come from
    ``batch['rollout_topk_log_probs']``.
    """
    settings = loss_settings(args)
    mode, params, aggregation, behavior = settings.mode, settings.params, settings.aggregation, settings.behavior
    per_token_mode = bool(getattr(args, "calculate_per_token_loss", False))
    if (aggregation == TOKEN_MEAN) != per_token_mode:
        raise ValueError(
            f"aggregation {aggregation!r} with calculate_per_token_loss={per_token_mode}: token-mean needs "
            "--calculate-per-token-loss and the other aggregations need it off (the driver sets it)"
        )
    total_lengths = list(batch["total_lengths"])
    response_lengths = list(batch["response_lengths"])
    loss_masks = list(batch["loss_masks"])
    positions = [
        zigzag_response_positions(total, resp, cp_rank, cp_size) for total, resp in zip(total_lengths, response_lengths)
    ]
    behavior_lp = behavior_log_probs_from_batch(batch, behavior)
    if settings.tis is not None:  # the ratio is to pi_old (the recompute); mu only weights the tokens
        behavior_lp, tis_mu = tis_ratio_base(
            batch, behavior_lp, loss_masks, positions, settings.bad_tokens.get("on_bad_tokens", "raise")
        )
    topk = None
    if needs_topk(mode):
        from epic_slime.slime.loss_parts.topk import TOPK_LOG_PROBS_KEY, topk_token_sets

        if behavior != "rollout":
            raise ValueError(
                f"--policy-loss {mode} needs --behavior-logprobs rollout (the top-k log-probs are SGLang's)"
            )
        _, set_masks = topk_sets if topk_sets is not None else topk_token_sets(batch, response_lengths)
        if current_topk_log_probs is None:
            raise ValueError(
                f"--policy-loss {mode}: current_topk_log_probs (log pi of the Top-K set ids at the local tokens) "
                "is missing; epic_slime.slime.loss.policy_loss computes it from the logits"
            )
        topk = TopKLocalInputs(
            list(current_topk_log_probs),
            [torch.as_tensor(x) for x in batch[TOPK_LOG_PROBS_KEY]],
            list(set_masks),
        )
    result = local_policy_loss(
        mode,
        params,
        aggregation,
        log_probs,
        behavior_lp,
        list(batch["advantages"]),
        loss_masks,
        positions,
        gather if cp_size > 1 else None,
        topk,
        settings.bad_tokens,
    )

    lp = _cat(log_probs, log_probs[0])
    mu = _cat(behavior_lp, lp).to(lp)
    # Only loss-mask tokens reach the KL, the entropy and the diagnostics: slime's reducer multiplies by
    # the mask, and 0 * inf is NaN (a tool token's placeholder or a skipped bad token would leak).
    keep = _cat(local_valid(loss_masks, positions), lp).to(lp.device)
    if result.bad is not None:
        keep = keep & ~_cat(result.bad, lp).bool()
    lp = torch.where(keep, lp, 0.0)
    mu = torch.where(keep, mu, 0.0)
    pg_tokens = _cat(result.per_token_loss, lp)
    if settings.tis is not None:
        tis_w = _cat(local_tis_weights(settings.tis, behavior_lp, tis_mu, loss_masks, positions, result.bad), lp).to(lp)
        pg_tokens = pg_tokens * tis_w
    if aggregation == "seq-mean-token-sum":
        sums = batch.get("rollout_mask_sums")
        denoms = [
            torch.clamp_min(
                torch.as_tensor(sums[i] if sums is not None else m.sum(), dtype=lp.dtype, device=lp.device), 1
            )
            for i, m in enumerate(loss_masks)
        ]
        pg_tokens = pg_tokens * torch.cat([d.expand(p.numel()) for d, p in zip(denoms, positions)])
    pg_loss = sum_of_sample_mean(pg_tokens)
    loss = pg_loss

    metrics: dict[str, torch.Tensor] = {}
    ppo_kl = sum_of_sample_mean(mu - lp.detach())
    if entropy is not None and len(entropy):
        entropy_loss = sum_of_sample_mean(torch.where(keep, _cat(entropy, lp), 0.0))
        loss = loss - args.entropy_coef * entropy_loss
    else:
        entropy_loss = lp.new_zeros(())
    if getattr(args, "use_kl_loss", False):
        ref = batch.get("ref_log_probs")
        if not ref:
            raise ValueError("--use-kl-loss: the batch has no ref_log_probs (pass --ref-load)")
        ref_lp = torch.where(keep, _cat(ref, lp), 0.0)
        kl = approx_kl(lp, ref_lp, args.kl_loss_type)
        if getattr(args, "use_unbiased_kl", False):
            old = (
                batch.get("rollout_log_probs")
                if getattr(args, "use_rollout_logprobs", False)
                else batch.get("log_probs")
            )
            old = torch.where(keep, _cat(old, lp), 0.0) if old else lp.detach()
            kl = torch.exp(lp - old) * kl
        kl_loss = sum_of_sample_mean(kl)
        loss = loss + args.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss

    # pg_clipfrac is exact: the core's per-token clip indicator, reduced like every slime metric.
    clipfrac = sum_of_sample_mean(_cat(result.clipped, lp).to(lp.dtype))
    # The core's other diagnostics are micro-batch values over full responses (identical on every
    # CP rank). slime sums a metric over micro-batches and DP x CP ranks, then divides by the
    # step's sample count (token count in per-token mode), so each is weighted by this
    # micro-batch's share: the logged value is the sample- (token-) weighted mean of micro-batch
    # values. Counts become fractions of samples; the token count is dropped (slime logs lengths).
    n_samples = len(loss_masks)
    if per_token_mode:
        weight = sum(float(torch.clamp_min(m.sum(), 1)) for m in loss_masks) / cp_size
    else:
        weight = n_samples / cp_size
    core_metrics = {}
    for name, value in result.metrics.items():
        if name in _COUNT_METRICS or not _is_scalar(value):
            continue
        value = torch.as_tensor(value, dtype=torch.float32, device=lp.device).detach()
        if name == "empty_responses":
            name, value = "empty_response_frac", value / max(n_samples, 1)
        if name == "bad_tokens":  # a count is not a sample-weighted mean: log the share of valid tokens
            checked = float(result.metrics.get("valid_tokens", 0)) + float(value)
            name, value = "bad_token_frac", value / max(checked, 1.0)
        core_metrics[f"{METRIC_PREFIX}{name}"] = value * weight

    reported = {
        "loss": loss,
        "pg_loss": pg_loss,
        "entropy_loss": entropy_loss,
        "pg_clipfrac": clipfrac,
        "ppo_kl": ppo_kl,
        **metrics,
    }
    rollout = batch.get("rollout_log_probs")
    if rollout:
        recomputed = batch.get("log_probs")
        compare = lp if (getattr(args, "use_rollout_logprobs", False) or not recomputed) else _cat(recomputed, lp)
        gap = (compare.detach() - _cat(rollout, lp)).abs()
        reported["train_rollout_logprob_abs_diff"] = sum_of_sample_mean(torch.where(keep, gap, 0.0))
    if settings.tis is not None:  # sample means of the weight and of the tokens truncated at --tis-clip
        reported["tis_weight_mean"] = sum_of_sample_mean(tis_w)
        reported["tis_truncated_frac"] = sum_of_sample_mean((tis_w >= settings.tis.clip).to(lp.dtype))
    reported.update(core_metrics)
    return loss, {k: v.detach().clone().float() for k, v in reported.items()}


def _is_scalar(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return isinstance(value, (int, float)) and not isinstance(value, bool)
