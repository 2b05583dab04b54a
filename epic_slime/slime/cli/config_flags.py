"""YAML settings -> command-line flags for the launch scripts (no slime import).

Each config file is a mapping with a ``flags`` mapping of ``flag-name: value`` (the flag
without its leading dashes). Values: ``true`` -> bare flag, ``false`` / ``null`` -> flag
omitted (lets a later file switch off an earlier one), a list -> the flag followed by every
item, anything else -> the flag and ``str(value)``. Later files override earlier keys.

    python -m epic_slime.slime.cli.config_flags [-0] [--omit NAME]... a.yaml b.yaml ...

prints one argument per line (``-0``: NUL-separated, for ``mapfile -d ''`` in bash). ``--omit NAME``
leaves out a flag the caller sets itself (a launcher's own setting), so that the command passes it
once and slime's "given 2 times" notice is left for the user's own overrides.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def load_flag_mapping(paths: Iterable[str | Path]) -> dict[str, Any]:
    import yaml

    merged: dict[str, Any] = {}
    for path in paths:
        with open(path) as handle:
            try:
                data = yaml.safe_load(handle) or {}
            except yaml.YAMLError as e:
                from epic_slime.yaml_errors import yaml_error_line

                raise ValueError(yaml_error_line(path, e)) from None
        if not isinstance(data, dict) or not isinstance(data.get("flags", {}), dict):
            raise ValueError(f"{path}: expected a mapping with a 'flags' mapping")
        for name, value in (data.get("flags") or {}).items():
            if not isinstance(name, str) or not name or name.startswith("-"):
                raise ValueError(f"{path}: flag name {name!r} must be given without leading dashes")
            merged.pop(name, None)  # an override moves the flag to the end (command order = file order)
            merged[name] = value
    return merged


def _format(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def mapping_to_argv(flags: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for name, value in flags.items():
        if value is None or value is False:
            continue
        argv.append(f"--{name}")
        if value is True:
            continue
        if isinstance(value, (list, tuple)):
            if not value:
                raise ValueError(f"flag --{name}: empty list (use null to omit the flag)")
            argv.extend(_format(v) for v in value)
        elif isinstance(value, dict):
            raise ValueError(f"flag --{name}: a mapping is not a flag value")
        else:
            argv.append(_format(value))
    return argv


def config_argv(paths: Sequence[str | Path], omit: Iterable[str] = ()) -> list[str]:
    flags = load_flag_mapping(paths)
    for name in omit:
        flags.pop(name, None)
    return mapping_to_argv(flags)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    separator = "\n"
    if argv and argv[0] == "-0":
        separator, argv = "\0", argv[1:]
    omit = []
    while len(argv) >= 2 and argv[0] == "--omit":
        omit.append(argv[1].lstrip("-"))
        argv = argv[2:]
    if not argv or argv[0].startswith("-"):
        print(
            "usage: python -m epic_slime.slime.cli.config_flags [-0] [--omit NAME]... config.yaml ...", file=sys.stderr
        )
        return 2
    try:
        args = config_argv(argv, omit)
    except (OSError, ValueError) as exc:
        print(f"config_flags: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write("".join(a + separator for a in args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
