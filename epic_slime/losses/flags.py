"""Command-line flags for the policy loss, shared by the local runtime and the slime driver.

    parser = argparse.ArgumentParser()
    add_policy_loss_arguments(parser)
    mode, params, aggregation = policy_loss_config_from_args(parser.parse_args())

Flags: ``--policy-loss MODE`` (default epic), ``--policy-loss-aggregation AGG`` (default: the
mode's own), and one flag per mode parameter, ``--{family}-{param}`` (``--epic-delta-low``,
``--grpo-clip-high``, ``--ctpo-power``, ``--dapo-dual-clip``, ...). The EPIC ablations share the
``--epic-*`` flags. A parameter flag of another family than the chosen mode is an error (it would
be silently ignored otherwise).
"""

from __future__ import annotations

import argparse
from typing import Any

from . import LOSS_MODES, AGGREGATIONS, DEFAULT_MODE, PolicyLossInputError, resolve_params
from .inputs import DEFAULT_MAX_BAD_TOKEN_FRAC, ON_BAD_TOKENS


def _dest(prefix: str, param: str) -> str:
    return f"{prefix.replace('-', '_')}_{param}"


def _flag(prefix: str, param: str) -> str:
    return f"--{prefix}-{param.replace('_', '-')}"


def _families() -> dict[str, dict[str, Any]]:
    """flag prefix -> {param: default}; modes of one family must agree on their parameters."""
    families: dict[str, dict[str, Any]] = {}
    for spec in LOSS_MODES.values():
        family = families.setdefault(spec.flag_prefix, {})
        for param, default in spec.defaults.items():
            family.setdefault(param, default)
    return families


def _parse_value(value):
    """A mode parameter from the command line (text) or YAML (int, float, str or null).

    YAML reads `0.001` as a float but `5e-4` as a string, so both must be accepted; numbers pass
    through unchanged, text is read as null, an int, a float or (generator names) kept as text."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise argparse.ArgumentTypeError(f"expected a number, a name or null, got {value!r}")
    if isinstance(value, (int, float)):
        return value
    if not isinstance(value, str):
        raise argparse.ArgumentTypeError(f"expected a number, a name or null, got {value!r}")
    text = value.strip()
    if text.lower() in ("none", "null", "off"):
        return None
    try:
        return int(text) if text.lstrip("+-").isdigit() else float(text)
    except ValueError:
        return text  # string-valued parameters (e.g. a generator name)


def add_policy_loss_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("policy loss (epic_slime.losses)")
    group.add_argument(
        "--policy-loss", default=DEFAULT_MODE, choices=sorted(LOSS_MODES), help="loss mode (default: %(default)s)"
    )
    group.add_argument(
        "--policy-loss-aggregation",
        default=None,
        choices=AGGREGATIONS,
        help="loss aggregation (default: the mode's own)",
    )
    for prefix, params in _families().items():
        for param, default in params.items():
            group.add_argument(
                _flag(prefix, param),
                dest=_dest(prefix, param),
                default=None,
                type=_parse_value,
                metavar="V",
                help=f"{prefix} {param} (default {default})",
            )
    return parser


def policy_loss_config_from_args(args: argparse.Namespace) -> tuple[str, dict, str]:
    """(mode, params, aggregation) from parsed args, validated; params hold only what was set."""
    mode = getattr(args, "policy_loss", DEFAULT_MODE)
    if mode not in LOSS_MODES:
        raise PolicyLossInputError(f"--policy-loss={mode!r} is not one of {sorted(LOSS_MODES)}")
    spec = LOSS_MODES[mode]
    params: dict[str, Any] = {}
    for prefix, family_params in _families().items():
        for param in family_params:
            value = getattr(args, _dest(prefix, param), None)
            if value is None:
                continue
            if prefix != spec.flag_prefix:
                raise PolicyLossInputError(
                    f"{_flag(prefix, param)}={value} applies to the {prefix!r} modes, "
                    f"but --policy-loss is {mode!r} (its flags are --{spec.flag_prefix}-*)"
                )
            params[param] = value
    resolve_params(mode, params)  # raises with the mode, parameter and value on a bad value
    aggregation = getattr(args, "policy_loss_aggregation", None) or spec.aggregation
    return mode, params, aggregation


def bad_token_fraction(text) -> float:
    """--max-bad-token-frac: a number in [0, 1]."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def add_bad_token_arguments(parser: argparse.ArgumentParser, default: str = "skip") -> argparse.ArgumentParser:
    """--on-bad-tokens {raise,skip} and --max-bad-token-frac (the core's on_bad_tokens keywords)."""
    group = parser.add_argument_group("bad tokens (epic_slime.losses)")
    group.add_argument(
        "--on-bad-tokens",
        default=default,
        choices=ON_BAD_TOKENS,
        help="a NaN/inf log-prob or advantage, or a log-prob > 1e-3, on a valid token: raise, or "
        "skip (mask it out of the loss, count it) (default: %(default)s)",
    )
    group.add_argument(
        "--max-bad-token-frac",
        default=DEFAULT_MAX_BAD_TOKEN_FRAC,
        type=bad_token_fraction,
        help="with --on-bad-tokens skip: abort when more than this share of a loss call's "
        "valid tokens are bad (default: %(default)s)",
    )
    return parser


def bad_token_config_from_args(args: argparse.Namespace) -> dict:
    """The core's keywords; args without the flags (older callers) keep the core's default, raise."""
    frac = getattr(args, "max_bad_token_frac", None)
    return {
        "on_bad_tokens": getattr(args, "on_bad_tokens", None) or "raise",
        "max_bad_token_frac": DEFAULT_MAX_BAD_TOKEN_FRAC if frac is None else frac,
    }
