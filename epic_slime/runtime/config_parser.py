"""The command line and the YAML file of the runtime config: the parser built from `FIELDS`, and YAML
values read as their flags' types.

Errors are one line: argparse's own messages get the flag's rule and a "did you mean"; a bad YAML
value is a `ConfigError` naming the file, the key and the value.
"""

from __future__ import annotations

import argparse
import difflib
import re
from pathlib import Path
from typing import Any

import yaml

from .config_fields import FIELDS
from .config_rules import ConfigError


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse whose errors are one line: argparse's message, the flag's rule, and a "did you mean"
    for a misspelt flag or choice (argparse prints the whole usage, ~80 lines here, before them)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {self.explain(message)}\n")

    def _action(self, option: str) -> argparse.Action | None:
        return next((a for a in self._actions if option in a.option_strings), None)

    def explain(self, message: str) -> str:
        if message.startswith("unrecognized arguments: "):
            flags = [a.split("=")[0] for a in message.split(": ", 1)[1].split() if a.startswith("--")]
            known = [o for a in self._actions for o in a.option_strings]
            hints = [(f, close[0]) for f in flags if (close := difflib.get_close_matches(f, known, n=1))]
            if len(hints) == 1:
                return message + f"; did you mean {hints[0][1]}?"
            return message + ("; did you mean " + ", ".join(f"{c} (for {f})" for f, c in hints) + "?" if hints else "")
        choice = re.match(r"argument (\S+): invalid choice: '([^']*)'", message)
        if choice:
            action = self._action(choice[1].split("/")[0])
            close = (
                difflib.get_close_matches(choice[2], [str(c) for c in action.choices or ()], n=1)
                if action is not None
                else []
            )
            return message + (f"; did you mean '{close[0]}'?" if close else "")
        bad_type = re.match(r"argument (\S+): invalid \w+ value: ", message)
        if bad_type:
            action = self._action(bad_type[1].split("/")[0])
            opt = FIELDS.get(action.dest) if action is not None else None
            return message + (f"; {bad_type[1]} must be {opt.rule.text}" if opt is not None and opt.rule else "")
        return message


def attach_negative_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`--lr -1e-4` -> `--lr=-1e-4`: argparse reads `-1e-4` as an unknown option ("expected one
    argument"); attached, the value reaches the value check, which states the rule."""
    takes_value = {o for a in parser._actions if a.nargs is None for o in a.option_strings}
    out, i = [], 0
    while i < len(argv):
        if argv[i] in takes_value and i + 1 < len(argv) and _negative_number(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _negative_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.startswith("-")


def build_parser(prog: str = "epic-slime train", loss_table: dict | None = None) -> argparse.ArgumentParser:
    """loss_table: the loss flags from `loss_flags.json` instead of the registry (no torch import)."""
    parser = OneLineErrorParser(
        prog=prog,
        allow_abbrev=False,
        description="The embedded asynchronous EPIC loop on CPU (Ray actors, tiny Qwen3-MoE, synthetic arithmetic).",
    )
    parser.add_argument("--config", default=None, help="YAML config (keys = flag names with underscores)")
    for opt in FIELDS.values():
        if opt.type is bool:  # --name / --no-name
            kind = {"action": argparse.BooleanOptionalAction}
        else:
            kind = {"type": opt.type, "choices": opt.choices}
        parser.add_argument(opt.flag, dest=opt.name, default=opt.default, help=opt.shown_help, **kind)
    if loss_table is None:
        from epic_slime.losses.flags import add_policy_loss_arguments

        add_policy_loss_arguments(parser)
    else:
        from .loss_flags import add_loss_arguments_from_table

        add_loss_arguments_from_table(parser, loss_table)
    return parser


def explicit_args(parser: argparse.ArgumentParser, argv: list[str]) -> dict:
    """Only the options the user actually typed (defaults suppressed)."""
    saved = [(a, a.default) for a in parser._actions]
    try:
        for a in parser._actions:
            a.default = argparse.SUPPRESS
        return vars(parser.parse_args(argv))
    finally:
        for a, d in saved:
            a.default = d


def _coerce_yaml_value(action: argparse.Action, key: str, value: Any, path: str) -> Any:
    """YAML scalar -> the flag's type. PyYAML reads `1e-3` as a string, so numbers may come as text."""
    if value is None:
        return None
    is_bool_flag = isinstance(
        action, (argparse.BooleanOptionalAction, argparse._StoreTrueAction, argparse._StoreFalseAction)
    )
    if is_bool_flag:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: {key} must be true or false, got {value!r}")
        return value
    typ = action.type
    if isinstance(value, bool) and typ is not bool:
        raise ConfigError(f"{path}: {key} must be a {getattr(typ, '__name__', 'value')}, got {value!r}")
    if typ is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        elif not isinstance(value, int):
            raise ConfigError(f"{path}: {key} must be an integer, got {value!r}")
    elif typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: {key} must be a string, got {value!r}")
    elif typ is not None:
        try:
            value = typ(value) if not isinstance(value, str) else typ(value.strip())
        except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
            raise ConfigError(f"{path}: {key}: cannot read {value!r} ({e})") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"{path}: {key} must be one of {sorted(action.choices)}, got {value!r}")
    return value


def load_yaml(path: str | Path, parser: argparse.ArgumentParser) -> dict:
    path = str(path)
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"--config: file not found: {path}") from None
    except yaml.YAMLError as e:
        from epic_slime.yaml_errors import yaml_error_line

        raise ConfigError(f"--config {yaml_error_line(path, e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: top level must be a mapping of option: value, got {type(data).__name__}")
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}
    out = {}
    for key, value in data.items():
        if key not in actions:
            raise ConfigError(
                f"--config {path}: unknown key {key!r} (keys are flag names with underscores; "
                f"see `epic-slime train --help`)"
            )
        out[key] = _coerce_yaml_value(actions[key], key, value, path)
    return out
