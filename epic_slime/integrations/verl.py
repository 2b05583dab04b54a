"""The project's loss modes in verl's policy-loss registry (tested with verl 0.9.1).

Importing this module registers them, so any of verl's three ways of importing an outside module in
its workers works (docs/integrations.md): the `verl.plugins` entry point this package declares (verl
loads it on `import verl`), `actor_rollout_ref.model.external_lib=epic_slime.integrations.verl`, or
`VERL_USE_EXTERNAL_MODULES=epic_slime.integrations.verl`. Then one setting picks the loss:
`actor_rollout_ref.actor.policy_loss.loss_mode=epic`.

What verl passes, and where it goes:
- `old_log_prob` is the behaviour policy mu of `compute_policy_loss`; `log_prob` the current policy.
- `loss_agg_mode` is mapped onto the project's aggregation of the same name (VERL_AGGREGATIONS); verl's
  own `agg_loss` then reduces the core's per-token loss, with `config.global_batch_info`, so that
  data-parallel scaling stays verl's. The two that have no counterpart are refused.
- `rollout_is_weights` (verl's rollout correction) multiplies the per-token loss, as in verl's own losses.
- The diagnostics come back under verl's names (`actor/pg_clipfrac`, ...) and `actor/policy/<name>`.
- A mode's parameters are its paper defaults, or EPIC_SLIME_LOSS_PARAMS (a JSON object), or
  `make_policy_loss(mode, **params)` registered under a name of one's own. verl's `clip_ratio*` settings
  are not read: each mode has its own parameters (docs/losses.md).
"""

from __future__ import annotations

import logging

import torch
from verl.trainer.ppo import core_algos

from epic_slime.integrations import exported_modes, params_from_env, verl_loss_name
from epic_slime.losses import PolicyLossInputError, compute_policy_loss, resolve_params
from epic_slime.losses.kl import kl_penalty

log = logging.getLogger(__name__)

# verl's loss_agg_mode -> the project's aggregation (the same definitions; tests/integrations/test_verl.py
# checks verl's agg_loss against the core's on each).
VERL_AGGREGATIONS = {
    "token-mean": "token-mean",
    "seq-mean-token-mean": "seq-mean-token-mean",
    "seq-mean-token-sum": "seq-mean-token-sum",
}
# The core's diagnostics that verl's own losses report under a name of verl's.
VERL_METRIC_NAMES = {"clipfrac": "actor/pg_clipfrac", "clipfrac_lower": "actor/pg_clipfrac_lower"}
POLICY_METRIC_PREFIX = "actor/policy/"

REGISTERED: dict[str, str] = {}  # verl name -> project mode, what register() put in verl's registry
SKIPPED: list[str] = []  # names left alone because something else had registered them


def project_aggregation(loss_agg_mode: str) -> str:
    if loss_agg_mode not in VERL_AGGREGATIONS:
        raise PolicyLossInputError(
            f"actor.loss_agg_mode={loss_agg_mode!r} has no counterpart in epic_slime's aggregations; "
            f"use one of {sorted(VERL_AGGREGATIONS)}"
        )
    return VERL_AGGREGATIONS[loss_agg_mode]


def verl_metrics(
    metrics: dict[str, torch.Tensor], old_log_prob: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """The core's diagnostics under verl's names, plus verl's `actor/ppo_kl` (mean k1 of old vs current)."""
    k1 = torch.where(mask, kl_penalty(old_log_prob.detach(), log_prob.detach(), "k1"), 0.0)
    names = [VERL_METRIC_NAMES.get(name, POLICY_METRIC_PREFIX + name) for name in metrics]
    values = [*metrics.values(), k1.sum() / mask.sum().clamp(min=1)]
    # one device-to-host copy for all of them (verl's own losses call .item() per metric)
    floats = torch.stack([v.detach().to(torch.float64) for v in values]).tolist()
    return dict(zip([*names, "actor/ppo_kl"], floats))


def _global_batch_info(config) -> dict:
    info = None if config is None else getattr(config, "global_batch_info", None)
    return dict(info or {})


def make_policy_loss(mode: str, **params):
    """A function with verl's policy-loss signature computing `mode` with ``params`` (checked now)."""
    resolve_params(mode, params)

    def policy_loss(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config=None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = response_mask.to(torch.bool)
        out = compute_policy_loss(
            mode,
            log_prob,
            old_log_prob,
            advantages,
            mask,
            aggregation=project_aggregation(loss_agg_mode),
            **{**params, **params_from_env()},
        )
        per_token_loss = out.per_token_loss
        if rollout_is_weights is not None:
            per_token_loss = per_token_loss * rollout_is_weights.detach()
        loss = core_algos.agg_loss(
            loss_mat=per_token_loss, loss_mask=mask, loss_agg_mode=loss_agg_mode, **_global_batch_info(config)
        )
        return loss, verl_metrics(out.metrics, old_log_prob, log_prob, mask)

    policy_loss.epic_slime_mode = mode
    policy_loss.__name__ = f"epic_slime_{mode}_policy_loss"
    policy_loss.__doc__ = f"epic_slime's `{mode}` (compute_policy_loss) with verl's policy-loss signature."
    return policy_loss


def register() -> dict[str, str]:
    """Register every exported mode in verl's registry (again on a second call); returns verl name -> mode."""
    for mode in exported_modes():
        name = verl_loss_name(mode)
        present = core_algos.POLICY_LOSS_REGISTRY.get(name)
        if present is not None and getattr(present, "epic_slime_mode", None) is None:
            if name not in SKIPPED:
                SKIPPED.append(name)
                log.warning("verl already registers a policy loss %r; epic_slime's %r is not registered", name, mode)
            continue
        core_algos.register_policy_loss(name)(make_policy_loss(mode))
        REGISTERED[name] = mode
    return dict(REGISTERED)


register()
