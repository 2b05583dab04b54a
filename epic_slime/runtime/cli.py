"""`epic-slime train` and `epic-slime sweep` (argv list -> exit code)."""

from __future__ import annotations

import sys

from .config import ConfigError, parse_config


def train_main(argv: list[str]) -> int:
    try:
        cfg = parse_config(list(argv))
    except (ConfigError, FileNotFoundError) as e:
        print(f"epic-slime train: error: {e}", file=sys.stderr)
        return 2
    from .driver import run_training

    try:
        summary = run_training(cfg)
    except FileNotFoundError as e:
        print(f"epic-slime train: error: {e}", file=sys.stderr)
        return 2
    print(f"epic-slime train: {summary['steps']} steps in {summary['loop_s']:.1f}s "
          f"({summary['trained_samples_per_s']:.1f} trained samples/s); run directory {cfg.output_dir}")
    return 0


def sweep_main(argv: list[str]) -> int:
    from .sweep import main

    return main(list(argv))
