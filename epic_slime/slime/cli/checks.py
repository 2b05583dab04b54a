"""The checks of the project's flags and of the slime flags the project depends on.

slime's parser silently ignores unknown flags, so every project flag is checked here, and the few
slime flags the project depends on are cross-checked (loss hook, rollout function, batch
arithmetic, behaviour log-probs, aggregation, schedule, Top-K, oversampling: the ratio becomes the
stream's cap on held groups, on top of the admission budget); the command-line
checks (spelling against the real parsers, flags and values the driver does not support) run
before any parse. Raises ``ProjectFlagError``; imports no slime.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epic_slime.slime.cli.flags import (
    ASYNCHRONOUS,
    DATA_SOURCE_PATH,
    DEFAULT_POLICY_LOSS_TOPK,
    GENERATE_FUNCTION_PATH,
    LOSS_FUNCTION_PATH,
    ROLLOUT_FUNCTION_PATH,
    STALE_POLICIES,
    SYNCHRONOUS,
    TOKEN_MEAN,
    ProjectConfig,
    ProjectFlagError,
    project_option_kinds,
    resolve_behavior_logprobs,
)


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
    behavior = resolve_behavior_logprobs(args)  # --use-tis: recompute (pi_old), see epic_slime.slime.loss_parts.tis
    from epic_slime.slime.loss_parts.tis import tis_settings_from_args

    tis_settings_from_args(args, mode)  # raises for what does not compose with --use-tis

    in_flight = _get(args, "async_groups_in_flight")
    if in_flight is not None and in_flight < 1:
        raise ProjectFlagError(f"--async-groups-in-flight must be >= 1, got {in_flight}")
    _check_slime_flags(args, aggregation, depth, staleness, behavior)
    schedule = check_schedule_flags(args, staleness)
    check_unsupported_settings(args)
    from epic_slime.slime.routing import check_r3_setup

    from epic_slime.slime.push_mode import check_push_setup

    for problem in (check_r3_setup(args), check_push_setup(args)):
        if problem:
            raise ProjectFlagError(problem)
    oversample_ratio = check_oversampling(args)
    topk = check_topk_flags(args, mode)
    from epic_slime.losses import resolve_params

    # the mode's parameters with its defaults filled in: what the loss will actually use
    return ProjectConfig(
        mode,
        resolve_params(mode, params),
        aggregation,
        depth,
        staleness,
        stale_policy,
        behavior,
        topk,
        schedule=schedule,
        oversample_ratio=oversample_ratio,
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
    if resolve_behavior_logprobs(args) != "rollout":
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
    ``--async-groups-in-flight`` (the cap on groups the background stream holds) make no sense without overlap.
    """
    colocate = bool(_get(args, "colocate", False))
    memory_flags = [flag for flag, name in MEMORY_FLAGS if _get(args, name, False)]
    if staleness == 0:
        in_flight = _get(args, "async_groups_in_flight")
        if in_flight is not None:
            raise ProjectFlagError(
                f"--async-groups-in-flight {in_flight} caps the groups the background stream holds, but "
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
            f"--max-staleness is enforced by {ROLLOUT_FUNCTION_PATH}, but --rollout-function-path is {rollout_path!r}"
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


def check_oversampling(args: Any) -> float:
    from epic_slime.slime.cli.oversampling import OversamplingError, check_ratio, groups_in_flight

    ratio = _get(args, "oversample_ratio", 0.0) or 0.0
    try:
        check_ratio(ratio)
        batch = _get(args, "rollout_batch_size")
        in_flight = _get(args, "async_groups_in_flight")
        if ratio and batch is not None and in_flight is not None and in_flight != groups_in_flight(batch, ratio):
            groups_in_flight(batch, ratio, explicit=in_flight)  # raises: two settings for one number
    except OversamplingError as exc:
        raise ProjectFlagError(str(exc)) from exc
    # No K = 1 check any more: the admission budget (epic_slime.admission.AdmissionBudget) never lets
    # a group start that would train past K, so a cap above one batch is only inert at K = 1.
    return float(ratio)


# ---- command-line hygiene (issue 9): spelling against the real parsers, flags the project does not honour

# slime flags that the project's rollout or loss would silently ignore: flag -> why (rejected when given).
_SYNC_ROLLOUT = (
    "is read by slime's synchronous sglang_rollout.generate_rollout; the project's streaming rollout "
    f"({ROLLOUT_FUNCTION_PATH}) takes finished groups from its own GroupStream and never calls it"
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
    "--buffer-filter-path": "picks which groups slime's own data-source buffer hands out again; the "
    f"project's data source ({DATA_SOURCE_PATH}) hands back the groups given to add_samples oldest first "
    "and never consults it",
    # --use-tis composes with the project's loss (epic_slime.slime.loss_parts.tis); slime's TIS hook does not
    "--custom-tis-function-path": _SLIME_POLICY_LOSS + "; --use-tis weights the project's loss by min(pi_old / mu, "
    "--tis-clip) itself (epic_slime.slime.loss_parts.tis)",
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
    check_disk_version_check(args)
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


def check_disk_version_check(args: Any) -> None:
    """slime 624b824a, after a full disk reload under ``--ci-test`` (``actor_group.py``), asks every
    engine for ``GET /get_weight_version``, which SGLang 0.5.15 answers 404 ("use /model_info"): the run
    would die at its first push. Refused up front; the version is in ``/model_info``."""
    if (
        _get(args, "ci_test", False)
        and _get(args, "update_weight_transport") == "disk"
        and (_get(args, "update_weight_mode") or "full") == "full"
    ):
        raise ProjectFlagError(
            "--ci-test with --update-weight-transport disk: slime checks the version after each disk reload "
            "with GET /get_weight_version, which SGLang 0.5.15 answers 404 (the version moved to /model_info), "
            "so the first push would fail; drop --ci-test or use --update-weight-transport nccl"
        )


def check_spelling(argv: Sequence[str]) -> list:
    """Unsupported, unknown and abbreviated flags raise ProjectFlagError; returns the overrides
    (``epic_slime.slime.cli.option_strings.Override``: a flag given more than once, the last value wins)."""
    from epic_slime.slime.cli.option_strings import FlagSpellingError, check_flag_spelling, known_options

    check_unsupported_flags(argv)
    try:
        return check_flag_spelling(argv, known_options(project_option_kinds()))
    except FlagSpellingError as exc:
        raise ProjectFlagError(str(exc)) from exc
