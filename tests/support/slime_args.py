"""slime's arguments for the CPU harness without slime's parser (it imports SGLang and
Megatron-LM's ``megatron.training``, neither installable on CPU): slime's own option strings, types,
defaults and actions read from its source (``slime/utils/arguments.py`` and
``slime/backends/sglang_utils/arguments.py``), the few Megatron flags the harness reads with
Megatron's defaults, the project's flag layer, and what slime's validation derives. Checked
against the real parsers' stored option strings (``epic_slime/slime/cli/option_strings.json``) by
``tests/slime_adapter/test_slime_e2e_args.py``, and against slime's full ``parse_args`` where it
is installed.
"""

from __future__ import annotations

import argparse
import ast
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
SLIME_SNAPSHOT = REPO.parent / "shared" / "vendor" / "slime-624b824a"


def slime_path() -> str | None:
    env = os.environ.get("SLIME_PATH")
    if env:
        return env
    return str(SLIME_SNAPSHOT) if (SLIME_SNAPSHOT / "slime").is_dir() else None


_TYPES = {"int": int, "float": float, "str": str}
_ACTIONS = (None, "store_true", "store_false", "append", "store_const", argparse.BooleanOptionalAction)


def _literal_kwargs(node: ast.Call) -> dict:
    """An add_argument / reset_arg call's keywords that shape parsing, as values."""
    kw = {}
    for k in node.keywords:
        if k.arg == "action" and ast.unparse(k.value) == "argparse.BooleanOptionalAction":
            kw["action"] = argparse.BooleanOptionalAction  # --x / --no-x, default None
        elif k.arg in ("default", "nargs", "choices", "action", "dest", "const"):
            try:
                kw[k.arg] = ast.literal_eval(k.value)
            except ValueError:
                kw[k.arg] = None
        elif k.arg == "type":
            kw["type"] = _TYPES.get(getattr(k.value, "id", ""), str)
    if kw.get("action") not in _ACTIONS:
        kw.pop("action")
    return kw


def _add(parser: argparse.ArgumentParser, opts: list[str], kw: dict) -> None:
    try:
        parser.add_argument(*opts, **kw)
    except (argparse.ArgumentError, TypeError, ValueError):
        pass  # a few flags are registered twice or need a non-literal type


def slime_argument_parser() -> argparse.ArgumentParser:
    """slime's own arguments (names, types, defaults, actions), read from its source: importing
    ``slime.utils.arguments`` needs SGLang. Arguments whose default is not a literal get None.
    slime's ``reset_arg(parser, name, ...)`` calls run as slime runs them, after the Megatron
    flags are in (``megatron_arguments``): a Megatron flag gets slime's default, a flag Megatron
    lacks is added."""
    root = Path(slime_path()) / "slime"
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    nodes = [
        n
        for src in (root / "utils" / "arguments.py", root / "backends" / "sglang_utils" / "arguments.py")
        for n in ast.walk(ast.parse(src.read_text()))
        if isinstance(n, ast.Call)
    ]
    resets = []
    for node in nodes:
        is_reset = getattr(node.func, "id", None) == "reset_arg"
        if not (is_reset or getattr(node.func, "attr", None) == "add_argument"):
            continue
        opts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not opts or not opts[0].startswith("--"):
            continue
        if is_reset:
            resets.append((opts[0], _literal_kwargs(node)))
        else:
            _add(parser, opts, _literal_kwargs(node))
    megatron_arguments(parser)
    for name, kw in resets:
        action = parser._option_string_actions.get(name)
        if action is None:
            _add(parser, [name], kw)
        elif "default" in kw:
            action.default = kw["default"]
    return parser


def megatron_arguments(parser: argparse.ArgumentParser) -> None:
    """The Megatron flags this harness reads (Megatron-LM's parser is not installable here),
    with Megatron's defaults (slime's ``reset_arg`` then changes some)."""
    group = parser.add_argument_group("megatron (stand-in)")
    for name, kw in {
        "--seed": dict(type=int, default=1234),
        "--save": dict(default=None),
        "--load": dict(default=None),
        "--save-interval": dict(type=int, default=None),
        "--eval-interval": dict(type=int, default=None),
        "--lr": dict(type=float, default=None),
        "--clip-grad": dict(type=float, default=1.0),
        "--micro-batch-size": dict(type=int, default=None),
        "--calculate-per-token-loss": dict(action="store_true"),
        # the MoE shape R3 checks routing against (the tiny Qwen3-MoE: 2 layers, top-2 of 4)
        "--num-layers": dict(type=int, default=None),
        "--num-experts": dict(type=int, default=None),
        "--moe-router-topk": dict(type=int, default=2),
        "--sequence-parallel": dict(action="store_true"),
        # SGLang's ServerArgs (slime prefixes them with --sglang-): dp_size defaults to 1
        "--sglang-dp-size": dict(type=int, default=1),
    }.items():
        if name not in parser._option_string_actions:
            group.add_argument(name, **kw)


def build_args(argv: list[str]) -> argparse.Namespace:
    from slime.utils.eval_config import build_eval_dataset_configs

    from epic_slime.slime.cli.checks import validate_project_args
    from epic_slime.slime.cli.command_line import driver_argv
    from epic_slime.slime.cli.flags import add_project_arguments

    parser = slime_argument_parser()
    add_project_arguments(parser)
    megatron_arguments(parser)
    args = parser.parse_args(driver_argv(argv))
    if args.custom_config_path:  # as slime's parse_args: the YAML's top-level keys onto args
        import yaml

        with open(args.custom_config_path) as f:
            for key, value in (yaml.safe_load(f) or {}).items():
                setattr(args, key, value)
    # what slime's / Megatron's validation derives and the rollout side reads
    args.global_batch_size = args.rollout_batch_size * args.n_samples_per_prompt // (args.num_steps_per_rollout or 1)
    args.start_rollout_id = None
    args.rank, args.world_size = 0, 1
    values = list(args.eval_prompt_data or [])
    args.eval_datasets = build_eval_dataset_configs(
        args, [{"name": values[i], "path": values[i + 1]} for i in range(0, len(values), 2)], {}
    )
    args.kl_coef = getattr(args, "kl_coef", 0.0) or 0.0
    if args.eval_function_path is None:
        args.eval_function_path = args.rollout_function_path
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    validate_project_args(args)
    return args
