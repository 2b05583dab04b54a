"""The driver's command line read in one parser pass, and every flag the driver adds for slime.

One parser (the project's flags and the slime flags the project reads, ``flags``) parses the
command line once; each rewrite below reads that parse:

- for slime's parser, which derives the global batch size and the normaliser itself: update depth
  (``--num-steps-per-rollout``), token-mean aggregation (``--calculate-per-token-loss``),
  oversampling (``--async-groups-in-flight``) and the warmup in rollouts (``--lr-warmup-iters``);
- for the driver's own pieces: ``--use-rollout-logprobs`` where nothing needs slime's old-log-prob
  forward, the streaming data source, and the train hook (R3 with the project's rollout function,
  ``--weight-push-mode in_place`` or ``retract``).

The dry run reports the first group; the driver hands slime both. No slime import.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from epic_slime.slime.cli.flags import (
    DATA_SOURCE_PATH,
    PUSH_TRAIN_HOOK_PATH,
    ROLLOUT_FUNCTION_PATH,
    TOKEN_MEAN,
    ProjectFlagError,
    add_project_arguments,
    add_read_slime_arguments,
    default_aggregation,
    resolve_behavior_logprobs,
)


def command_line_parser(add_help: bool = False, prog: str | None = None) -> argparse.ArgumentParser:
    """The one parser: the project's flags and the slime flags the project reads (slime parses the rest)."""
    parser = argparse.ArgumentParser(prog=prog, add_help=add_help, allow_abbrev=False)
    add_project_arguments(parser)
    add_read_slime_arguments(parser)
    return parser


@dataclasses.dataclass(frozen=True)
class DriverCommandLine:
    argv: list[str]  # as given
    parser: argparse.ArgumentParser  # the one parser (``command_line_parser``)
    parsed: argparse.Namespace  # its parse of argv
    rest: list[str]  # what the parser does not know (slime's and Megatron's own flags)
    overrides: list  # flags given more than once (option_strings.Override); empty when not checked
    slime_flags: list[str]  # added for slime's parser: update depth, aggregation, oversampling, warmup
    driver_flags: list[str]  # added for the driver's pieces: rollout log-probs, data source, train hook

    @property
    def translated(self) -> list[str]:
        """The command line with the flags slime's parser needs (what the dry run validates)."""
        return self.argv + self.slime_flags

    @property
    def driver_argv(self) -> list[str]:
        """Everything slime parses."""
        return self.translated + self.driver_flags

    def translated_namespace(self) -> argparse.Namespace:
        """The parse with the added slime flags applied by the same parser, as if given at the end of
        argv: what slime's parser holds for the flags the project reads."""
        namespace = argparse.Namespace(**vars(self.parsed))
        self.parser.parse_known_args(self.slime_flags, namespace=namespace)
        return namespace


def read_command_line(
    argv: Sequence[str], parser: argparse.ArgumentParser | None = None, check: bool = True
) -> DriverCommandLine:
    """Parse argv once and build every rewrite; raises ProjectFlagError.

    ``check``: first the command-line checks (unsupported, unknown and abbreviated flags), and the
    unsupported values of slime flags right after the parse (a critic, delta weight sync), before
    any rewrite; off for callers that only want the rewrites."""
    from epic_slime.slime.cli.checks import check_spelling, check_unsupported_settings

    argv = list(argv)
    overrides = check_spelling(argv) if check else []
    parser = parser or command_line_parser()
    parsed, rest = parser.parse_known_args(argv)
    if check:
        check_unsupported_settings(parsed)
    slime_flags = update_depth_flags(parsed) + aggregation_flags(parsed) + oversampling_flags(parsed)
    slime_flags += lr_warmup_flags(parsed)
    driver_flags = rollout_logprobs_flags(parsed) + data_source_flags(parsed) + train_hook_flags(parsed)
    return DriverCommandLine(argv, parser, parsed, rest, overrides, slime_flags, driver_flags)


def translate_argv(argv: Sequence[str]) -> list[str]:
    """argv plus the flags slime's parser needs (``DriverCommandLine.translated``), unchecked."""
    return read_command_line(argv, check=False).translated


def driver_argv(argv: Sequence[str]) -> list[str]:
    """argv plus every flag the driver adds (``DriverCommandLine.driver_argv``), unchecked."""
    return read_command_line(argv, check=False).driver_argv


# ---- rewrites for slime's parser: it derives the global batch size and the normaliser itself


def update_depth_flags(parsed: argparse.Namespace) -> list[str]:
    """``--update-depth D`` -> ``--num-steps-per-rollout D`` (slime derives the global batch from it)."""
    depth, steps = parsed.update_depth, parsed.num_steps_per_rollout
    if depth is None:
        return []
    if steps is not None and steps != depth:
        raise ProjectFlagError(f"--update-depth {depth} disagrees with --num-steps-per-rollout {steps}")
    return [] if steps is not None else ["--num-steps-per-rollout", str(depth)]


def aggregation_flags(parsed: argparse.Namespace) -> list[str]:
    """``--calculate-per-token-loss`` when the loss aggregates token-mean (dapo / ripo by default)."""
    aggregation = parsed.policy_loss_aggregation or default_aggregation(parsed.policy_loss)
    return ["--calculate-per-token-loss"] if aggregation == TOKEN_MEAN and not parsed.calculate_per_token_loss else []


def oversampling_flags(parsed: argparse.Namespace) -> list[str]:
    """``--async-groups-in-flight N`` for ``--oversample-ratio r`` > 0 (N = ceil(batch / (1 - r)))."""
    from epic_slime.slime.cli.oversampling import OversamplingError, groups_in_flight

    # The synchronous schedule (K = 0) has no background generator to oversample with: it
    # generates exactly the batch (a documented gap, docs/design.md, oversampling vs the authors' fork). K = 1 neither:
    # a group trains at staleness 1 only in the rollout it started in, so oversampled leftovers
    # would be regenerated or dropped (see checks.check_oversampling).
    if not parsed.oversample_ratio or parsed.max_staleness in (0, 1):
        return []
    if parsed.rollout_batch_size is None:
        raise ProjectFlagError("--oversample-ratio needs --rollout-batch-size")
    try:
        in_flight = groups_in_flight(parsed.rollout_batch_size, parsed.oversample_ratio, parsed.async_groups_in_flight)
    except OversamplingError as exc:
        raise ProjectFlagError(str(exc)) from exc
    return ["--async-groups-in-flight", str(in_flight)]


def lr_warmup_flags(parsed: argparse.Namespace) -> list[str]:
    """``--lr-warmup-iters R x D`` for ``--lr-warmup-rollouts R`` (D = optimizer steps per rollout)."""
    rollouts = parsed.lr_warmup_rollouts
    if rollouts is None:
        return []
    if rollouts < 0:
        raise ProjectFlagError(f"--lr-warmup-rollouts must be >= 0, got {rollouts}")
    for name, value in (
        ("--lr-warmup-iters", parsed.lr_warmup_iters),
        ("--lr-warmup-fraction", parsed.lr_warmup_fraction),
    ):
        if value is not None:
            raise ProjectFlagError(f"--lr-warmup-rollouts {rollouts} and {name} {value} both set the warmup: keep one")
    depth = parsed.update_depth or parsed.num_steps_per_rollout or 1
    return ["--lr-warmup-iters", str(rollouts * depth)]


# ---- rewrites for the driver's own pieces


def needs_old_logprob_forward(
    behavior_logprobs: str, use_routing_replay: bool, use_rollout_routing_replay: bool
) -> bool:
    """Whether slime's per-rollout forward that recomputes the old log-probs is needed.

    The project's loss takes log mu from SGLang (``--behavior-logprobs rollout``); the forward is
    needed only for ``recompute`` (the ratio base under ``--use-tis`` too) and for R2
    (``--use-routing-replay`` without R3), which records the MoE routing during it. slime skips it under ``--use-rollout-logprobs``."""
    return behavior_logprobs == "recompute" or (use_routing_replay and not use_rollout_routing_replay)


def rollout_logprobs_flags(parsed: argparse.Namespace) -> list[str]:
    """``--use-rollout-logprobs`` where nothing needs slime's old-log-prob forward (one full forward
    over the rollout batch saved per rollout)."""
    forward = needs_old_logprob_forward(
        resolve_behavior_logprobs(parsed), parsed.use_routing_replay, parsed.use_rollout_routing_replay
    )
    return ["--use-rollout-logprobs"] if not forward and not parsed.use_rollout_logprobs else []


def data_source_flags(parsed: argparse.Namespace) -> list[str]:
    """``--data-source-path`` of the streaming data source with the project's rollout function (its
    prompt ledger does the accounting and saves in-flight groups for resume); another is refused."""
    if parsed.rollout_function_path != ROLLOUT_FUNCTION_PATH:
        return []
    if parsed.data_source_path is None:
        return ["--data-source-path", DATA_SOURCE_PATH]
    if parsed.data_source_path != DATA_SOURCE_PATH:
        raise ProjectFlagError(
            f"--rollout-function-path {ROLLOUT_FUNCTION_PATH} needs --data-source-path {DATA_SOURCE_PATH} "
            f"(got {parsed.data_source_path!r}): it records every consumed prompt for accounting and resume"
        )
    return []


def train_hook_flags(parsed: argparse.Namespace) -> list[str]:
    """``--custom-megatron-init-path`` of the project's train hook when none is given: always the push-mode
    hook (``epic_slime.slime.push_mode.install_train_hook``). On every train rank it name-checks each bucket
    slime's distributed updater broadcasts (the server answers success to a name it does not load), clears
    an update group left by a driver killed mid-push (``epic_slime.slime.stream.push_recovery``: external engines
    outlive it), pauses pushes with ``--weight-push-mode in_place`` / ``retract``, and installs the R3 train
    hook when R3 is on with the project's rollout function (``epic_slime.slime.routing``). Another init
    path is left alone here and refused by the checks where the project needs its own."""
    if parsed.custom_megatron_init_path is not None:
        return []
    return ["--custom-megatron-init-path", PUSH_TRAIN_HOOK_PATH]
