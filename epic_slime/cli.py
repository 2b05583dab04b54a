"""`epic-slime` command line: a thin dispatcher.

Each subcommand lives in its own module and is imported only when used, so that
`epic-slime report` does not pay for Ray or transformers imports.
"""

from __future__ import annotations

import difflib
import importlib
import sys

# subcommand -> ("module", "function taking argv list and returning an exit code", help)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("epic_slime.runtime.cli", "train_main", "run the embedded asynchronous EPIC loop on CPU"),
    "sweep": ("epic_slime.runtime.cli", "sweep_main", "loss modes x update depths x seeds on the embedded runtime"),
    "study": (
        "epic_slime.study.cli",
        "main",
        "the paper's claims at toy scale: every method paired by seed (--quick: a smoke, 39 min on 2 busy cores)",
    ),
    "prepare-data": ("epic_slime.data.prepare", "main", "download / convert DAPO-Math-17k and the eval sets"),
    "report": ("epic_slime.evaluation.report", "main", "Table 1 report and plots from eval records"),
    "evaluate": (
        "epic_slime.evaluation.evaluate",
        "main",
        "a checkpoint's samples on the eval sets (SGLang or transformers)",
    ),
}


def version_line() -> str:
    """`epic-slime --version`: package, torch and git commit (when this is a git checkout)."""
    from epic_slime.provenance import versions

    v = versions()
    return f"epic-slime {v['epic_slime']} (torch {v['torch']}, git {v['git_commit'] or 'n/a'})"


def _usage() -> str:
    lines = ["usage: epic-slime [--version] <command> [options]", "", "commands:"]
    for name, (_, _, text) in SUBCOMMANDS.items():
        lines.append(f"  {name:<14}{text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("--version", "-V"):
        print(version_line())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in SUBCOMMANDS:
        close = difflib.get_close_matches(command, SUBCOMMANDS, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"epic-slime: unknown command {command!r}{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name, _ = SUBCOMMANDS[command]
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
