"""The loss flags of `epic-slime train` / `sweep` without importing torch, for a first, fast pass over
a command line: a refused flag or value answers in a fraction of a second, not after torch's import
(the losses package needs torch: 1 s idle, 4-22 s on a busy machine).

`loss_flags.json` holds what the command line needs of the loss registry (mode names, aggregations,
each flag family's parameters and defaults). `tests/runtime/test_runtime_early_refusals.py` checks it against
the registry and the two parsers against each other; after adding a mode or a parameter, regenerate it:

    python -m epic_slime.runtime.loss_flags --write
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import lru_cache
from pathlib import Path

TABLE_PATH = Path(__file__).with_name("loss_flags.json")


def live_table() -> dict:
    """The same table from the registry itself (imports torch)."""
    from epic_slime.losses import AGGREGATIONS, DEFAULT_MODE, LOSS_MODES
    from epic_slime.losses.flags import _families

    return {
        "default_mode": DEFAULT_MODE,
        "modes": sorted(LOSS_MODES),
        "aggregations": list(AGGREGATIONS),
        "families": _families(),
        "mode_prefix": {m: LOSS_MODES[m].flag_prefix for m in sorted(LOSS_MODES)},
    }


@lru_cache(maxsize=1)
def stored_table() -> dict:
    return json.loads(TABLE_PATH.read_text())


def add_loss_arguments_from_table(parser: argparse.ArgumentParser, table: dict) -> argparse.ArgumentParser:
    """The flags `epic_slime.losses.flags.add_policy_loss_arguments` adds, from the table. Values stay
    text (the registry's parse and range checks come in the full pass)."""
    group = parser.add_argument_group("policy loss (epic_slime.losses)")
    group.add_argument(
        "--policy-loss", default=table["default_mode"], choices=table["modes"], help="loss mode (default: %(default)s)"
    )
    group.add_argument(
        "--policy-loss-aggregation",
        default=None,
        choices=table["aggregations"],
        help="loss aggregation (default: the mode's own)",
    )
    for prefix, params in table["families"].items():
        for param, default in params.items():
            group.add_argument(
                f"--{prefix}-{param.replace('_', '-')}",
                dest=f"{prefix.replace('-', '_')}_{param}",
                default=None,
                metavar="V",
                help=f"{prefix} {param} (default {default})",
            )
    return parser


def check_mode_flags(mode: str, loss_args: dict, table: dict) -> None:
    """The registry's cross-mode rule without torch: a parameter flag of another mode's family next
    to --policy-loss MODE is refused (ValueError, the message `losses.flags` gives)."""
    own = table["mode_prefix"][mode]
    for prefix, params in table["families"].items():
        for param in params:
            value = loss_args.get(f"{prefix.replace('-', '_')}_{param}")
            if value is not None and prefix != own:
                raise ValueError(
                    f"--{prefix}-{param.replace('_', '-')}={value} applies to the {prefix!r} modes, "
                    f"but --policy-loss is {mode!r} (its flags are --{own}-*)"
                )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = json.dumps(live_table(), indent=1, sort_keys=False) + "\n"
    if argv == ["--write"]:
        TABLE_PATH.write_text(text)
        print(f"wrote {TABLE_PATH}")
        return 0
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
