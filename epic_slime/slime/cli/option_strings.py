"""Spelling check of a driver command line against the real parsers' option strings (no slime import).

slime parses its command line in two phases that both tolerate mistakes: SGLang's parser
(``parse_known_args``, abbreviations allowed: ``--sglang-mem-frac 0.5`` silently becomes
``--sglang-mem-fraction-static``) and Megatron's parser with slime's flags
(``ignore_unknown_args=True``: a typo is dropped without a word). A repeated flag silently
overrides the earlier value. So every ``--flag`` of the driver's argv is checked here against
the option strings of those parsers at the pinned versions, stored in ``option_strings.json``
next to this module (written by ``launch/tools/regenerate_option_strings.py`` from the real
parsers), plus the project's own flags:

- a flag no parser knows -> ``ProjectFlagError`` naming it and the closest real flag (difflib);
- a prefix of real flags (an abbreviation) -> ``ProjectFlagError`` naming the full flag(s);
- a flag given more than once -> an ``Override`` (reported by the dry run and the driver; the
  last value wins in argparse), except for flags whose action accumulates (append / count).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path

DATA_PATH = Path(__file__).with_name("option_strings.json")
FLAG_KINDS = ("value", "flag", "append")  # takes a value / takes none / repeats accumulate


class FlagSpellingError(ValueError):
    """A flag that no parser knows, or an abbreviation of one."""


@dataclasses.dataclass(frozen=True)
class Override:
    flag: str
    values: tuple[tuple[str, ...], ...]  # the value tokens of every occurrence, in order

    def describe(self) -> str:
        shown = " -> ".join(" ".join(v) if v else "(set)" for v in self.values)
        return f"{self.flag} given {len(self.values)} times: {shown} (the last one wins)"


@lru_cache(maxsize=4)
def load_option_strings(path: str | Path = DATA_PATH) -> dict:
    """The stored data: ``{"versions": ..., "parsers": {name: {option: kind}}}`` (validated)."""
    with open(path) as handle:
        data = json.load(handle)
    parsers = data.get("parsers") if isinstance(data, dict) else None
    if not isinstance(parsers, dict) or not parsers:
        raise ValueError(f"{path}: expected a mapping with a non-empty 'parsers' mapping")
    for name, options in parsers.items():
        bad = {o: k for o, k in options.items() if not o.startswith("-") or k not in FLAG_KINDS}
        if bad:
            raise ValueError(f"{path}: parser {name!r} has malformed entries {sorted(bad.items())[:5]}")
    return data


def option_kinds_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``{option string: kind}`` of an argparse parser (what the regenerate script stores)."""
    accumulating = (argparse._AppendAction, argparse._AppendConstAction, argparse._CountAction, argparse._ExtendAction)
    kinds: dict[str, str] = {}
    for option, action in parser._option_string_actions.items():
        if isinstance(action, accumulating):
            kinds[option] = "append"
        elif action.nargs == 0:
            kinds[option] = "flag"
        else:
            kinds[option] = "value"
    return kinds


def known_options(extra: Mapping[str, str] | None = None, path: str | Path = DATA_PATH) -> dict[str, str]:
    """Every option string of the stored parsers, plus ``extra`` (the project's own flags)."""
    merged: dict[str, str] = {}
    for options in load_option_strings(path)["parsers"].values():
        merged.update(options)
    merged.update(extra or {})
    return merged


def _flag_name(token: str) -> str | None:
    if not token.startswith("--") or token == "--":
        return None
    return token.split("=", 1)[0]


def _closest(flag: str, known: Iterable[str]) -> str | None:
    long_flags = [k for k in known if k.startswith("--")]
    matches = difflib.get_close_matches(flag, long_flags, n=1, cutoff=0.6)
    return matches[0] if matches else None


def check_flag_spelling(argv: Sequence[str], known: Mapping[str, str]) -> list[Override]:
    """Raise FlagSpellingError for an unknown or abbreviated flag; return the repeated flags."""
    occurrences: dict[str, list[tuple[str, ...]]] = {}
    current: str | None = None
    for token in argv:
        flag = _flag_name(token)
        if flag is None:
            if current is not None:
                occurrences[current][-1] += (token,)
            continue
        if flag not in known:
            expansions = sorted(k for k in known if k.startswith(flag))
            if expansions:
                raise FlagSpellingError(
                    f"{flag} is an abbreviation of {', '.join(expansions[:5])}: slime's SGLang parser "
                    "(abbreviations allowed) would silently expand it, its Megatron parser (unknown flags "
                    f"ignored) drop it; write the full flag {expansions[0]}"
                )
            closest = _closest(flag, known)
            hint = f"; did you mean {closest}?" if closest else ""
            raise FlagSpellingError(
                f"unknown flag {flag}: no option of slime's, Megatron's or SGLang's parser (pinned versions) "
                f"or of the project{hint} (slime would ignore it without a word)"
            )
        value = (token.split("=", 1)[1],) if "=" in token else ()
        occurrences.setdefault(flag, []).append(value)
        current = flag
    return [
        Override(flag, tuple(values))
        for flag, values in occurrences.items()
        if len(values) > 1 and known[flag] != "append"
    ]
