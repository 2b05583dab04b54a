"""The launch scripts' ``DRY_RUN=1`` check of a full driver command line, without slime or GPUs:

    python -m epic_slime.slime.cli.dry_run <the driver's argv ...>

reads the command line as the driver does (``command_line``), validates it (``checks``) and prints
the validated settings and the flags the driver adds for slime's parser; exit status 2 on an error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from epic_slime.slime.cli.checks import validate_project_args
from epic_slime.slime.cli.command_line import DriverCommandLine, command_line_parser, read_command_line
from epic_slime.slime.cli.flags import ProjectConfig, ProjectFlagError

PROG = "python -m epic_slime.slime.cli.dry_run"


def validate_command_line(line: DriverCommandLine) -> tuple[ProjectConfig, argparse.Namespace]:
    """The command line as slime's parser would hold it (the parse plus the added slime flags), validated."""
    args = line.translated_namespace()
    if args.update_depth is None and args.num_steps_per_rollout is not None:
        args.update_depth = args.num_steps_per_rollout
    config = validate_project_args(args)
    if args.rollout_batch_size is None:
        raise ProjectFlagError("--rollout-batch-size is required")
    return config, args


def check_argv(argv: Sequence[str]) -> tuple[ProjectConfig, argparse.Namespace, list[str]]:
    """Translate and validate a driver command line without slime: (config, parsed, unparsed rest)."""
    line = read_command_line(argv, command_line_parser(add_help=True, prog=PROG), check=False)
    config, args = validate_command_line(line)
    return config, args, line.rest


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        line = read_command_line(argv, command_line_parser(add_help=True, prog=PROG))
        config, args = validate_command_line(line)
    except (ProjectFlagError, SystemExit) as exc:
        if isinstance(exc, SystemExit):
            return int(exc.code or 2)
        print(f"epic-slime flags: error: {exc}", file=sys.stderr)
        return 2
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    depth = config.update_depth or 1
    added = line.slime_flags
    print(
        f"epic-slime flags OK: policy_loss={config.policy_loss} params={config.policy_loss_params} "
        f"aggregation={config.aggregation} update_depth={depth} (global batch {samples // depth} of "
        f"{samples} samples) max_staleness={config.max_staleness} schedule={config.schedule} "
        f"stale_policy={config.stale_policy} "
        f"behavior_logprobs={config.behavior_logprobs}"
        f"{f' policy_loss_topk={config.policy_loss_topk}' if config.policy_loss_topk else ''}"
        f" oversample_ratio={config.oversample_ratio}; the driver passes slime "
        f"{' '.join(added) if added else 'no extra flags'}"
    )
    for override in line.overrides:
        print(f"epic-slime flags: override: {override.describe()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
