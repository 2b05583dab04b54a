"""The pieces a runtime option is declared with: its value rule, its record, and the error a bad value raises.

`RuntimeConfig` (config_fields.py) declares each option as a dataclass field made by `option()`; the
field's metadata carries the help text and the rule, and `options_of` reads them back as one `Option`
record per option, from which the parser (config_parser.py) and the checks (config_checks.py) work.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable


class ConfigError(ValueError):
    """Bad configuration value; the message names the field and the value."""


@dataclass(frozen=True)
class Rule:
    """A value check and the rule it enforces, in words, for the error message ("must be <text>")."""

    text: str
    test: Callable[[Any], bool]

    def __call__(self, v) -> bool:
        return self.test(v)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _finite(v) -> bool:
    return v == v and v not in (float("inf"), float("-inf"))


POSITIVE_INT = Rule("an integer >= 1", lambda v: _integer(v) and v >= 1)
NONNEG_INT = Rule("an integer >= 0", lambda v: _integer(v) and v >= 0)
POSITIVE_FLOAT = Rule("a finite number > 0", lambda v: _number(v) and v > 0 and _finite(v))
NONNEG_FLOAT = Rule("a finite number >= 0", lambda v: _number(v) and v >= 0 and _finite(v))
UNIT_OPEN_CLOSED = Rule("a number in (0, 1]", lambda v: _number(v) and 0 < v <= 1)
UNIT_OPEN = Rule("a number in (0, 1)", lambda v: _number(v) and 0 < v < 1)
FRACTION = Rule("a number in [0, 1]", lambda v: NONNEG_FLOAT(v) and v <= 1)
FRACTION_BELOW_ONE = Rule("a number in [0, 1)", lambda v: isinstance(v, float) and 0.0 <= v < 1.0)


@dataclass(frozen=True)
class Option:
    """One option of `RuntimeConfig`: flag `--<name with dashes>`, YAML key and attribute `<name>`."""

    name: str
    type: type  # int, float, str or bool: what the flag and the YAML value are read as
    default: Any
    help: str
    rule: Rule | None  # the value rule beyond the type (None: see `choices` / `unchecked`)
    choices: tuple | None
    unchecked: str  # why a value has no rule beyond its type ("" when it has a rule or choices)
    nullable: bool  # null is a valid value: the field is annotated `<type> | None`

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def shown_help(self) -> str:
        """The help with the default, unless the text states its default itself ("default: <output-dir>/...")."""
        return self.help if "default:" in self.help else f"{self.help} (default: {self.default})"


def option(default, help: str, *, rule: Rule | None = None, choices: tuple | None = None, unchecked: str = ""):
    """A `RuntimeConfig` field that is a command-line option and a YAML key (see `Option`)."""
    meta = {"help": help, "rule": rule, "choices": None if choices is None else tuple(choices), "unchecked": unchecked}
    return dataclasses.field(default=default, metadata={"option": meta})


def _value_type(hint) -> tuple[type, bool]:
    """`int` -> (int, False); `int | None` -> (int, True)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"an option is one type or that type | None, got {hint}")
        return args[0], True
    return hint, False


def options_of(cls) -> dict[str, Option]:
    """The options of a dataclass, in declaration order (= order in --help)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("option")
        if meta is None:
            continue
        typ, nullable = _value_type(hints[f.name])
        out[f.name] = Option(name=f.name, type=typ, default=f.default, nullable=nullable, **meta)
    return out
