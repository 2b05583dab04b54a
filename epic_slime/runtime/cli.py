"""`epic-slime train` and `epic-slime sweep` (argv list -> exit code)."""

from __future__ import annotations

import shlex
import sys

from . import checkpoint
from .checkpoint import has_checkpoint
from .config import ConfigError, RuntimeConfig, parse_config
from .run_files import RunFolderTaken, check_output_dir

EXIT_INTERRUPTED = 130  # the shell's convention for a run ended by SIGINT
_NOTHING_SAVED = (
    "before the first checkpoint: nothing to resume, and the run's files were removed from {out}; "
    "run the same command again to start over"
)


def key_settings(cfg: RuntimeConfig) -> str:
    """One line with what decides a run: loss and its resolved parameters, D, K, batch, steps, seed."""
    params = ", ".join(f"{k}={v}" for k, v in cfg.to_dict()["policy_loss_params"].items())
    kl = f"KL {cfg.kl_loss_coef}" if cfg.use_kl_loss else "no KL"
    return (
        f"{cfg.policy_loss} ({params}; {cfg.policy_loss_aggregation}), update depth D={cfg.update_depth}, "
        f"max staleness K={cfg.max_staleness} ({cfg.stale_policy}), {cfg.rollout_mode}, "
        f"{cfg.rollout_batch_size} prompts x {cfg.n_samples_per_prompt} samples per step, "
        f"{cfg.num_rollout} steps, seed {cfg.seed}, lr {cfg.lr}, {kl}, bad tokens: {cfg.on_bad_tokens}; "
        f"output {cfg.output_dir}"
    )


def _fmt(v, spec=".3f") -> str:
    return "n/a" if v is None else format(v, spec)


def _step(v) -> str:
    return "n/a" if v is None else str(v)


def end_of_run_lines(summary: dict, cfg: RuntimeConfig) -> list[str]:
    """What a person wants to know when a run ends (or was interrupted)."""
    out = summary["output_dir"]
    first, last, n = summary["reward_first"], summary["reward_last"], summary["reward_window"]
    lines = [
        f"epic-slime train: {summary['steps_this_run']} steps this run (steps {summary['start_step'] + 1}.."
        f"{summary['steps']} of {cfg.num_rollout}) in {summary['loop_s']:.1f}s "
        f"({summary['trained_samples_per_s']:.1f} trained samples/s)",
        f"  training reward {_fmt(first)} (first {n} steps) -> {_fmt(last)} (last {n})",
        f"  held-out {summary['eval_key'].split('/')[-1]}: {_fmt(summary['eval_start'])} at start, "
        f"{_fmt(summary['eval_final'])} at the last eval (step {_step(summary['eval_final_step'])}), "
        f"best {_fmt(summary['eval_best'])} at step {_step(summary['eval_best_step'])}",
        *(
            [
                "  tool use at the last eval, per response: "
                + ", ".join(f"{k.removesuffix('_per_response')} {v:.2f}" for k, v in summary["eval_final_tool"].items())
            ]
            if summary.get("eval_final_tool")
            else []
        ),
        f"  staleness max {summary['staleness_max']} (K={cfg.max_staleness}); samples dropped "
        f"{summary['accounting/dropped']}, lost {summary['accounting/lost']}; bad tokens skipped "
        f"{summary['bad_tokens']}, optimizer steps skipped {summary['skipped_steps']}",
        f"  files: {out}/metrics.jsonl, batches.jsonl, eval_metrics.jsonl, eval_records.jsonl, summary.json, "
        "config.json" + (", *.png" if cfg.plots else "") + f"; checkpoints {cfg.checkpoint_dir}",
    ]
    return lines


def resume_command(argv: list[str], cfg: RuntimeConfig) -> str:
    """The command that resumes this run from its latest checkpoint (argv without --load/--overwrite)."""
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--load":
            skip = True
            continue
        if a.startswith("--load=") or a in ("--overwrite", "--no-overwrite"):
            continue
        kept.append(a)
    return shlex.join(["epic-slime", "train", *kept, "--load", str(cfg.checkpoint_dir)])


def loss_values_given(cfg: RuntimeConfig) -> bool:
    """Whether the command sets a loss parameter's value (the quick pass leaves those unchecked)."""
    return any(v is not None for k, v in cfg.loss_args.items() if k not in ("policy_loss", "policy_loss_aggregation"))


def refuse_before_start(cfg: RuntimeConfig) -> None:
    """The refusals that need no torch or Ray: a --load without a checkpoint or from another run's
    config, an output directory holding another run. The driver checks them again when it starts (the
    loss parameters' values only there: the quick config does not resolve them)."""
    resume_path = None
    if cfg.load:
        resume_path = checkpoint.resolve_checkpoint(cfg.load)
        # every value but the loss parameters and aggregation (resolved with torch, compared at the start)
        current = {**cfg.values, "policy_loss": cfg.policy_loss}
        checkpoint.check_resumable(checkpoint.load_driver_state(resume_path), cfg, current)
    check_output_dir(cfg, resume_path)


def train_main(argv: list[str]) -> int:
    try:
        # refusals (and --help) before torch's and Ray's imports: at once, not after a start-up banner
        quick = parse_config(list(argv), quick=True)
        try:
            refuse_before_start(quick)
        except RunFolderTaken:
            # a bad value outranks a taken folder, and only the full pass (torch) checks the loss
            # parameters' values: when one is set, that pass runs first (raising its own error)
            if loss_values_given(quick):
                parse_config(list(argv))
            raise
        cfg = parse_config(list(argv))
    except (ConfigError, FileNotFoundError) as e:
        print(f"epic-slime train: error: {e}", file=sys.stderr)
        return 2
    if cfg.progress:
        print(f"[epic-slime] {key_settings(cfg)}", flush=True)
    try:
        from .driver import run_training  # torch, Ray: seconds on a busy machine, so inside the Ctrl-C handling

        summary = run_training(cfg)
    except (ConfigError, FileNotFoundError) as e:
        print(f"epic-slime train: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        if has_checkpoint(cfg.checkpoint_dir):
            print(
                f"epic-slime train: stopped at once ({e or 'interrupt'}): no checkpoint written by this "
                "interruption; resume from the last saved one with --load",
                file=sys.stderr,
            )
        else:
            print(
                f"epic-slime train: stopped at once ({e or 'interrupt'}) {_NOTHING_SAVED.format(out=cfg.output_dir)}",
                file=sys.stderr,
            )
        return EXIT_INTERRUPTED
    if summary["interrupted"] and not has_checkpoint(cfg.checkpoint_dir):
        print(
            f"epic-slime train: interrupted by {summary['interrupted']} during start-up "
            f"{_NOTHING_SAVED.format(out=cfg.output_dir)}",
            flush=True,
        )
        return EXIT_INTERRUPTED
    for line in end_of_run_lines(summary, cfg):
        print(line)
    if summary["interrupted"]:
        where = summary["checkpoint"] or "none (interrupted before the first step)"
        print(
            f"epic-slime train: interrupted by {summary['interrupted']}; checkpoint {where}. Resume with: "
            f"{resume_command(list(argv), cfg)}",
            flush=True,
        )
        return EXIT_INTERRUPTED
    return 0


def sweep_main(argv: list[str]) -> int:
    from .sweep import main

    return main(list(argv))
