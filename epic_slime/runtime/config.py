"""Configuration of the embedded runtime: defaults < YAML (`--config`) < command-line flags.

Flag names are the slime driver's where the meaning is the same (`--update-depth`,
`--max-staleness`, `--rollout-batch-size`, `--policy-loss` and the per-mode loss flags from
`epic_slime.losses.flags`, ...). YAML keys are the flag names with underscores. Unknown YAML keys,
wrong types and out-of-range values are errors that name the field and the value.
"""

from __future__ import annotations

import argparse
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .model_config import ModelConfig
from .task import TaskConfig
from .tasks import TASKS, validate_task_config


class ConfigError(ValueError):
    """Bad configuration value; the message names the field and the value."""


class Rule:
    """A value check and the rule it enforces, in words, for the error message ("must be <text>")."""

    def __init__(self, text: str, test):
        self.text, self.test = text, test

    def __call__(self, v) -> bool:
        return self.test(v)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_positive_int = Rule("an integer >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)
_nonneg_int = Rule("an integer >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
_positive_float = Rule("a finite number > 0", lambda v: _number(v) and v > 0 and v == v and v != float("inf"))
_nonneg_float = Rule("a finite number >= 0", lambda v: _number(v) and v >= 0 and v == v and v != float("inf"))
_unit_open_closed = Rule("a number in (0, 1]", lambda v: _number(v) and 0 < v <= 1)
_fraction = Rule("a number in [0, 1]", lambda v: _nonneg_float(v) and v <= 1)
_fraction_below_one = Rule("a number in [0, 1)", lambda v: isinstance(v, float) and 0.0 <= v < 1.0)


# name -> (type, default, check or None, choices or None, help). Order = order in --help.
FIELDS: dict[str, tuple[type, Any, Any, tuple | None, str]] = {
    # --- run ---
    "seed": (int, 1, _nonneg_int, None, "random seed (model init, data, sampling, minibatch order)"),
    "output_dir": (str, "runs/local-default", None, None, "run directory (metrics.jsonl, plots, checkpoints)"),
    "num_rollout": (int, 200, _positive_int, None, "number of rollout steps (= trainer weight versions produced)"),
    # --- rollout ---
    "rollout_mode": (
        str,
        "async",
        None,
        ("async", "sync"),
        "async: workers generate while the trainer trains; sync: alternate",
    ),
    "num_rollout_workers": (int, 2, _positive_int, None, "rollout worker actors"),
    "rollout_batch_size": (int, 64, _positive_int, None, "prompts per rollout step"),
    "n_samples_per_prompt": (int, 8, _positive_int, None, "responses per prompt (GRPO group size)"),
    "rollout_temperature": (float, 1.0, _positive_float, None, "sampling temperature (behaviour log-probs use it too)"),
    "rollout_top_p": (float, 1.0, _unit_open_closed, None, "top-p of rollout sampling"),
    "rollout_max_response_len": (int, 24, _positive_int, None, "max generated tokens per response"),
    "rollout_dtype": (
        str,
        "float32",
        None,
        ("float32", "bfloat16"),
        "worker precision; bfloat16 reproduces train-inference mismatch",
    ),
    "rollout_router_noise": (
        float,
        0.0,
        _nonneg_float,
        None,
        "sd of Gaussian noise added to the rollout engine's MoE "
        "router logits only: injected train-inference mismatch (routing drift; 0: off)",
    ),
    "update_weights_interval": (int, 1, _positive_int, None, "workers receive new weights every this many versions"),
    "rollout_buffer_batches": (
        int,
        2,
        _positive_int,
        None,
        "generated-but-untrained samples are capped at this many rollout batches (back-pressure)",
    ),
    # --- staleness ---
    "max_staleness": (
        int,
        2,
        _nonneg_int,
        None,
        "K: a sample more than K weight versions old is dropped (or kept with --stale-policy keep)",
    ),
    "rollout_lag": (
        int,
        0,
        _nonneg_int,
        None,
        "sync mode only: every batch is generated with the weights exactly L "
        "versions behind the trainer (an exact staleness; the first L steps use version 0; 0: on-policy)",
    ),
    "stale_policy": (
        str,
        "drop",
        None,
        ("drop", "keep"),
        "what to do with samples older than --max-staleness (both are counted)",
    ),
    # --- trainer ---
    "update_depth": (int, 8, _positive_int, None, "D: optimizer steps (minibatches) per rollout batch"),
    "lr": (float, 5e-5, _positive_float, None, "AdamW learning rate"),
    "weight_decay": (float, 0.0, _nonneg_float, None, "AdamW weight decay (paper, Table 2: 0.1)"),
    "adam_beta2": (
        float,
        0.999,
        Rule("a number in (0, 1)", lambda v: _number(v) and 0 < v < 1),
        None,
        "AdamW beta2 (paper, Table 2: 0.98)",
    ),
    "lr_warmup_steps": (
        int,
        0,
        _nonneg_int,
        None,
        "linear lr warmup over this many optimizer (Adam) steps: step k "
        "(from 0) uses lr * (k + 1) / N (paper: 10; 0: none)",
    ),
    "clip_grad": (float, 1.0, _positive_float, None, "gradient-norm clipping"),
    "policy_loss_topk": (
        int,
        5,
        _positive_int,
        None,
        "k of the DPPO Top-K modes: workers record the behaviour policy's k most likely tokens per position",
    ),
    "use_kl_loss": (bool, False, None, None, "add a k3 KL-to-reference term"),
    "kl_loss_coef": (float, 0.0, _nonneg_float, None, "coefficient of the KL-to-reference term"),
    "kl_loss_type": (
        str,
        "k3",
        None,
        ("k1", "k2", "k3", "low_var_kl"),
        "estimator of the KL term (low_var_kl: k3 clamped to [-10, 10], the paper's via verl/slime)",
    ),
    "use_tis": (
        bool,
        False,
        None,
        None,
        "truncated importance sampling against the rollout log-probs: the loss's "
        "ratio is to the trainer's own log-probs at the step start, each token weighted by "
        "min(exp(log pi_old - log mu_rollout), --tis-clip)",
    ),
    "tis_clip": (float, 2.0, _positive_float, None, "upper truncation C of the TIS weight (slime's default 2)"),
    "on_bad_tokens": (
        str,
        "skip",
        None,
        ("raise", "skip"),
        "a NaN/inf log-prob or advantage, or a log-prob > 1e-3, "
        "on a token: skip (mask it out, count it as train/policy/bad_tokens; a non-finite gradient "
        "skips the optimizer step, train/policy/skipped_steps) or raise",
    ),
    "max_bad_token_frac": (
        float,
        0.01,
        _fraction,
        None,
        "with --on-bad-tokens skip: abort when more than this share of a minibatch's tokens is bad",
    ),
    # --- eval ---
    "eval_interval": (int, 25, _nonneg_int, None, "evaluate every N steps (0: only before and after training)"),
    "n_samples_per_eval_prompt": (int, 8, _positive_int, None, "k of mean@k"),
    "eval_temperature": (float, 1.0, _positive_float, None, "eval sampling temperature"),
    "eval_top_p": (float, 1.0, _unit_open_closed, None, "eval sampling top-p"),
    # --- checkpoints ---
    "save_interval": (int, 0, _nonneg_int, None, "checkpoint every N steps (0: only at the end)"),
    "save": (str, None, None, None, "checkpoint directory (default: <output-dir>/checkpoints)"),
    "load": (
        str,
        None,
        None,
        None,
        "resume from this checkpoint (a step directory or a checkpoints directory: latest step)",
    ),
    "overwrite": (
        bool,
        False,
        None,
        None,
        "clear an existing run in --output-dir first (without it, or --load, an existing run directory is an error)",
    ),
    # --- warm start ---
    "warm_start_steps": (int, 300, _nonneg_int, None, "supervised warm-start steps on correct solutions (0: none)"),
    "warm_start_lr": (float, 3e-3, _positive_float, None, "warm-start learning rate"),
    "warm_start_answer_noise": (
        float,
        0.8,
        _fraction_below_one,
        None,
        "share of warm-start solutions whose final answer is off by 1..3 (a sloppy base model)",
    ),
    "warm_start_step_noise": (
        float,
        0.0,
        _fraction_below_one,
        None,
        "per-step chance that a warm-start solution's step result is wrong, carried on "
        "(a careless base model: exact copies, uncertain results; 0: off)",
    ),
    "warm_start_batch_size": (int, 64, _positive_int, None, "warm-start batch size"),
    "warm_start_seed": (
        int,
        None,
        _nonneg_int,
        None,
        "seed of the warm start (default: --seed); one value for several seeds gives them the same base policy",
    ),
    "warm_start_cache_dir": (
        str,
        None,
        None,
        None,
        "cache of warm-start weights keyed by config hash (default: ~/.cache/epic-slime/warm_start)",
    ),
    "warm_start_init": (
        str,
        None,
        None,
        None,
        "start the warm start from these weights (a state-dict file, e.g. a "
        "shorter task's warm start: a curriculum) instead of a fresh model; its sha256 is in the cache key",
    ),
    # --- model ---
    "model_hidden_size": (int, 64, _positive_int, None, "tiny Qwen3-MoE hidden size"),
    "model_num_layers": (int, 2, _positive_int, None, "decoder layers"),
    "model_num_heads": (int, 4, _positive_int, None, "attention heads"),
    "model_num_kv_heads": (int, 2, _positive_int, None, "key/value heads"),
    "model_num_experts": (int, 4, _positive_int, None, "experts per MoE layer"),
    "model_top_k": (int, 2, _positive_int, None, "experts per token"),
    "model_moe_intermediate_size": (int, 64, _positive_int, None, "expert MLP width"),
    "model_max_positions": (int, 64, _positive_int, None, "longest prompt + response the model takes"),
    # --- task ---
    "task_name": (str, "arith", None, tuple(TASKS), "arith: short chains; chain: the study's long chains modulo 10"),
    "task_min_operands": (int, 2, _positive_int, None, "fewest operands per problem"),
    "task_max_operands": (int, 3, _positive_int, None, "most operands per problem"),
    "task_max_operand": (int, 9, _positive_int, None, "operands are drawn from 0..this"),
    "task_ops": (str, "+-", None, None, "operators to draw from (subset of '+-*')"),
    "task_eval_num_prompts": (int, 64, _positive_int, None, "held-out prompts evaluated"),
    # --- logging ---
    "use_wandb": (
        bool,
        False,
        None,
        None,
        "log to Weights & Biases (needs `pip install wandb`; never needs a key in offline mode)",
    ),
    "wandb_mode": (str, "offline", None, ("offline", "disabled", "online"), "W&B mode"),
    "wandb_project": (str, "epic-slime-local", None, None, "W&B project"),
    "use_tensorboard": (bool, False, None, None, "log to TensorBoard (needs `pip install tensorboard`)"),
    "tensorboard_dir": (str, "", None, None, "TensorBoard folder (default: <output_dir>/tensorboard)"),
    "progress": (
        bool,
        True,
        None,
        None,
        "show progress: a bar on a terminal, else one plain line every --log-interval steps",
    ),
    "log_interval": (int, 10, _positive_int, None, "steps between plain progress lines when stdout is not a terminal"),
    "plots": (bool, True, None, None, "write PNG plots at the end"),
    # --- fault injection (tests / demos) ---
    "debug_kill_rollout_worker_at_step": (
        int,
        None,
        _positive_int,
        None,
        "kill rollout worker 0 when this step starts (fault-recovery demo)",
    ),
}


@dataclass
class RuntimeConfig:
    policy_loss: str
    policy_loss_params: dict
    values: dict = field(default_factory=dict)  # every FIELDS name -> validated value
    loss_args: dict = field(default_factory=dict)  # raw loss flag values (for the run record)
    policy_loss_aggregation: str = "seq-mean-token-mean"

    def __getattr__(self, name):
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(name)

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


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse whose errors are one line: argparse's message, the flag's rule, and a "did you mean"
    for a misspelt flag or choice (argparse prints the whole usage, ~80 lines here, before them)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {self.explain(message)}\n")

    def _action(self, option: str) -> argparse.Action | None:
        return next((a for a in self._actions if option in a.option_strings), None)

    def explain(self, message: str) -> str:
        if message.startswith("unrecognized arguments: "):
            flags = [a.split("=")[0] for a in message.split(": ", 1)[1].split() if a.startswith("--")]
            known = [o for a in self._actions for o in a.option_strings]
            hints = [(f, close[0]) for f in flags if (close := difflib.get_close_matches(f, known, n=1))]
            if len(hints) == 1:
                return message + f"; did you mean {hints[0][1]}?"
            return message + ("; did you mean " + ", ".join(f"{c} (for {f})" for f, c in hints) + "?" if hints else "")
        choice = re.match(r"argument (\S+): invalid choice: '([^']*)'", message)
        if choice:
            action = self._action(choice[1].split("/")[0])
            close = (
                difflib.get_close_matches(choice[2], [str(c) for c in action.choices or ()], n=1)
                if action is not None
                else []
            )
            return message + (f"; did you mean '{close[0]}'?" if close else "")
        bad_type = re.match(r"argument (\S+): invalid \w+ value: ", message)
        if bad_type:
            action = self._action(bad_type[1].split("/")[0])
            rule = FIELDS.get(action.dest, (None,) * 3)[2] if action is not None else None
            return message + (f"; {bad_type[1]} must be {rule.text}" if isinstance(rule, Rule) else "")
        return message


def attach_negative_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`--lr -1e-4` -> `--lr=-1e-4`: argparse reads `-1e-4` as an unknown option ("expected one
    argument"); attached, the value reaches the value check, which states the rule."""
    takes_value = {o for a in parser._actions if a.nargs is None for o in a.option_strings}
    out, i = [], 0
    while i < len(argv):
        if argv[i] in takes_value and i + 1 < len(argv) and _negative_number(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _negative_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.startswith("-")


def build_parser(prog: str = "epic-slime train", loss_table: dict | None = None) -> argparse.ArgumentParser:
    """loss_table: the loss flags from `loss_flags.json` instead of the registry (no torch import)."""
    parser = OneLineErrorParser(
        prog=prog,
        allow_abbrev=False,
        description="The embedded asynchronous EPIC loop on CPU (Ray actors, tiny Qwen3-MoE, synthetic arithmetic).",
    )
    parser.add_argument("--config", default=None, help="YAML config (keys = flag names with underscores)")
    for name, (typ, default, _check, choices, help_text) in FIELDS.items():
        if typ is bool:
            parser.add_argument(
                _flag(name), dest=name, default=default, action=argparse.BooleanOptionalAction, help=help_text
            )
        else:
            # a help text that says its default itself ("default: <output-dir>/...") is not given a second one
            shown = help_text if "default:" in help_text else f"{help_text} (default: {default})"
            parser.add_argument(_flag(name), dest=name, type=typ, default=default, choices=choices, help=shown)
    if loss_table is None:
        from epic_slime.losses.flags import add_policy_loss_arguments

        add_policy_loss_arguments(parser)
    else:
        from .loss_flags import add_loss_arguments_from_table

        add_loss_arguments_from_table(parser, loss_table)
    return parser


def _explicit_args(parser: argparse.ArgumentParser, argv: list[str]) -> dict:
    """Only the options the user actually typed (defaults suppressed)."""
    saved = [(a, a.default) for a in parser._actions]
    try:
        for a in parser._actions:
            a.default = argparse.SUPPRESS
        return vars(parser.parse_args(argv))
    finally:
        for a, d in saved:
            a.default = d


def _coerce_yaml_value(action: argparse.Action, key: str, value: Any, path: str) -> Any:
    """YAML scalar -> the flag's type. PyYAML reads `1e-3` as a string, so numbers may come as text."""
    if value is None:
        return None
    is_bool_flag = isinstance(
        action, (argparse.BooleanOptionalAction, argparse._StoreTrueAction, argparse._StoreFalseAction)
    )
    if is_bool_flag:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: {key} must be true or false, got {value!r}")
        return value
    typ = action.type
    if isinstance(value, bool) and typ is not bool:
        raise ConfigError(f"{path}: {key} must be a {getattr(typ, '__name__', 'value')}, got {value!r}")
    if typ is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        elif not isinstance(value, int):
            raise ConfigError(f"{path}: {key} must be an integer, got {value!r}")
    elif typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: {key} must be a string, got {value!r}")
    elif typ is not None:
        try:
            value = typ(value) if not isinstance(value, str) else typ(value.strip())
        except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
            raise ConfigError(f"{path}: {key}: cannot read {value!r} ({e})") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"{path}: {key} must be one of {sorted(action.choices)}, got {value!r}")
    return value


def load_yaml(path: str | Path, parser: argparse.ArgumentParser) -> dict:
    path = str(path)
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"--config: file not found: {path}") from None
    except yaml.YAMLError as e:
        from epic_slime.yaml_errors import yaml_error_line

        raise ConfigError(f"--config {yaml_error_line(path, e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: top level must be a mapping of option: value, got {type(data).__name__}")
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}
    out = {}
    for key, value in data.items():
        if key not in actions:
            raise ConfigError(
                f"--config {path}: unknown key {key!r} (keys are flag names with underscores; "
                f"see `epic-slime train --help`)"
            )
        out[key] = _coerce_yaml_value(actions[key], key, value, path)
    return out


def _validate(cfg: RuntimeConfig) -> None:
    v = cfg.values
    for name, (typ, _d, check, choices, _h) in FIELDS.items():
        val = v[name]
        if val is None:
            if name in (
                "save",
                "load",
                "warm_start_cache_dir",
                "warm_start_init",
                "warm_start_seed",
                "debug_kill_rollout_worker_at_step",
            ):
                continue
            raise ConfigError(f"{name} must be set (got null)")
        if typ is bool and not isinstance(val, bool):
            raise ConfigError(f"{name} must be true or false, got {val!r}")
        if check is not None and not check(val):
            raise ConfigError(f"{name}: invalid value {val!r}: must be {check.text} ({FIELDS[name][4]})")
        if choices is not None and val not in choices:
            raise ConfigError(f"{name} must be one of {list(choices)}, got {val!r}")
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
    if v["use_tis"]:
        if cfg.policy_loss.startswith("dppo_topk"):  # the Top-K modes (no torch import here)
            raise ConfigError(
                f"use_tis with policy_loss={cfg.policy_loss}: the Top-K modes' behaviour set comes from "
                f"the rollout engine, which TIS replaces by the trainer's pi_old (not supported)"
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
    from .task import VOCAB

    if v["policy_loss_topk"] > len(VOCAB):
        raise ConfigError(f"policy_loss_topk={v['policy_loss_topk']} exceeds the vocabulary size {len(VOCAB)}")
    longest = 1 + 3 * v["task_max_operands"] + v["rollout_max_response_len"]
    if longest > v["model_max_positions"]:
        raise ConfigError(
            f"rollout_max_response_len={v['rollout_max_response_len']} with task_max_operands="
            f"{v['task_max_operands']} exceeds the model's {v['model_max_positions']} positions "
            f"(model_max_positions)"
        )


def parse_config(argv: list[str], prog: str = "epic-slime train", quick: bool = False) -> RuntimeConfig:
    """argv -> validated RuntimeConfig (argparse exits on malformed flags; ConfigError on bad values).

    quick: a first pass without torch (`loss_flags.py`): every check but the loss parameters' values;
    the config it returns is for refusing, not for running."""
    if quick:
        from .loss_flags import stored_table

        parser = build_parser(prog, stored_table())
    else:
        parser = build_parser(prog)
    argv = attach_negative_values(parser, list(argv))
    parser.parse_args(argv)  # --help, malformed flags: one-line messages and exit 2
    defaults = vars(parser.parse_args([]))
    explicit = _explicit_args(parser, argv)
    from_yaml = load_yaml(explicit["config"], parser) if explicit.get("config") else {}
    merged = {**defaults, **from_yaml, **explicit}
    merged.pop("config", None)
    values = {k: merged[k] for k in FIELDS}
    loss_args = {k: v for k, v in merged.items() if k not in FIELDS}
    if quick:
        from .loss_flags import check_mode_flags, stored_table

        mode, params, aggregation = loss_args["policy_loss"], {}, loss_args.get("policy_loss_aggregation")
        try:
            check_mode_flags(mode, loss_args, stored_table())
        except ValueError as e:
            raise ConfigError(f"policy loss: {e}") from None
    else:
        from epic_slime.losses.flags import policy_loss_config_from_args

        try:
            mode, params, aggregation = policy_loss_config_from_args(argparse.Namespace(**loss_args))
        except (ValueError, KeyError) as e:
            raise ConfigError(f"policy loss: {e}") from None
    cfg = RuntimeConfig(
        policy_loss=mode,
        policy_loss_params=dict(params),
        values=values,
        loss_args=loss_args,
        policy_loss_aggregation=aggregation,
    )
    _validate(cfg)
    return cfg
