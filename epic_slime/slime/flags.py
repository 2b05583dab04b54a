"""The project's own command-line flags for the slime driver, and their validation.

This module imports only argparse and ``epic_slime.losses.flags`` (never slime), so the launch
scripts' ``DRY_RUN=1`` can validate a full command line on a machine without slime or GPUs:

    python -m epic_slime.slime.flags <the driver's argv ...>

slime's parser silently ignores unknown flags, so every project flag is checked here, and the
few slime flags the project depends on are cross-checked (loss hook, rollout function, batch
arithmetic, behaviour log-probs, aggregation).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

STALE_POLICIES = ("drop", "keep")
BEHAVIOR_LOGPROBS = ("rollout", "recompute")
LOSS_FUNCTION_PATH = "epic_slime.slime.loss.policy_loss"
ROLLOUT_FUNCTION_PATH = "epic_slime.slime.rollout.generate_rollout"
# the data source the project's rollout function needs (its prompt ledger: accounting and resume)
DATA_SOURCE_PATH = "epic_slime.slime.rollout.StreamingDataSource"
TOKEN_MEAN = "token-mean"
GENERATE_FUNCTION_PATH = "epic_slime.slime.generate.generate"
DEFAULT_POLICY_LOSS_TOPK = 20


class ProjectFlagError(ValueError):
    """A project flag (or a slime flag the project depends on) has a bad value."""


@dataclasses.dataclass(frozen=True)
class ProjectConfig:
    policy_loss: str
    policy_loss_params: dict[str, Any]
    aggregation: str
    update_depth: int | None
    max_staleness: int | None
    stale_policy: str
    behavior_logprobs: str
    policy_loss_topk: int | None = None  # k of the Top-K modes (None for the other modes)
    schedule: str = "asynchronous"  # SYNCHRONOUS when --max-staleness 0 (see check_schedule_flags)
    oversample_ratio: float = 0.0  # the paper's oversampling ratio (epic_slime.slime.oversampling)


def add_async_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Flags shared by name with the local runtime: update depth, staleness, behaviour log-probs."""
    group = parser.add_argument_group("epic-slime asynchronous training")
    group.add_argument(
        "--update-depth",
        type=int,
        default=None,
        help="optimizer steps per rollout batch (the paper's update depth D); sets slime's "
        "--num-steps-per-rollout, i.e. global batch = rollout-batch-size * n-samples-per-prompt / D",
    )
    group.add_argument(
        "--max-staleness",
        type=int,
        default=None,
        help="largest allowed staleness K (weight updates between the policy that generated a "
        "group and the policy that starts training on it); 0 runs the synchronous schedule "
        "(generate, train, push, as slime's train.py; --colocate allowed); default: no bound",
    )
    group.add_argument(
        "--stale-policy",
        choices=STALE_POLICIES,
        default="drop",
        help="what to do with a group staler than --max-staleness: drop it (counted) or keep it (counted)",
    )
    group.add_argument(
        "--behavior-logprobs",
        choices=BEHAVIOR_LOGPROBS,
        default="rollout",
        help="behaviour policy mu for the loss: SGLang's rollout log-probs (default) or the trainer's "
        "recompute at the start of the rollout step (slime's log_probs)",
    )
    group.add_argument(
        "--async-groups-in-flight",
        type=int,
        default=None,
        help="groups the background generator keeps in flight, and finished groups it lets wait "
        "before pausing (default: --rollout-batch-size, one batch ahead); larger values keep the "
        "engines busier and make samples staler",
    )
    group.add_argument(
        "--policy-loss-topk",
        type=int,
        default=DEFAULT_POLICY_LOSS_TOPK,
        help="k of the DPPO Top-K modes (dppo_topk_tv, dppo_topk_kl): SGLang returns the behaviour "
        "policy's top-k token ids and log-probs per generated token (top_logprobs_num=k), and the "
        "loss compares mu and pi on those k ids plus the sampled token and a rest bucket",
    )
    group.add_argument(
        "--slime-forwards-topk",
        action="store_true",
        help="assert that the installed slime carries the per-sample batch keys rollout_topk_ids and "
        "rollout_topk_log_probs from the Sample to the custom loss (slime 624b824a does not: "
        "a Top-K mode is refused without this flag)",
    )
    return parser


def add_project_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``add_custom_arguments`` for ``slime.utils.arguments.parse_args``: loss flags + async flags."""
    from epic_slime.losses.flags import add_bad_token_arguments, add_policy_loss_arguments

    add_policy_loss_arguments(parser)
    add_bad_token_arguments(parser, default="skip")  # a NaN on one token must not end a 32-GPU run
    add_async_arguments(parser)
    add_table2_arguments(parser)
    return parser


def default_aggregation(mode: str) -> str:
    """The mode's own aggregation (the core's registry: token-mean for dapo / ripo)."""
    from epic_slime.losses import LOSS_MODES

    if mode not in LOSS_MODES:
        raise ProjectFlagError(f"--policy-loss {mode!r} is not one of {sorted(LOSS_MODES)}")
    return LOSS_MODES[mode].aggregation


def _get(args: Any, name: str, default: Any = None) -> Any:
    return getattr(args, name, default)


def validate_project_args(args: Any) -> ProjectConfig:
    """Validate the project flags and their interplay with slime's flags; raise ProjectFlagError."""
    from epic_slime.losses.flags import policy_loss_config_from_args

    try:
        mode, params, aggregation = policy_loss_config_from_args(args)
    except (ValueError, KeyError, TypeError) as exc:
        raise ProjectFlagError(str(exc)) from exc

    depth = _get(args, "update_depth")
    if depth is not None and depth < 1:
        raise ProjectFlagError(f"--update-depth must be >= 1, got {depth}")
    staleness = _get(args, "max_staleness")
    if staleness is not None and staleness < 0:
        raise ProjectFlagError(f"--max-staleness must be >= 0 (or omitted for no bound), got {staleness}")
    stale_policy = _get(args, "stale_policy", "drop")
    if stale_policy not in STALE_POLICIES:
        raise ProjectFlagError(f"--stale-policy must be one of {STALE_POLICIES}, got {stale_policy!r}")
    behavior = _get(args, "behavior_logprobs", "rollout")
    if behavior not in BEHAVIOR_LOGPROBS:
        raise ProjectFlagError(f"--behavior-logprobs must be one of {BEHAVIOR_LOGPROBS}, got {behavior!r}")

    in_flight = _get(args, "async_groups_in_flight")
    if in_flight is not None and in_flight < 1:
        raise ProjectFlagError(f"--async-groups-in-flight must be >= 1, got {in_flight}")
    _check_slime_flags(args, aggregation, depth, staleness, behavior)
    schedule = check_schedule_flags(args, staleness)
    check_unsupported_settings(args)
    from epic_slime.slime.routing import check_r3_setup

    r3_problem = check_r3_setup(args)
    if r3_problem:
        raise ProjectFlagError(r3_problem)
    oversample_ratio = check_oversampling(args)
    topk = check_topk_flags(args, mode)
    from epic_slime.losses import resolve_params

    # the mode's parameters with its defaults filled in: what the loss will actually use
    return ProjectConfig(
        mode, resolve_params(mode, params), aggregation, depth, staleness, stale_policy, behavior, topk,
        schedule=schedule, oversample_ratio=oversample_ratio,
    )


def check_topk_flags(args: Any, mode: str) -> int | None:
    """k for a Top-K mode (None otherwise); the slime flags such a mode relies on are checked.

    Raises ProjectFlagError: k < 1; a generate function other than the project's (only it asks
    SGLang for the top log-probs); rollout top-p != 1 (SGLang's top log-probs and slime's top-p
    replay would describe different distributions); slime's all-gather CP layout; and a slime
    that does not forward the Top-K batch keys (see ``--slime-forwards-topk``).
    """
    from epic_slime.losses import LOSS_MODES

    topk = _get(args, "policy_loss_topk", DEFAULT_POLICY_LOSS_TOPK)
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ProjectFlagError(f"--policy-loss-topk must be an int >= 1, got {topk!r} (--policy-loss {mode})")
    if not LOSS_MODES[mode].needs_topk:
        return None
    generate_path = _get(args, "custom_generate_function_path")
    if generate_path != GENERATE_FUNCTION_PATH:
        raise ProjectFlagError(
            f"--policy-loss {mode} needs SGLang's top-{topk} log-probs per generated token: set "
            f"--custom-generate-function-path {GENERATE_FUNCTION_PATH} (got {generate_path!r})"
        )
    top_p = _get(args, "rollout_top_p", 1.0)
    if top_p is not None and float(top_p) != 1.0:
        raise ProjectFlagError(
            f"--policy-loss {mode} needs --rollout-top-p 1.0 (got {top_p}): with top-p sampling slime "
            "renormalises the trainer's log-probs over the nucleus, which the Top-K set does not follow"
        )
    if _get(args, "behavior_logprobs", "rollout") != "rollout":
        raise ProjectFlagError(
            f"--policy-loss {mode} needs --behavior-logprobs rollout: the top-k log-probs come from "
            "SGLang, so the sampled token's log mu must too"
        )
    if _get(args, "allgather_cp", False):
        raise ProjectFlagError(f"--policy-loss {mode} does not support slime's --allgather-cp layout")
    if not _get(args, "slime_forwards_topk", False):
        raise ProjectFlagError(
            f"--policy-loss {mode} needs per-sample Top-K data in the loss batch, and slime 624b824a "
            "drops it: RolloutManager._split_train_data_by_dp (slime/ray/rollout.py) forwards a fixed "
            "list of sample keys to the trainer, and the Megatron forward_step "
            "(slime/backends/megatron_utils/model.py) asks get_batch for a fixed list of keys. With a "
            "slime that forwards rollout_topk_ids and rollout_topk_log_probs (full response, [T, k] per "
            "sample, from Sample.rollout_topk_ids / rollout_topk_log_probs) pass --slime-forwards-topk"
        )
    return topk


SYNCHRONOUS, ASYNCHRONOUS = "synchronous", "asynchronous"
# slime's GPU memory flags: what the driver does around generation and training to share GPUs
MEMORY_FLAGS = (
    ("--offload", "offload"),
    ("--offload-train", "offload_train"),
    ("--offload-rollout", "offload_rollout"),
    ("--release-train", "release_train"),
)


def check_schedule_flags(args: Any, staleness: int | None) -> str:
    """The driver's schedule, SYNCHRONOUS or ASYNCHRONOUS, and the flags each one supports.

    ``--max-staleness 0`` runs the synchronous schedule (slime's train.py order: generate rollout r
    with the current weights, train it, push, then generate r + 1), the only one in which SGLang
    and Megatron may share GPUs: ``--colocate`` and slime's offload / onload / release flags are
    accepted there and rejected otherwise, since the asynchronous driver generates while it trains
    and never offloads. ``--partial-rollout`` (aborted responses continued under newer weights) and
    ``--async-groups-in-flight`` (the background worker's depth) make no sense without overlap.
    """
    colocate = bool(_get(args, "colocate", False))
    memory_flags = [flag for flag, name in MEMORY_FLAGS if _get(args, name, False)]
    if staleness == 0:
        in_flight = _get(args, "async_groups_in_flight")
        if in_flight is not None:
            raise ProjectFlagError(
                f"--async-groups-in-flight {in_flight} sets the background generator's depth, but "
                "--max-staleness 0 runs the synchronous schedule, which has no background generator: drop it"
            )
        if _get(args, "partial_rollout", False):
            raise ProjectFlagError(
                "--partial-rollout continues aborted responses under the next weights, so with "
                "--max-staleness 0 those groups would be 1 update stale: drop --partial-rollout"
            )
        return SYNCHRONOUS
    bound = "unset (unbounded)" if staleness is None else str(staleness)
    if colocate:
        raise ProjectFlagError(
            f"--colocate needs the synchronous schedule (--max-staleness 0); with --max-staleness {bound} "
            "the driver generates rollout r + 1 while rollout r trains, so SGLang and Megatron would "
            "need the same GPUs at the same time"
        )
    if memory_flags:
        raise ProjectFlagError(
            f"{', '.join(memory_flags)} only work with the synchronous schedule (--max-staleness 0); "
            f"with --max-staleness {bound} the driver generates while it trains and never offloads, "
            "onloads or recreates the train actors"
        )
    return ASYNCHRONOUS


def _check_slime_flags(args: Any, aggregation: str, depth: int | None, staleness: int | None, behavior: str) -> None:
    loss_type = _get(args, "loss_type")
    if loss_type is not None and loss_type != "custom_loss":
        raise ProjectFlagError(
            f"--loss-type is {loss_type!r}: the project's loss needs --loss-type custom_loss "
            f"--custom-loss-function-path {LOSS_FUNCTION_PATH}"
        )
    loss_path = _get(args, "custom_loss_function_path")
    if loss_type == "custom_loss" and loss_path != LOSS_FUNCTION_PATH:
        raise ProjectFlagError(f"--custom-loss-function-path is {loss_path!r}; expected {LOSS_FUNCTION_PATH}")

    rollout_path = _get(args, "rollout_function_path")
    if staleness is not None and rollout_path not in (None, ROLLOUT_FUNCTION_PATH):
        raise ProjectFlagError(
            f"--max-staleness is enforced by {ROLLOUT_FUNCTION_PATH}, but --rollout-function-path is "
            f"{rollout_path!r}"
        )

    prompts, per_prompt = _get(args, "rollout_batch_size"), _get(args, "n_samples_per_prompt")
    steps = _get(args, "num_steps_per_rollout")
    if depth is not None and steps is not None and steps != depth:
        raise ProjectFlagError(f"--update-depth {depth} disagrees with --num-steps-per-rollout {steps}")
    if depth is not None and prompts is not None and per_prompt is not None:
        samples = prompts * per_prompt
        if samples % depth:
            raise ProjectFlagError(
                f"--update-depth {depth} must divide rollout-batch-size * n-samples-per-prompt = {samples}"
            )
        gbs = _get(args, "global_batch_size")
        if gbs is not None and gbs != samples // depth:
            raise ProjectFlagError(
                f"--global-batch-size {gbs} disagrees with --update-depth {depth} "
                f"({prompts} prompts x {per_prompt} samples / {depth} = {samples // depth})"
            )

    if behavior == "recompute" and _get(args, "use_rollout_logprobs", False):
        raise ProjectFlagError(
            "--behavior-logprobs recompute needs slime's log-prob recompute, which "
            "--use-rollout-logprobs switches off: drop one of the two"
        )
    if (
        _get(args, "use_routing_replay", False)
        and not _get(args, "use_rollout_routing_replay", False)
        and _get(args, "use_rollout_logprobs", False)
    ):
        raise ProjectFlagError(
            "--use-routing-replay (R2) records the MoE routing during slime's log-prob recompute, "
            "which --use-rollout-logprobs skips: drop --use-rollout-logprobs"
        )
    per_token = bool(_get(args, "calculate_per_token_loss", False))
    if (aggregation == TOKEN_MEAN) != per_token:
        raise ProjectFlagError(
            f"aggregation {aggregation!r} needs --calculate-per-token-loss "
            f"{'set' if aggregation == TOKEN_MEAN else 'unset'} (slime's reducer and normaliser "
            "implement token-mean only in per-token mode)"
        )
    interval = _get(args, "update_weights_interval", 1)
    if interval not in (None, 1):
        raise ProjectFlagError(
            f"--update-weights-interval {interval}: staleness accounting assumes one weight update per rollout (1)"
        )


def translate_argv(argv: Sequence[str]) -> list[str]:
    """Rewrite the driver's argv for slime: ``--update-depth D`` -> ``--num-steps-per-rollout D``.

    slime derives the global batch size from --num-steps-per-rollout inside its own validation,
    so the mapping has to happen before slime parses. ``--calculate-per-token-loss`` is added
    when the loss aggregates token-mean (dapo/ripo by default).
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_project_arguments(parser)
    parser.add_argument("--num-steps-per-rollout", type=int, default=None)
    parser.add_argument("--calculate-per-token-loss", action="store_true")
    known, _ = parser.parse_known_args(list(argv))
    out = list(argv)
    if known.update_depth is not None:
        if known.num_steps_per_rollout is not None and known.num_steps_per_rollout != known.update_depth:
            raise ProjectFlagError(
                f"--update-depth {known.update_depth} disagrees with --num-steps-per-rollout "
                f"{known.num_steps_per_rollout}"
            )
        if known.num_steps_per_rollout is None:
            out += ["--num-steps-per-rollout", str(known.update_depth)]
    mode = known.policy_loss
    aggregation = known.policy_loss_aggregation or default_aggregation(mode)
    if aggregation == TOKEN_MEAN and not known.calculate_per_token_loss:
        out.append("--calculate-per-token-loss")
    out += oversampling_argv(argv)
    out += lr_warmup_argv(argv)
    return out


def _dry_run_parser() -> argparse.ArgumentParser:
    """Project flags plus the slime flags that the cross-checks read (slime parses the rest)."""
    parser = argparse.ArgumentParser(prog="python -m epic_slime.slime.flags", allow_abbrev=False)
    add_project_arguments(parser)
    slime = parser.add_argument_group("slime flags cross-checked by the project")
    slime.add_argument("--loss-type", default="policy_loss")
    slime.add_argument("--custom-loss-function-path", default=None)
    slime.add_argument("--rollout-function-path", default="slime.rollout.sglang_rollout.generate_rollout")
    slime.add_argument("--rollout-batch-size", type=int, default=None)
    slime.add_argument("--n-samples-per-prompt", type=int, default=1)
    slime.add_argument("--num-steps-per-rollout", type=int, default=None)
    slime.add_argument("--global-batch-size", type=int, default=None)
    slime.add_argument("--use-rollout-logprobs", action="store_true")
    slime.add_argument("--calculate-per-token-loss", action="store_true")
    slime.add_argument("--update-weights-interval", type=int, default=1)
    slime.add_argument("--colocate", action="store_true")
    slime.add_argument("--offload", action="store_true")
    slime.add_argument("--offload-train", action=argparse.BooleanOptionalAction, default=None)
    slime.add_argument("--offload-rollout", action=argparse.BooleanOptionalAction, default=None)
    slime.add_argument("--release-train", action="store_true")
    slime.add_argument("--partial-rollout", action="store_true")
    slime.add_argument("--use-routing-replay", action="store_true")
    slime.add_argument("--use-rollout-routing-replay", action="store_true")
    slime.add_argument("--custom-generate-function-path", default=None)
    slime.add_argument("--rollout-top-p", type=float, default=1.0)
    slime.add_argument("--allgather-cp", action="store_true")
    slime.add_argument("--advantage-estimator", default="grpo")
    slime.add_argument("--update-weight-mode", choices=("full", "delta"), default="full")  # slime's choices
    return parser


def check_argv(argv: Sequence[str]) -> tuple[ProjectConfig, argparse.Namespace, list[str]]:
    """Translate and validate a driver command line without slime: (config, parsed, unparsed rest)."""
    translated = translate_argv(argv)
    parser = _dry_run_parser()
    args, rest = parser.parse_known_args(translated)
    if args.update_depth is None and args.num_steps_per_rollout is not None:
        args.update_depth = args.num_steps_per_rollout
    config = validate_project_args(args)
    if args.rollout_batch_size is None:
        raise ProjectFlagError("--rollout-batch-size is required")
    return config, args, rest


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        overrides = check_command_line(argv)
        config, args, _ = check_argv(argv)
    except (ProjectFlagError, SystemExit) as exc:
        if isinstance(exc, SystemExit):
            return int(exc.code or 2)
        print(f"epic-slime flags: error: {exc}", file=sys.stderr)
        return 2
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    depth = config.update_depth or 1
    added = translate_argv(argv)[len(argv):]
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
    for override in overrides:
        print(f"epic-slime flags: override: {override.describe()}")
    return 0


# ---- command-line hygiene (issue 9): spelling against the real parsers, flags the project does not honour,
# ---- the paper's oversampling ratio. Kept apart from the validation above.

# slime flags that the project's rollout or loss would silently ignore: flag -> why (rejected when given).
_SYNC_ROLLOUT = (
    "is read by slime's synchronous sglang_rollout.generate_rollout; the project's streaming rollout "
    f"({ROLLOUT_FUNCTION_PATH}) takes finished groups from slime's AsyncRolloutWorker and never calls it"
)
_SLIME_POLICY_LOSS = (
    "belongs to slime's built-in policy_loss path, which --loss-type custom_loss replaces: the project's loss "
    "reads --policy-loss and its parameters (e.g. --grpo-clip-low / --grpo-clip-high, --dapo-dual-clip)"
)
UNSUPPORTED_FLAGS: dict[str, str] = {
    "--dynamic-sampling-filter-path": _SYNC_ROLLOUT,
    "--over-sampling-batch-size": _SYNC_ROLLOUT + " (the paper's oversampling is --oversample-ratio)",
    "--rollout-sample-filter-path": _SYNC_ROLLOUT,
    "--rollout-all-samples-process-path": _SYNC_ROLLOUT,
    "--use-tis": _SLIME_POLICY_LOSS + "; the project's loss applies no truncated importance-sampling correction",
    "--use-opsm": _SLIME_POLICY_LOSS,
    "--custom-pg-loss-reducer-function-path": _SLIME_POLICY_LOSS + "; aggregation is --policy-loss-aggregation",
    "--eps-clip": _SLIME_POLICY_LOSS,
    "--eps-clip-high": _SLIME_POLICY_LOSS,
    "--eps-clip-c": _SLIME_POLICY_LOSS,
    "--use-critic": "is not a slime flag: slime trains a critic when --advantage-estimator ppo, which the "
    "epic-slime driver does not support (it trains the actor with group-relative advantages)",
}


def check_unsupported_flags(argv: Sequence[str]) -> None:
    """Raise ProjectFlagError naming the first flag of ``UNSUPPORTED_FLAGS`` in argv."""
    for token in argv:
        flag = token.split("=", 1)[0]
        if flag in UNSUPPORTED_FLAGS:
            raise ProjectFlagError(f"{flag} is not supported by the epic-slime driver: it {UNSUPPORTED_FLAGS[flag]}")


def check_unsupported_settings(args: Any) -> None:
    """Values of real slime flags the driver does not support: a critic (``--advantage-estimator ppo``,
    which slime derives into use_critic) and delta weight sync (``--update-weight-mode delta``)."""
    estimator = _get(args, "advantage_estimator")
    if estimator == "ppo" or _get(args, "use_critic", False):
        raise ProjectFlagError(
            f"--advantage-estimator {estimator} trains a critic (slime's use_critic), which the epic-slime "
            "driver does not support: use a group-relative estimator such as --advantage-estimator grpo"
        )
    mode = _get(args, "update_weight_mode")
    if mode == "delta":
        # slime's delta sync publishes diffs to disk that every rollout host patches into its own
        # checkpoint copy (/pull_weights); the driver's version count and its tests cover only the
        # full push, so a missed or doubly applied delta would go unseen in the staleness metrics.
        raise ProjectFlagError(
            f"--update-weight-mode {mode} is not supported by the epic-slime driver: its staleness "
            "accounting assumes slime's full weight push (one weight_version per update, "
            "--update-weight-mode full, the default); drop --update-weight-mode delta"
        )


def project_option_kinds() -> dict[str, str]:
    """The project's own option strings (slime's parser gets them through add_custom_arguments)."""
    from epic_slime.slime.option_strings import option_kinds_of

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_project_arguments(parser)
    return option_kinds_of(parser)


def check_command_line(argv: Sequence[str]) -> list:
    """Unsupported, unknown and abbreviated flags raise ProjectFlagError; returns the overrides
    (``epic_slime.slime.option_strings.Override``: a flag given more than once, the last value wins)."""
    from epic_slime.slime.option_strings import FlagSpellingError, check_flag_spelling, known_options

    check_unsupported_flags(argv)
    try:
        overrides = check_flag_spelling(argv, known_options(project_option_kinds()))
    except FlagSpellingError as exc:
        raise ProjectFlagError(str(exc)) from exc
    # the critic is derived (not parsed) by slime, and delta sync is a value: catch both before slime's parser runs
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--advantage-estimator", default=None)
    parser.add_argument("--update-weight-mode", default=None)
    check_unsupported_settings(parser.parse_known_args(list(argv))[0])
    return overrides


def add_table2_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Two rows of the paper's Table 2 that slime has no flag for in the paper's units."""
    group = parser.add_argument_group("epic-slime paper Table 2 settings")
    group.add_argument(
        "--lr-warmup-rollouts",
        type=int,
        default=None,
        help="linear learning-rate warmup over this many training steps (rollouts), as the authors' verl "
        "steps its scheduler once per training step; becomes Megatron's --lr-warmup-iters "
        "(optimizer steps) = rollouts x --update-depth",
    )
    group.add_argument(
        "--oversample-ratio",
        type=float,
        default=0.0,
        help="the paper's oversampling ratio r in [0, 1): the background generator keeps "
        "ceil(rollout-batch-size / (1 - r)) groups in flight and each rollout takes the first "
        "rollout-batch-size that finish (see epic_slime.slime.oversampling); 0 = one batch in flight",
    )
    return parser


def check_oversampling(args: Any) -> float:
    from epic_slime.slime.oversampling import OversamplingError, check_ratio, groups_in_flight

    ratio = _get(args, "oversample_ratio", 0.0) or 0.0
    try:
        check_ratio(ratio)
        batch = _get(args, "rollout_batch_size")
        in_flight = _get(args, "async_groups_in_flight")
        if ratio and batch is not None and in_flight is not None and in_flight != groups_in_flight(batch, ratio):
            groups_in_flight(batch, ratio, explicit=in_flight)  # raises: two settings for one number
    except OversamplingError as exc:
        raise ProjectFlagError(str(exc)) from exc
    # K = 1: a group trains at staleness 1 only in the rollout it started in. Oversampled leftovers
    # (the slowest, i.e. longest, responses) reach staleness 2 at the next batch and are regenerated
    # again and again, then dropped: a length bias, not oversampling.
    if _get(args, "max_staleness") == 1 and batch is not None and in_flight is not None and in_flight > batch:
        raise ProjectFlagError(
            f"--max-staleness 1 with --async-groups-in-flight {in_flight} for a batch of {batch}: the "
            "leftovers are 2 versions stale at the next batch and would be regenerated or dropped; "
            "oversample with --max-staleness >= 2 (at K = 1 --oversample-ratio is not applied)"
        )
    return float(ratio)


def oversampling_argv(argv: Sequence[str]) -> list[str]:
    """``--async-groups-in-flight N`` for ``--oversample-ratio r`` > 0 (N = ceil(batch / (1 - r)))."""
    from epic_slime.slime.oversampling import OversamplingError, groups_in_flight

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_table2_arguments(parser)
    parser.add_argument("--rollout-batch-size", type=int, default=None)
    parser.add_argument("--async-groups-in-flight", type=int, default=None)
    parser.add_argument("--max-staleness", type=int, default=None)
    known, _ = parser.parse_known_args(list(argv))
    # The synchronous schedule (K = 0) has no background generator to oversample with: it
    # generates exactly the batch (a documented gap, README "Two Table 2 rows ..."). K = 1 neither:
    # a group trains at staleness 1 only in the rollout it started in, so oversampled leftovers
    # would be regenerated or dropped (see check_oversampling).
    if not known.oversample_ratio or known.max_staleness in (0, 1):
        return []
    if known.rollout_batch_size is None:
        raise ProjectFlagError("--oversample-ratio needs --rollout-batch-size")
    try:
        in_flight = groups_in_flight(known.rollout_batch_size, known.oversample_ratio, known.async_groups_in_flight)
    except OversamplingError as exc:
        raise ProjectFlagError(str(exc)) from exc
    return ["--async-groups-in-flight", str(in_flight)]


def lr_warmup_argv(argv: Sequence[str]) -> list[str]:
    """``--lr-warmup-iters R x D`` for ``--lr-warmup-rollouts R`` (D = optimizer steps per rollout)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_table2_arguments(parser)
    parser.add_argument("--update-depth", type=int, default=None)
    parser.add_argument("--num-steps-per-rollout", type=int, default=None)
    parser.add_argument("--lr-warmup-iters", type=int, default=None)
    parser.add_argument("--lr-warmup-fraction", type=float, default=None)
    known, _ = parser.parse_known_args(list(argv))
    rollouts = known.lr_warmup_rollouts
    if rollouts is None:
        return []
    if rollouts < 0:
        raise ProjectFlagError(f"--lr-warmup-rollouts must be >= 0, got {rollouts}")
    for name, value in (("--lr-warmup-iters", known.lr_warmup_iters), ("--lr-warmup-fraction", known.lr_warmup_fraction)):
        if value is not None:
            raise ProjectFlagError(f"--lr-warmup-rollouts {rollouts} and {name} {value} both set the warmup: keep one")
    depth = known.update_depth or known.num_steps_per_rollout or 1
    return ["--lr-warmup-iters", str(rollouts * depth)]


if __name__ == "__main__":
    raise SystemExit(main())
