"""Configuration of the embedded runtime: defaults < YAML (`--config`) < command-line flags.

Flag names are the slime driver's where the meaning is the same (`--update-depth`,
`--max-staleness`, `--rollout-batch-size`, `--policy-loss` and the per-mode loss flags from
`epic_slime.losses.flags`, ...). YAML keys are the flag names with underscores. Unknown YAML keys,
wrong types and out-of-range values are errors that name the field and the value.

The config in four parts, by job: config_rules.py (value rules, the `Option` record), config_fields.py
(`RuntimeConfig`: every option with its help text and rule), config_parser.py (the parser built from
it, YAML loading), config_checks.py (the checks). This module puts them together: `parse_config`.
"""

from __future__ import annotations

import argparse

from .config_checks import validate
from .config_fields import FIELDS, RuntimeConfig
from .config_parser import OneLineErrorParser, attach_negative_values, build_parser, explicit_args, load_yaml
from .config_rules import ConfigError, Option, Rule

__all__ = [
    "FIELDS",
    "ConfigError",
    "OneLineErrorParser",
    "Option",
    "Rule",
    "RuntimeConfig",
    "build_parser",
    "load_yaml",
    "parse_config",
]


def parse_config(argv: list[str], prog: str = "epic-slime train", quick: bool = False) -> RuntimeConfig:
    """argv -> validated RuntimeConfig (argparse exits on malformed flags; ConfigError on bad values).

    quick: a first pass without torch (`loss_flags.py`): every check but the loss parameters' values;
    the config it returns is for refusing, not for running."""
    if quick:
        from .loss_flags import stored_table

        parser = build_parser(prog, stored_table())
    else:
        parser = build_parser(prog)
    argv = attach_negative_values(parser, list(argv))
    parser.parse_args(argv)  # --help, malformed flags: one-line messages and exit 2
    defaults = vars(parser.parse_args([]))
    explicit = explicit_args(parser, argv)
    from_yaml = load_yaml(explicit["config"], parser) if explicit.get("config") else {}
    merged = {**defaults, **from_yaml, **explicit}
    merged.pop("config", None)
    values = {k: merged[k] for k in FIELDS}
    loss_args = {k: v for k, v in merged.items() if k not in FIELDS}
    if quick:
        from .loss_flags import check_mode_flags, stored_table

        mode, params, aggregation = loss_args["policy_loss"], {}, loss_args.get("policy_loss_aggregation")
        try:
            check_mode_flags(mode, loss_args, stored_table())
        except ValueError as e:
            raise ConfigError(f"policy loss: {e}") from None
    else:
        from epic_slime.losses.flags import policy_loss_config_from_args

        try:
            mode, params, aggregation = policy_loss_config_from_args(argparse.Namespace(**loss_args))
        except (ValueError, KeyError) as e:
            raise ConfigError(f"policy loss: {e}") from None
    cfg = RuntimeConfig(
        policy_loss=mode,
        policy_loss_params=dict(params),
        loss_args=loss_args,
        policy_loss_aggregation=aggregation,
        **values,
    )
    validate(cfg)
    return cfg
