"""The runtime's options, declared once: `RuntimeConfig`, a dataclass whose fields carry their help text and rule.

Each option field is made by `option(default, help, rule=..., choices=..., unchecked=...)`: its name is
the attribute (`cfg.update_depth`), the YAML key (`update_depth`) and, with dashes, the flag
(`--update-depth`); its annotation is the type the flag and the YAML value are read as (`| None`: null
is allowed). `FIELDS` lists them as `Option` records, in this order (= the order in --help). The
policy-loss fields come from the loss flags (`epic_slime.losses.flags`), not from this table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .config_rules import (
    FRACTION,
    FRACTION_BELOW_ONE,
    NONNEG_FLOAT,
    NONNEG_INT,
    POSITIVE_FLOAT,
    POSITIVE_INT,
    UNIT_OPEN,
    UNIT_OPEN_CLOSED,
    Option,
    option,
    options_of,
)
from .model_config import ModelConfig
from .task import TaskConfig
from .tasks import TASKS


ANY_PATH = "a folder name: any path is valid, created when the run writes"


@dataclass(kw_only=True)
class RuntimeConfig:
    """A validated run configuration (`epic_slime.runtime.config.parse_config` makes one)."""

    # --- policy loss (the loss flags' values, resolved by epic_slime.losses.flags) ---
    policy_loss: str
    policy_loss_params: dict
    loss_args: dict = field(default_factory=dict)  # raw loss flag values (for the run record)
    policy_loss_aggregation: str = "seq-mean-token-mean"
    # --- run ---
    seed: int = option(1, "random seed (model init, data, sampling, minibatch order)", rule=NONNEG_INT)
    output_dir: str = option(
        "runs/local-default", "run directory (metrics.jsonl, plots, checkpoints)", unchecked=ANY_PATH
    )
    num_rollout: int = option(200, "number of rollout steps (= trainer weight versions produced)", rule=POSITIVE_INT)
    # --- rollout ---
    rollout_mode: str = option(
        "async", "async: workers generate while the trainer trains; sync: alternate", choices=("async", "sync")
    )
    num_rollout_workers: int = option(2, "rollout worker actors", rule=POSITIVE_INT)
    rollout_batch_size: int = option(64, "prompts per rollout step", rule=POSITIVE_INT)
    n_samples_per_prompt: int = option(8, "responses per prompt (GRPO group size)", rule=POSITIVE_INT)
    rollout_temperature: float = option(
        1.0, "sampling temperature (behaviour log-probs use it too)", rule=POSITIVE_FLOAT
    )
    rollout_top_p: float = option(1.0, "top-p of rollout sampling", rule=UNIT_OPEN_CLOSED)
    rollout_max_response_len: int = option(24, "max generated tokens per response", rule=POSITIVE_INT)
    rollout_dtype: str = option(
        "float32", "worker precision; bfloat16 reproduces train-inference mismatch", choices=("float32", "bfloat16")
    )
    rollout_router_noise: float = option(
        0.0,
        "sd of Gaussian noise added to the rollout engine's MoE router logits only: "
        "injected train-inference mismatch (routing drift; 0: off)",
        rule=NONNEG_FLOAT,
    )
    update_weights_interval: int = option(1, "workers receive new weights every this many versions", rule=POSITIVE_INT)
    rollout_buffer_batches: int = option(
        2, "generated-but-untrained samples are capped at this many rollout batches (back-pressure)", rule=POSITIVE_INT
    )
    # --- staleness ---
    max_staleness: int = option(
        2, "K: a sample more than K weight versions old is dropped (or kept with --stale-policy keep)", rule=NONNEG_INT
    )
    rollout_lag: int = option(
        0,
        "sync mode only: every batch is generated with the weights exactly L versions behind the trainer "
        "(an exact staleness; the first L steps use version 0; 0: on-policy)",
        rule=NONNEG_INT,
    )
    stale_policy: str = option(
        "drop", "what to do with samples older than --max-staleness (both are counted)", choices=("drop", "keep")
    )
    # --- trainer ---
    update_depth: int = option(8, "D: optimizer steps (minibatches) per rollout batch", rule=POSITIVE_INT)
    lr: float = option(5e-5, "AdamW learning rate", rule=POSITIVE_FLOAT)
    weight_decay: float = option(0.0, "AdamW weight decay (paper, Table 2: 0.1)", rule=NONNEG_FLOAT)
    adam_beta2: float = option(0.999, "AdamW beta2 (paper, Table 2: 0.98)", rule=UNIT_OPEN)
    lr_warmup_steps: int = option(
        0,
        "linear lr warmup over this many optimizer (Adam) steps: "
        "step k (from 0) uses lr * (k + 1) / N (paper: 10; 0: none)",
        rule=NONNEG_INT,
    )
    clip_grad: float = option(1.0, "gradient-norm clipping", rule=POSITIVE_FLOAT)
    policy_loss_topk: int = option(
        5,
        "k of the DPPO Top-K modes: workers record the behaviour policy's k most likely tokens per position",
        rule=POSITIVE_INT,
    )
    use_kl_loss: bool = option(False, "add a KL-to-reference term (estimator: --kl-loss-type)")
    kl_loss_coef: float = option(0.0, "coefficient of the KL-to-reference term", rule=NONNEG_FLOAT)
    kl_loss_type: str = option(
        "k3",
        "estimator of the KL term (low_var_kl: k3 clamped to [-10, 10], the paper's via verl/slime)",
        choices=("k1", "k2", "k3", "low_var_kl"),
    )
    use_tis: bool = option(
        False,
        "truncated importance sampling against the rollout log-probs: the loss's ratio is to the trainer's "
        "own log-probs at the step start, each token weighted by min(exp(log pi_old - log mu_rollout), --tis-clip)",
    )
    behavior_logprobs: str = option(
        "rollout",
        "the loss ratio's base: rollout (the engine's log-probs mu) or recompute (the trainer's own log-probs at "
        "the step start, pi_old; mu then enters only through --use-tis, which implies recompute)",
        choices=("rollout", "recompute"),
    )
    tis_clip: float = option(2.0, "upper truncation C of the TIS weight (slime's default 2)", rule=POSITIVE_FLOAT)
    on_bad_tokens: str = option(
        "skip",
        "a NaN/inf log-prob or advantage, or a log-prob > 1e-3, on a token: skip (mask it out, count it as "
        "train/policy/bad_tokens; a non-finite gradient skips the optimizer step, train/policy/skipped_steps) or raise",
        choices=("raise", "skip"),
    )
    max_bad_token_frac: float = option(
        0.01, "with --on-bad-tokens skip: abort when more than this share of a minibatch's tokens is bad", rule=FRACTION
    )
    # --- eval ---
    eval_interval: int = option(25, "evaluate every N steps (0: only before and after training)", rule=NONNEG_INT)
    n_samples_per_eval_prompt: int = option(8, "k of mean@k", rule=POSITIVE_INT)
    eval_temperature: float = option(1.0, "eval sampling temperature", rule=POSITIVE_FLOAT)
    eval_top_p: float = option(1.0, "eval sampling top-p", rule=UNIT_OPEN_CLOSED)
    # --- checkpoints ---
    save_interval: int = option(0, "checkpoint every N steps (0: only at the end)", rule=NONNEG_INT)
    save: str | None = option(None, "checkpoint directory (default: <output-dir>/checkpoints)", unchecked=ANY_PATH)
    load: str | None = option(
        None,
        "resume from this checkpoint (a step directory or a checkpoints directory: latest step)",
        unchecked="read when the run starts: a missing or unreadable checkpoint is an error then",
    )
    overwrite: bool = option(
        False,
        "clear an existing run in --output-dir first (without it, or --load, an existing run directory is an error)",
    )
    # --- warm start ---
    warm_start_steps: int = option(300, "supervised warm-start steps on correct solutions (0: none)", rule=NONNEG_INT)
    warm_start_lr: float = option(0.003, "warm-start learning rate", rule=POSITIVE_FLOAT)
    warm_start_answer_noise: float = option(
        0.8,
        "share of warm-start solutions whose final answer is off by 1..3 (a sloppy base model)",
        rule=FRACTION_BELOW_ONE,
    )
    warm_start_step_noise: float = option(
        0.0,
        "per-step chance that a warm-start solution's step result is wrong, carried on "
        "(a careless base model: exact copies, uncertain results; 0: off)",
        rule=FRACTION_BELOW_ONE,
    )
    warm_start_batch_size: int = option(64, "warm-start batch size", rule=POSITIVE_INT)
    warm_start_seed: int | None = option(
        None,
        "seed of the warm start (default: --seed); one value for several seeds gives them the same base policy",
        rule=NONNEG_INT,
    )
    warm_start_cache_dir: str | None = option(
        None,
        "cache of warm-start weights keyed by config hash (default: $XDG_CACHE_HOME or ~/.cache, then epic-slime/warm_start)",
        unchecked=ANY_PATH,
    )
    warm_start_init: str | None = option(
        None,
        "start the warm start from these weights (a state-dict file, e.g. a shorter task's warm start: "
        "a curriculum) instead of a fresh model; its sha256 is in the cache key",
        unchecked="read when the warm start runs: a missing file or a state dict of another shape is an error then",
    )
    # --- model ---
    model_hidden_size: int = option(64, "tiny Qwen3-MoE hidden size", rule=POSITIVE_INT)
    model_num_layers: int = option(2, "decoder layers", rule=POSITIVE_INT)
    model_num_heads: int = option(4, "attention heads", rule=POSITIVE_INT)
    model_num_kv_heads: int = option(2, "key/value heads", rule=POSITIVE_INT)
    model_num_experts: int = option(4, "experts per MoE layer", rule=POSITIVE_INT)
    model_top_k: int = option(2, "experts per token", rule=POSITIVE_INT)
    model_moe_intermediate_size: int = option(64, "expert MLP width", rule=POSITIVE_INT)
    model_max_positions: int = option(64, "longest prompt + response the model takes", rule=POSITIVE_INT)
    # --- task ---
    task_name: str = option(
        "arith",
        "; ".join(f"{t.name}: {t.description}" for t in TASKS.values()),
        choices=tuple(TASKS),
    )
    task_min_operands: int = option(2, "fewest operands per problem", rule=POSITIVE_INT)
    task_max_operands: int = option(3, "most operands per problem", rule=POSITIVE_INT)
    task_max_operand: int = option(9, "operands are drawn from 0..this", rule=POSITIVE_INT)
    task_ops: str = option(
        "+-", "operators to draw from (subset of '+-*')", unchecked="checked with the task (TaskConfig.validate)"
    )
    task_eval_num_prompts: int = option(64, "held-out prompts evaluated", rule=POSITIVE_INT)
    agent_max_turns: int = option(
        3,
        "task calc: most model turns per trajectory (a tool call and its answer between two turns)",
        rule=POSITIVE_INT,
    )
    agent_eval_tool: bool = option(
        True, "task calc: the held-out evaluation (mean@k) may call the tool; false scores the model alone"
    )
    # --- logging ---
    use_wandb: bool = option(
        False, "log to Weights & Biases (needs `pip install wandb`; never needs a key in offline mode)"
    )
    wandb_mode: str = option("offline", "W&B mode", choices=("offline", "disabled", "online"))
    wandb_project: str = option("epic-slime-local", "W&B project", unchecked="any name W&B accepts")
    use_tensorboard: bool = option(False, "log to TensorBoard (needs `pip install tensorboard`)")
    tensorboard_dir: str = option("", "TensorBoard folder (default: <output-dir>/tensorboard)", unchecked=ANY_PATH)
    progress: bool = option(True, "show progress: a bar on a terminal, else one plain line every --log-interval steps")
    log_interval: int = option(
        10, "steps between plain progress lines when stdout is not a terminal", rule=POSITIVE_INT
    )
    plots: bool = option(True, "write PNG plots at the end")
    # --- fault injection (tests / demos) ---
    debug_kill_rollout_worker_at_step: int | None = option(
        None, "kill rollout worker 0 when this step starts (fault-recovery demo)", rule=POSITIVE_INT
    )

    @property
    def values(self) -> dict:
        """Every option's value, by name (the loss fields aside)."""
        return {name: getattr(self, name) for name in FIELDS}

    @property
    def model(self) -> ModelConfig:
        return ModelConfig(
            hidden_size=self.model_hidden_size,
            num_layers=self.model_num_layers,
            num_heads=self.model_num_heads,
            num_kv_heads=self.model_num_kv_heads,
            num_experts=self.model_num_experts,
            top_k=self.model_top_k,
            moe_intermediate_size=self.model_moe_intermediate_size,
            max_positions=self.model_max_positions,
        )

    @property
    def task(self) -> TaskConfig:
        return TaskConfig(
            min_operands=self.task_min_operands,
            max_operands=self.task_max_operands,
            max_operand=self.task_max_operand,
            ops=self.task_ops,
            eval_num_prompts=self.task_eval_num_prompts,
            name=self.task_name,
        )

    @property
    def warm_start_seed_or_seed(self) -> int:
        return self.seed if self.warm_start_seed is None else self.warm_start_seed

    @property
    def samples_per_step(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.save) if self.save else Path(self.output_dir) / "checkpoints"

    def to_dict(self) -> dict:
        """The values actually used: loss parameters with the mode's defaults filled in (the chosen
        family's flags carry them too), other families' unset flags left out."""
        from epic_slime.losses import LOSS_MODES, resolve_params

        resolved = resolve_params(self.policy_loss, self.policy_loss_params)
        family = LOSS_MODES[self.policy_loss].flag_prefix.replace("-", "_") + "_"
        loss_flags = {k: v for k, v in self.loss_args.items() if v is not None and k != "policy_loss"}
        loss_flags.update({family + k: v for k, v in resolved.items()})
        return {
            **self.values,
            **loss_flags,
            "policy_loss": self.policy_loss,
            "policy_loss_params": resolved,
            "policy_loss_aggregation": self.policy_loss_aggregation,
        }


FIELDS: dict[str, Option] = options_of(RuntimeConfig)
