"""`epic-slime study [--quick | --ladder [--quick]]`: plan the runs, run them, write the report.

    epic-slime study --quick                    # configs/study/quick.yaml -> runs/study-quick
    epic-slime study                            # configs/study/default.yaml -> runs/study
    epic-slime study --ladder [--quick]         # configs/study/ladder[_quick].yaml -> runs/ladder[-quick]
    epic-slime study --stress [--quick]         # configs/study/stress[_quick].yaml -> runs/stress[-quick]
    epic-slime study --config X.yaml --output-dir D [--analyze-only]

Phases: `study.plan` (the config and its runs), `study.run` (execute and measure; resumable), then
`study.report` (tables, figures and summary.json from the files alone).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from epic_slime.provenance import git_commit

from .files import finished_results
from .plan import (
    DEFAULT_CONFIG,
    LADDER_CONFIG,
    LADDER_QUICK_CONFIG,
    QUICK_CONFIG,
    REPO,
    STRESS_CONFIG,
    STRESS_QUICK_CONFIG,
    StudyConfigError,
    load_study_config,
    plan,
)


# (which study, --quick) -> (its config, its default study directory)
STUDIES = {
    ("table", False): (DEFAULT_CONFIG, "runs/study"),
    ("table", True): (QUICK_CONFIG, "runs/study-quick"),
    ("ladder", False): (LADDER_CONFIG, "runs/ladder"),
    ("ladder", True): (LADDER_QUICK_CONFIG, "runs/ladder-quick"),
    ("stress", False): (STRESS_CONFIG, "runs/stress"),
    ("stress", True): (STRESS_QUICK_CONFIG, "runs/stress-quick"),
}


def study_of(quick: bool, ladder: bool, stress: bool) -> tuple[Path, str]:
    """The options' study: its config and default study directory."""
    return STUDIES[("ladder" if ladder else "stress" if stress else "table", quick)]


def _build_parser() -> argparse.ArgumentParser:
    from epic_slime.runtime.config import OneLineErrorParser  # train's: one-line errors with a "did you mean"

    p = OneLineErrorParser(
        prog="epic-slime study",
        description="The paper's claims at toy scale: Table 1 "
        "methods + EPIC ablations, paired by seed, selected on validation, reported on test.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"the quick study ({QUICK_CONFIG.relative_to(REPO)}; with "
        f"--ladder: {LADDER_QUICK_CONFIG.relative_to(REPO)})",
    )
    p.add_argument("--ladder", action="store_true", help=f"the policy-lag ladder ({LADDER_CONFIG.relative_to(REPO)})")
    p.add_argument(
        "--stress",
        action="store_true",
        help=f"the stress ladder ({STRESS_CONFIG.relative_to(REPO)}; "
        f"with --quick: {STRESS_QUICK_CONFIG.relative_to(REPO)})",
    )
    p.add_argument("--config", default=None, help=f"study YAML (default: {DEFAULT_CONFIG.relative_to(REPO)})")
    outs = ", ".join(out for _, out in STUDIES.values())
    p.add_argument("--output-dir", default=None, help=f"study directory (default, by the options above: {outs})")
    p.add_argument("--analyze-only", action="store_true", help="only write tables and figures from finished runs")
    return p


def main(argv: list[str]) -> int:
    args = _build_parser().parse_args(argv)
    if (args.quick or args.ladder or args.stress) and args.config:
        print("epic-slime study: error: --quick / --ladder / --stress and --config exclude each other", file=sys.stderr)
        return 2
    if args.ladder and args.stress:
        print("epic-slime study: error: --ladder and --stress exclude each other", file=sys.stderr)
        return 2
    config_path, default_out = study_of(args.quick, args.ladder, args.stress)
    config_path = args.config or config_path
    out = Path(args.output_dir or default_out)
    try:
        cfg = load_study_config(config_path)
    except (StudyConfigError, ValueError) as e:
        print(f"epic-slime study: error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    command = "epic-slime study " + " ".join(argv)
    from .report import write_report

    commit = git_commit(REPO, short=True) or "unknown"  # taken before the runs (edits meanwhile do not count)
    t0 = time.time()
    if args.analyze_only:
        results = finished_results(out, plan(cfg))
    else:
        from epic_slime.runtime.config import ConfigError

        from .run import execute

        try:
            results = execute(cfg, out, provenance=(command.strip(), commit))
        except ConfigError as e:
            print(f"epic-slime study: error: a run's train settings are invalid: {e}", file=sys.stderr)
            return 2
    write_report(cfg, out, results, command=command.strip(), study_s=time.time() - t0, commit=commit)
    print(f"[study] wrote {out / 'study.md'} and its figures in {time.time() - t0:.0f}s")
    return 0
