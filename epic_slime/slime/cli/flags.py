"""The project's flags on the slime path: their definitions, the project's dotted paths, and the
validated ``ProjectConfig`` (argparse and ``epic_slime.losses.flags`` only, never slime).

The driver's command line is read by ``epic_slime.slime.cli.command_line`` (one parse, every flag the
driver adds for slime), checked by ``epic_slime.slime.cli.checks`` and dry-run by
``python -m epic_slime.slime.cli.dry_run``.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

STALE_POLICIES = ("drop", "keep")
BEHAVIOR_LOGPROBS = ("rollout", "recompute")
LOSS_FUNCTION_PATH = "epic_slime.slime.loss.policy_loss"
ROLLOUT_FUNCTION_PATH = "epic_slime.slime.rollout.generate_rollout"
# the data source the project's rollout function needs (its prompt ledger: accounting and resume)
DATA_SOURCE_PATH = "epic_slime.slime.data_source.StreamingDataSource"
TOKEN_MEAN = "token-mean"
GENERATE_FUNCTION_PATH = "epic_slime.slime.generate.generate"
# --weight-push-mode (epic_slime.slime.push_mode) and its train hook (--custom-megatron-init-path)
ABORT, IN_PLACE, RETRACT = "abort", "in_place", "retract"
PUSH_MODES = (ABORT, IN_PLACE, RETRACT)
# the modes in which a request running at a push is held in SGLang and finishes after it (no /flush_cache
# possible, the train hook pauses with the mode, the rollout hook keys the prefix cache)
HOLDING_PUSH_MODES = (IN_PLACE, RETRACT)
DEFAULT_PUSH_MODE = ABORT
PUSH_TRAIN_HOOK_PATH = "epic_slime.slime.push_mode.install_train_hook"
DEFAULT_POLICY_LOSS_TOPK = 20
SYNCHRONOUS, ASYNCHRONOUS = "synchronous", "asynchronous"


class ProjectFlagError(ValueError):
    """A project flag (or a slime flag the project depends on) has a bad value."""


@dataclasses.dataclass(frozen=True)
class ProjectConfig:
    """One run's validated project settings (``checks.validate_project_args``)."""

    policy_loss: str
    policy_loss_params: dict[str, Any]
    aggregation: str
    update_depth: int | None
    max_staleness: int | None
    stale_policy: str
    behavior_logprobs: str
    policy_loss_topk: int | None = None  # k of the Top-K modes (None for the other modes)
    schedule: str = "asynchronous"  # SYNCHRONOUS when --max-staleness 0 (see checks.check_schedule_flags)
    oversample_ratio: float = 0.0  # the paper's oversampling ratio (epic_slime.slime.cli.oversampling)


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
        default=None,
        help="the loss's ratio base: SGLang's rollout log-probs (default) or the trainer's recompute at "
        "the start of the rollout step (slime's log_probs; the default under --use-tis, which needs it)",
    )
    group.add_argument(
        "--async-groups-in-flight",
        type=int,
        default=None,
        help="optional cap on the groups the background stream holds (generating, or finished and not "
        "yet taken), on top of the --max-staleness admission budget (live groups < (g + K) x batch); "
        "for memory. Default: none (the budget alone); one batch when --max-staleness is unset",
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
    add_push_arguments(parser)
    add_table2_arguments(parser)
    return parser


def add_push_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """What a weight push does to the requests SGLang is generating (``epic_slime.slime.push_mode``)."""
    group = parser.add_argument_group("epic-slime weight push")
    group.add_argument(
        "--weight-push-mode",
        choices=PUSH_MODES,
        default=DEFAULT_PUSH_MODE,
        help="abort (slime's default): SGLang aborts every request at a push, they are resubmitted and "
        "prefilled again on the new weights; in_place: SGLang pauses in place, the requests keep their KV "
        "cache and decode on with the new weights; retract (miles' default): SGLang sends the running requests back "
        "to its waiting queue with their tokens and prefills them again after the push (in both: no /flush_cache, "
        "each group gets its own prefix-cache key); see docs/cluster.md, Weight push modes",
    )
    return parser


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
        help="the paper's oversampling ratio r in [0, 1): caps the groups the background stream holds at "
        "ceil(rollout-batch-size / (1 - r)) (--async-groups-in-flight), on top of the --max-staleness "
        "admission budget; batches are taken in start order (see epic_slime.slime.cli.oversampling); 0 = no cap",
    )
    return parser


def add_read_slime_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The slime flags the project reads: cross-checked by ``checks`` and rewritten by ``command_line``.

    Defaults are slime's, except where ``None`` means "not given": ``--data-source-path``,
    ``--custom-megatron-init-path``, ``--lr-warmup-iters`` and ``--lr-warmup-fraction``, which the
    driver sets only when the command line leaves them unset.
    """
    slime = parser.add_argument_group("slime flags cross-checked by the project")
    slime.add_argument("--loss-type", default="policy_loss")
    slime.add_argument("--custom-loss-function-path", default=None)
    slime.add_argument("--rollout-function-path", default="slime.rollout.sglang_rollout.generate_rollout")
    slime.add_argument("--rollout-batch-size", type=int, default=None)
    slime.add_argument("--n-samples-per-prompt", type=int, default=1)
    slime.add_argument("--num-steps-per-rollout", type=int, default=None)
    slime.add_argument("--global-batch-size", type=int, default=None)
    slime.add_argument("--use-rollout-logprobs", action="store_true")
    slime.add_argument("--use-tis", action="store_true")
    slime.add_argument("--tis-clip", type=float, default=2.0)
    slime.add_argument("--tis-clip-low", type=float, default=0.0)
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
    slime.add_argument("--update-weight-transport", choices=("nccl", "disk"), default="nccl")  # slime's choices
    slime.add_argument("--data-source-path", default=None)
    slime.add_argument("--custom-megatron-init-path", default=None)
    # engines that outlive the driver: the train hook clears a killed driver's update group (push_recovery)
    slime.add_argument("--rollout-external-engine-addrs", nargs="+", default=None)
    slime.add_argument("--lr-warmup-iters", type=int, default=None)
    slime.add_argument("--lr-warmup-fraction", type=float, default=None)
    return parser


def resolve_behavior_logprobs(args: Any) -> str:
    """The loss's ratio base: ``--behavior-logprobs`` as given, else ``recompute`` under ``--use-tis``
    (TIS takes the ratio to pi_old and weights each token by pi_old / mu), else ``rollout``.
    ``rollout`` next to ``--use-tis`` would correct for mu twice: refused."""
    given = getattr(args, "behavior_logprobs", None)
    use_tis = bool(getattr(args, "use_tis", False))
    if given is None:
        return "recompute" if use_tis else "rollout"
    if given not in BEHAVIOR_LOGPROBS:
        raise ProjectFlagError(f"--behavior-logprobs must be one of {BEHAVIOR_LOGPROBS}, got {given!r}")
    if use_tis and given == "rollout":
        raise ProjectFlagError(
            "--behavior-logprobs rollout with --use-tis: TIS takes the loss's ratio to pi_old (the trainer's "
            "recompute) and weights each token by pi_old / mu, so a ratio to mu would correct twice; drop "
            "--behavior-logprobs (--use-tis implies recompute)"
        )
    return given


def default_aggregation(mode: str) -> str:
    """The mode's own aggregation (the core's registry: token-mean for dapo / ripo)."""
    from epic_slime.losses import LOSS_MODES

    if mode not in LOSS_MODES:
        raise ProjectFlagError(f"--policy-loss {mode!r} is not one of {sorted(LOSS_MODES)}")
    return LOSS_MODES[mode].aggregation


def project_option_kinds() -> dict[str, str]:
    """The project's own option strings (slime's parser gets them through add_custom_arguments)."""
    from epic_slime.slime.cli.option_strings import option_kinds_of

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_project_arguments(parser)
    return option_kinds_of(parser)
