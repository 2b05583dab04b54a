"""The loss core inside other RL frameworks: thin adapters onto `epic_slime.losses.compute_policy_loss`.

    epic_slime.integrations.verl   registers the project's modes in verl's policy-loss registry
    epic_slime.integrations.trl    EpicGRPOTrainer, TRL's GRPOTrainer training with a project mode

Each adapter imports its framework when it is imported itself, never before: this package imports no
framework, and `epic_slime` never imports this package. The math stays in `epic_slime/losses/`; an
adapter only maps the framework's batch and settings onto `compute_policy_loss` and names the
diagnostics the framework's way (docs/integrations.md).
"""

from __future__ import annotations

import json
import os

from epic_slime.losses import LOSS_MODES, PolicyLossInputError

# A mode's parameters for a run whose framework config has no field for them (verl's dataclass
# configs refuse unknown keys): a JSON object, e.g. {"delta_high": 0.003}, read at every call.
PARAMS_ENV = "EPIC_SLIME_LOSS_PARAMS"


# Modes verl already registers under the same name: verl's own stay in place, the project's go under
# a prefixed name (registering over them would change a verl user's run just by installing this package).
VERL_OWN_MODES = ("cispo", "dppo_kl", "dppo_tv", "gspo")
VERL_PREFIX = "epic_slime_"


def exported_modes() -> list[str]:
    """The modes an adapter offers: every registered mode except those needing the behaviour policy's
    top-K log-probs, which neither framework's loss call carries."""
    return sorted(mode for mode, spec in LOSS_MODES.items() if not spec.needs_topk)


def verl_loss_name(mode: str) -> str:
    """The name `mode` has in verl's registry (`actor_rollout_ref.actor.policy_loss.loss_mode=<this>`)."""
    return VERL_PREFIX + mode if mode in VERL_OWN_MODES else mode


def params_from_env(environ=None) -> dict:
    """The parameters in EPIC_SLIME_LOSS_PARAMS ({} when unset); a clear error when it is not a JSON object."""
    raw = (os.environ if environ is None else environ).get(PARAMS_ENV, "")
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise PolicyLossInputError(f"{PARAMS_ENV}={raw!r} is not JSON: {err.msg}") from None
    if not isinstance(value, dict):
        raise PolicyLossInputError(f"{PARAMS_ENV}={raw!r} must be a JSON object of a mode's parameters")
    return value
