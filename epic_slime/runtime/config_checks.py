"""The checks of a runtime config: each option's own rule (declared with it in config_fields.py), then
the rules that tie options together. Every failure is a `ConfigError` naming the field and the value.
"""

from __future__ import annotations

from .config_fields import FIELDS, RuntimeConfig
from .config_rules import ConfigError
from .task import VOCAB
from .tasks import get_task, validate_task_config


def validate(cfg: RuntimeConfig) -> None:
    """Every option against its type, rule and choices, then the rules between options; ConfigError on the first break."""
    v = cfg.values
    for name, opt in FIELDS.items():
        val = v[name]
        if val is None:
            if opt.nullable:
                continue
            raise ConfigError(f"{name} must be set (got null)")
        if opt.type is bool and not isinstance(val, bool):
            raise ConfigError(f"{name} must be true or false, got {val!r}")
        if opt.rule is not None and not opt.rule(val):
            raise ConfigError(f"{name}: invalid value {val!r}: must be {opt.rule.text} ({opt.help})")
        if opt.choices is not None and val not in opt.choices:
            raise ConfigError(f"{name} must be one of {list(opt.choices)}, got {val!r}")
    if cfg.samples_per_step % v["update_depth"]:
        raise ConfigError(
            f"update_depth={v['update_depth']} must divide rollout_batch_size * n_samples_per_prompt "
            f"= {cfg.samples_per_step} (equal minibatches)"
        )
    if v["use_kl_loss"] and v["kl_loss_coef"] == 0:
        raise ConfigError("use_kl_loss is set but kl_loss_coef is 0: set --kl-loss-coef (paper: 1e-3)")
    if v["kl_loss_coef"] > 0 and not v["use_kl_loss"]:
        raise ConfigError(f"kl_loss_coef={v['kl_loss_coef']} has no effect without --use-kl-loss")
    if v["rollout_lag"]:
        if v["rollout_mode"] != "sync":
            raise ConfigError(
                f"rollout_lag={v['rollout_lag']} needs rollout_mode sync (async lags are set by "
                f"max_staleness), got rollout_mode={v['rollout_mode']!r}"
            )
        if v["max_staleness"] < v["rollout_lag"]:
            raise ConfigError(
                f"rollout_lag={v['rollout_lag']} exceeds max_staleness={v['max_staleness']}: every "
                f"batch would be dropped (set max_staleness >= rollout_lag)"
            )
        if v["load"]:
            raise ConfigError("rollout_lag with --load: a checkpoint does not hold the older versions' weights")
    if v["use_tis"] or v["behavior_logprobs"] == "recompute":
        if cfg.policy_loss.startswith("dppo_topk"):  # the Top-K modes (no torch import here)
            which = "use_tis" if v["use_tis"] else "behavior_logprobs=recompute"
            raise ConfigError(
                f"{which} with policy_loss={cfg.policy_loss}: the Top-K modes' behaviour set comes from "
                f"the rollout engine, which recompute replaces by the trainer's pi_old (not supported)"
            )
    if get_task(v["task_name"]).agent:
        needs_topk = cfg.policy_loss.startswith("dppo_topk")  # the Top-K modes (no torch import here)
        if needs_topk:
            raise ConfigError(
                f"task_name={v['task_name']!r} with policy_loss={cfg.policy_loss}: the multi-turn sampler "
                "records no Top-K behaviour sets (use a mode without Top-K)"
            )
        if v["warm_start_init"]:
            raise ConfigError(
                f"warm_start_init={v['warm_start_init']!r} is not supported with task_name={v['task_name']!r}"
            )
    if not v["task_min_operands"] <= v["task_max_operands"]:
        raise ConfigError(
            f"task_min_operands ({v['task_min_operands']}) > task_max_operands ({v['task_max_operands']})"
        )
    try:
        cfg.model.validate()
        validate_task_config(cfg.task)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if v["policy_loss_topk"] > len(VOCAB):
        raise ConfigError(f"policy_loss_topk={v['policy_loss_topk']} exceeds the vocabulary size {len(VOCAB)}")
    longest = 1 + 3 * v["task_max_operands"] + v["rollout_max_response_len"]
    if longest > v["model_max_positions"]:
        raise ConfigError(
            f"rollout_max_response_len={v['rollout_max_response_len']} with task_max_operands="
            f"{v['task_max_operands']} exceeds the model's {v['model_max_positions']} positions "
            f"(model_max_positions)"
        )
