"""``--use-tis`` on the slime path: truncated importance sampling composed with the project's loss.

slime 624b824a applies TIS only inside its built-in ``policy_loss_function`` (``vanilla_tis_function``
or ``--custom-tis-function-path``); ``--loss-type custom_loss`` replaces that function, so slime
itself applies no TIS to the project's loss and the correction here is the only one. As in the
embedded runtime (``epic_slime.runtime.trainer``), the loss's ratio is to pi_old (slime's recomputed
``log_probs``, which ``--use-tis`` makes the ratio base, see ``flags.resolve_behavior_logprobs``)
and each local token's per-token loss is multiplied by ``epic_slime.losses.tis.tis_weights``
(pi_old / mu from ``rollout_log_probs``, truncated to [--tis-clip-low, --tis-clip]).

What does not compose is refused: the Top-K modes (their behaviour set is SGLang's top-k, which TIS
would replace by pi_old) and ``--use-rollout-logprobs`` (slime then skips the recompute: pi_old is
mu and every weight is 1; slime asserts the same). Slime-free (CI tests it without slime).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from epic_slime.slime.cli.flags import ProjectFlagError


@dataclasses.dataclass(frozen=True)
class TisSettings:
    clip: float  # --tis-clip: upper truncation C of the weight
    clip_low: float  # --tis-clip-low: lower truncation (slime's default 0: none)


def tis_settings_from_args(args: Any, mode: str) -> TisSettings | None:
    """The run's TIS settings (None without ``--use-tis``); raises ProjectFlagError for what does
    not compose with the project's loss."""
    if not getattr(args, "use_tis", False):
        return None
    from epic_slime.losses import LOSS_MODES
    from epic_slime.losses.tis import check_tis_clips

    if mode in LOSS_MODES and LOSS_MODES[mode].needs_topk:
        raise ProjectFlagError(
            f"--use-tis with --policy-loss {mode}: the Top-K modes compare pi with SGLang's top-k set of mu, "
            "which TIS would replace by pi_old (not supported); drop --use-tis or pick a non-Top-K mode"
        )
    if getattr(args, "use_rollout_logprobs", False):
        raise ProjectFlagError(
            "--use-tis with --use-rollout-logprobs: slime then skips the log-prob recompute, so pi_old would be "
            "mu and every TIS weight 1; drop --use-rollout-logprobs"
        )
    clip, clip_low = getattr(args, "tis_clip", 2.0), getattr(args, "tis_clip_low", 0.0)
    try:
        check_tis_clips(clip, clip_low)
    except ValueError as exc:
        raise ProjectFlagError(str(exc)) from exc
    return TisSettings(float(clip), float(clip_low))


def local_valid(loss_masks: Sequence[torch.Tensor], positions: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per sample, the loss mask at this rank's local tokens (bool)."""
    return [m.bool()[p.to(m.device)] for m, p in zip(loss_masks, positions)]


def tis_ratio_base(
    batch: dict,
    old_log_probs: Sequence[torch.Tensor],
    loss_masks: Sequence[torch.Tensor],
    positions: Sequence[torch.Tensor],
    on_bad_tokens: str,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(pi_old for the core, mu) per sample at the local tokens.

    A valid token whose rollout log-prob is no log-prob (the core's rule,
    ``epic_slime.losses.inputs.bad_log_probs``) raises, naming it, under ``--on-bad-tokens raise``;
    under ``skip`` its pi_old is set to NaN, so that the core masks it out of the loss and counts it
    in ``bad_tokens`` (within ``--max-bad-token-frac``) like any other bad token."""
    from epic_slime.losses.inputs import bad_log_probs

    rollout = batch.get("rollout_log_probs")
    if not rollout:
        raise ValueError(
            "--use-tis: the batch has no rollout_log_probs (SGLang log-probs of the sampled tokens), which "
            "the TIS weights pi_old / mu need; use a generate function that records Sample.rollout_log_probs"
        )
    old_out, mu_out = [], []
    for i, (old, mu, valid) in enumerate(zip(old_log_probs, rollout, local_valid(loss_masks, positions))):
        mu = torch.as_tensor(mu).to(old.device)
        if mu.shape != old.shape:
            raise ValueError(
                f"batch['rollout_log_probs'][{i}] has shape {tuple(mu.shape)}, expected {tuple(old.shape)}"
            )
        bad = bad_log_probs(mu, valid.to(old.device))
        if bool(bad.any()):
            if on_bad_tokens != "skip":
                t = int(torch.nonzero(bad)[0])
                raise ValueError(
                    f"rollout_log_probs[{i}] has a bad value {float(mu[t])} on valid local token {t} "
                    "(--use-tis weights each token by pi_old / mu)"
                )
            old = torch.where(bad, torch.nan, old)
        old_out.append(old)
        mu_out.append(mu)
    return old_out, mu_out


def local_tis_weights(
    settings: TisSettings,
    old_log_probs: Sequence[torch.Tensor],
    rollout_log_probs: Sequence[torch.Tensor],
    loss_masks: Sequence[torch.Tensor],
    positions: Sequence[torch.Tensor],
    bad: Sequence[torch.Tensor] | None,
) -> list[torch.Tensor]:
    """Per sample, the TIS weights at the local tokens (0 off the mask and at skipped bad tokens)."""
    from epic_slime.losses.tis import tis_weights

    valid = local_valid(loss_masks, positions)
    if bad is not None:
        valid = [v.to(b.device) & ~b.bool() for v, b in zip(valid, bad)]
    return [
        tis_weights(old, mu, v.to(old.device), settings.clip, settings.clip_low)
        for old, mu, v in zip(old_log_probs, rollout_log_probs, valid)
    ]
