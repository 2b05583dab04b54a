"""SGLang's and sglang-router's command-line arguments for slime's parser in this venv (SGLang lives in a
venv of its own, support/real_sglang.py): `ServerArgs.add_cli_args` and `RouterArgs.add_cli_args`
stood in for at that interface, with each argument's option strings, dest, action, type and default
recorded from the real classes in the SGLang venv (`record`). slime's own `add_sglang_arguments`,
`sglang_parse_args` and `validate_args` then run unmodified on them (its `--sglang-` prefixing, its
skipped arguments, its defaults)."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

_RECORD = r"""
import argparse, json
from sglang.srt.server_args import ServerArgs
from sglang_router.launch_router import RouterArgs

def dump(fn, **kw):
    p = argparse.ArgumentParser(add_help=False)
    fn(p, **kw)
    out = []
    for a in p._actions:
        try:
            json.dumps([a.default, a.const])
            default, const = a.default, a.const
        except TypeError:
            default, const = None, None
        out.append({"opts": a.option_strings, "dest": a.dest, "default": default, "const": const,
                    "nargs": a.nargs, "action": type(a).__name__, "type": getattr(a.type, "__name__", None)})
    return out

print(json.dumps({"server": dump(ServerArgs.add_cli_args),
                  "router": dump(RouterArgs.add_cli_args, use_router_prefix=True, exclude_host_port=True)}))
"""

_TYPES = {"int": int, "float": float, "human_readable_int": int}


def record(sglang_python: str, cache: Path) -> dict:
    """The real classes' arguments, from the SGLang venv (cached in `cache`: the import takes ~30 s)."""
    if cache.is_file():
        return json.loads(cache.read_text())
    done = subprocess.run([sglang_python, "-c", _RECORD], capture_output=True, text=True, timeout=600, check=True)
    cache.write_text(done.stdout.strip().splitlines()[-1])
    return json.loads(cache.read_text())


def _add_recorded(parser: argparse.ArgumentParser, recorded: list[dict]) -> None:
    for a in recorded:
        if a["dest"] == "help" or not a["opts"]:
            continue
        kw: dict = {"default": a["default"]}
        long = next((o for o in a["opts"] if o.startswith("--")), None)
        if long is None or long[2:].replace("-", "_") != a["dest"]:
            kw["dest"] = a["dest"]
        action = a["action"]
        if action in ("_StoreTrueAction", "DeprecatedStoreTrueAction"):
            kw["action"] = "store_true"
        elif action in ("_StoreFalseAction",):
            kw["action"] = "store_false"
        elif action == "BooleanOptionalAction":
            kw["action"] = argparse.BooleanOptionalAction
        elif action in ("_StoreConstAction", "DeprecatedStoreConstAction") or a["nargs"] == 0:
            kw.update(action="store_const", const=a["const"])
        else:  # a value: SGLang's own parsers of it (json, lists) read a string here
            kw.update(type=_TYPES.get(a["type"], str), nargs=a["nargs"])
            if action == "_AppendAction":
                kw["action"] = "append"
        parser.add_argument(*a["opts"], **kw)


def install(recorded: dict) -> None:
    """Put the recorded `add_cli_args` where slime's SGLang argument module imports them from."""
    import sys

    class ServerArgs:
        @staticmethod
        def add_cli_args(parser):
            _add_recorded(parser, recorded["server"])

    class RouterArgs:
        @staticmethod
        def add_cli_args(parser, use_router_prefix=False, exclude_host_port=False):
            assert use_router_prefix and exclude_host_port, "recorded with slime's arguments only"
            _add_recorded(parser, recorded["router"])

    sys.modules["sglang.srt.server_args"].ServerArgs = ServerArgs
    sys.modules["sglang_router.launch_router"].RouterArgs = RouterArgs
    loaded = sys.modules.get("slime.backends.sglang_utils.arguments")
    if loaded is not None:
        loaded.ServerArgs, loaded.RouterArgs = ServerArgs, RouterArgs
