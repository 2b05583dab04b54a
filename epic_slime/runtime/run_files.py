"""The files of one run directory: which files make a run (and refusing to mix two runs in one
directory), the per-step JSONL files with their W&B / TensorBoard mirrors, and the end summary.

Every line is written under the shared metric names (`epic_slime.metric_names`) that the trainer
and the driver use when they make it, so the files, W&B and TensorBoard show what the slime path
logs.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

from epic_slime import metric_names as names
from epic_slime.evaluation.records import EvalRecord, write_records
from epic_slime.provenance import versions
from .config import ConfigError, RuntimeConfig
from .plots import PLOT_NAMES
from .progress import say
from .tensorboard_log import log_scalars, open_tensorboard

HELDOUT = "heldout"  # the benchmark name of the task's held-out prompts in eval files
METRICS_FILE, BATCHES_FILE = "metrics.jsonl", "batches.jsonl"
EVAL_METRICS_FILE, EVAL_RECORDS_FILE = "eval_metrics.jsonl", "eval_records.jsonl"
SUMMARY_FILE, CONFIG_FILE = "summary.json", "config.json"
STEP_FILES = (METRICS_FILE, BATCHES_FILE, EVAL_METRICS_FILE, EVAL_RECORDS_FILE)  # one line per step / eval
RUN_FILES = (*STEP_FILES, SUMMARY_FILE, CONFIG_FILE)


class RunFolderTaken(ConfigError):
    """--output-dir holds another run: a ConfigError that `epic-slime train` reports only after the
    config itself has passed every check (a bad value is the thing to fix first)."""


def existing_run(cfg: RuntimeConfig) -> list[Path]:
    """The files of an earlier run in cfg's output directory (and its checkpoints), if any."""
    out, ckpt = Path(cfg.output_dir), cfg.checkpoint_dir
    found = [out / n for n in RUN_FILES if (out / n).exists()]
    if ckpt.is_dir() and any(ckpt.iterdir()):
        found.append(ckpt)
    return found


def _remove(paths) -> None:
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def check_output_dir(cfg: RuntimeConfig, resume_path: Path | None) -> list[Path]:
    """Refuse to mix two runs in one directory: an existing run needs --load (resume it) or
    --overwrite (clear it first: only this runtime's own files and the checkpoints, nothing else).
    Changes nothing (`epic-slime train` calls it before its heavy imports); returns the earlier run's files."""
    out, ckpt = Path(cfg.output_dir), cfg.checkpoint_dir
    found = existing_run(cfg)
    if not found:
        return found
    if cfg.overwrite:
        if resume_path is not None and ckpt.resolve() in resume_path.resolve().parents:
            raise ConfigError(
                f"--overwrite would delete the checkpoint --load {cfg.load} resumes from; drop one of them"
            )
    elif resume_path is None:
        listed = ", ".join(p.name for p in found)
        hint = f"--load {ckpt} to resume it, " if ckpt in found else ""
        raise RunFolderTaken(
            f"--output-dir {out} already holds a run ({listed}): pass {hint}--overwrite to replace "
            "it, or choose another --output-dir (e.g. --output-dir runs/check)"
        )
    return found


def prepare_output_dir(cfg: RuntimeConfig, resume_path: Path | None) -> None:
    """check_output_dir, then clear the earlier run under --overwrite."""
    found = check_output_dir(cfg, resume_path)
    if found and cfg.overwrite:
        out = Path(cfg.output_dir)
        _remove([*found, *(out / n for n in PLOT_NAMES)])
        say(f"--overwrite: cleared the previous run in {out}")


def discard_unsaved_run(cfg: RuntimeConfig) -> None:
    """Remove the files of a run stopped before its first checkpoint, so that the same command can
    start it again (nothing in them could be resumed; other files in the directory stay)."""
    out = Path(cfg.output_dir)
    _remove([*(out / n for n in RUN_FILES), *(out / n for n in PLOT_NAMES)])
    if cfg.checkpoint_dir.is_dir() and not any(cfg.checkpoint_dir.iterdir()):
        cfg.checkpoint_dir.rmdir()


def write_config(cfg: RuntimeConfig) -> None:
    """config.json: the values actually used, plus the versions of the code that used them."""
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / CONFIG_FILE, "w") as f:
        json.dump({**cfg.to_dict(), "versions": versions()}, f, indent=1, sort_keys=True)


class RunLog:
    """The per-step files of a run (metrics, batches, evaluations) and their W&B / TensorBoard mirrors."""

    def __init__(self, cfg: RuntimeConfig):
        self.cfg = cfg
        self.out = Path(cfg.output_dir)
        self.metrics_file = None
        self.wandb = None
        self.tensorboard = None

    def open_mirrors(self) -> None:
        self.wandb = _open_wandb(self.cfg)
        self.tensorboard = open_tensorboard(self.cfg.use_tensorboard, self.cfg.tensorboard_dir, self.cfg.output_dir)

    def close_mirrors(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
        if self.tensorboard is not None:
            self.tensorboard.close()

    def open_files(self, resumed_step: int | None) -> None:
        """Start the step files empty, or (resuming) keep their lines up to the checkpoint's step, so
        each file stays one line per step."""
        for name in STEP_FILES:
            path = self.out / name
            if resumed_step is None:
                path.write_text("")
            elif path.exists():
                keep = [
                    ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= resumed_step
                ]
                path.write_text("".join(ln + "\n" for ln in keep))
        self.metrics_file = open(self.out / METRICS_FILE, "a")

    def close_files(self) -> None:
        if self.metrics_file is not None:
            self.metrics_file.close()
            self.metrics_file = None

    def metrics(self, line: dict) -> None:
        """One step's line: metrics.jsonl, W&B and TensorBoard."""
        self.metrics_file.write(json.dumps(line) + "\n")
        self.metrics_file.flush()
        if self.wandb is not None:
            self.wandb.log(line, step=line["step"])
        if self.tensorboard is not None:
            log_scalars(self.tensorboard, line, line["step"])

    def batch(
        self,
        step: int,
        trained_ids: list[int],
        dropped_ids: list[int],
        lags: list[int],
        model_versions: list[list[int]] | None = None,
    ) -> None:
        """batches.jsonl: which prompts a step trained and dropped, and the trained groups' lags; for the
        agent task also each trained group's model-token versions (``train_step.model_versions``)."""
        line = {"step": step, "trained_group_ids": trained_ids, "dropped_group_ids": dropped_ids, "lags": lags}
        if model_versions is not None:
            line["model_versions"] = model_versions
        with open(self.out / BATCHES_FILE, "a") as f:
            f.write(json.dumps(line) + "\n")

    def evaluation(
        self,
        step: int,
        result: dict,
        version: int,
        correct: list[list[bool]],
        weight_version: int | None = None,
        tool_counts: list[list[dict]] | None = None,
    ) -> None:
        """eval_metrics.jsonl (one line per evaluation) and eval_records.jsonl (one record per
        sample, the evaluation package's format, so `epic-slime report` reads local runs as-is).
        Records are keyed by ``version`` (the one the eval was due on) and name ``weight_version``,
        the one the eval worker scored (default: the same). ``tool_counts`` (the agent task): each
        sample's ``tool_calls``, ``tool_errors``, ``turns`` [prompt][sample], carried by its record."""
        with open(self.out / EVAL_METRICS_FILE, "a") as f:
            f.write(json.dumps({"step": step, **result}) + "\n")
        write_records(
            str(self.out / EVAL_RECORDS_FILE),
            [
                EvalRecord(
                    run=self.out.name,
                    method=self.cfg.policy_loss,
                    seed=self.cfg.seed,
                    step=version,
                    benchmark=HELDOUT,
                    prompt_id=str(pid),
                    sample_idx=j,
                    correct=bool(c),
                    weight_version=version if weight_version is None else int(weight_version),
                    **(tool_counts[pid][j] if tool_counts is not None else {}),
                )
                for pid, row in enumerate(correct)
                for j, c in enumerate(row)
            ],
        )


def eval_key(cfg: RuntimeConfig) -> str:
    return f"eval/{HELDOUT}/mean@{cfg.n_samples_per_eval_prompt}"


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def run_outcome(out: Path, cfg: RuntimeConfig) -> dict:
    """What the end-of-run summary reports, from the run's own files (so resumed runs count all steps)."""
    rows = _read_jsonl(out / METRICS_FILE)
    key = eval_key(cfg)
    eval_rows = [e for e in _read_jsonl(out / EVAL_METRICS_FILE) if key in e]
    evals = [(e["eval/version"], e[key]) for e in eval_rows]
    # the latest version, last written (sorted is stable: of two rows at one version, the later)
    final_row = sorted(eval_rows, key=lambda e: e["eval/version"])[-1] if eval_rows else {}
    final = (final_row["eval/version"], final_row[key]) if eval_rows else None
    # the agent task: the tool's counts per response at that evaluation (rollout_agent.tool_stats)
    tool = {k.split("/")[-1]: v for k, v in final_row.items() if k.endswith("_per_response")}
    rewards = [r[names.REWARD_MEAN] for r in rows]
    n = max(1, min(10, len(rewards) // 2))
    best = max(evals, key=lambda e: (e[1], -e[0])) if evals else None  # earliest step on ties
    return {
        "reward_first": statistics.fmean(rewards[:n]) if rewards else None,
        "reward_last": statistics.fmean(rewards[-n:]) if rewards else None,
        "reward_window": n,
        "eval_key": key,
        "eval_start": evals[0][1] if evals else None,
        "eval_best": best[1] if best else None,
        "eval_best_step": best[0] if best else None,
        "eval_final": final[1] if final else None,
        "eval_final_step": final[0] if final else None,
        **({"eval_final_tool": tool} if tool else {}),
        "staleness_max": max((r[names.STALENESS_MAX] for r in rows), default=None),
        "bad_tokens": sum(r.get(names.BAD_TOKENS, 0) for r in rows),
        "skipped_steps": sum(r.get(names.SKIPPED_STEPS, 0) for r in rows),
        "output_dir": str(out),
    }


def write_summary(cfg: RuntimeConfig, summary: dict) -> None:
    with open(Path(cfg.output_dir) / SUMMARY_FILE, "w") as f:
        json.dump(summary, f, indent=1)


def _open_wandb(cfg: RuntimeConfig):
    if not cfg.use_wandb or cfg.wandb_mode == "disabled":
        return None
    try:
        import wandb
    except ImportError:
        raise RuntimeError(
            "--use-wandb needs the wandb package: pip install wandb "
            "(or drop --use-wandb; metrics.jsonl is always written)"
        ) from None
    return wandb.init(
        project=cfg.wandb_project,
        mode=cfg.wandb_mode,
        dir=str(cfg.output_dir),
        name=Path(cfg.output_dir).name,
        config=cfg.to_dict(),
    )
