"""`epic-slime study [--quick]`: every method x setting x seed as an ordinary `train` run, then the
test split at each run's validation-selected checkpoint, then tables and figures.

    epic-slime study --quick                    # configs/study/quick.yaml -> runs/study-quick
    epic-slime study                            # configs/study/default.yaml -> runs/study
    epic-slime study --config X.yaml --output-dir D [--analyze-only]

Pairing: for a seed, every method gets the same warm start (`warm_start_seed`), the same data order
and rollout sampling streams (both keyed by the seed and the data position) and the same
validation / test prompts and evaluation streams (keyed by the seed and the version).
Resumable: a run is finished when its `result.json` exists; a killed study skips finished runs on
restart, and an unfinished run directory is removed and rerun from scratch (a fresh output dir).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from .analysis import select_checkpoint

REPO = Path(__file__).resolve().parents[2]
QUICK_CONFIG = REPO / "configs" / "study" / "quick.yaml"
DEFAULT_CONFIG = REPO / "configs" / "study" / "default.yaml"
RESULT = "result.json"
_STUDY_KEYS = {"seeds", "methods", "settings", "test_prompts", "train"}
# run keys the study sets itself (per run) and a config may not override
_RESERVED = {"seed", "output_dir", "policy_loss", "save_interval", "save", "load", "progress", "plots",
             "warm_start_cache_dir"}


class StudyConfigError(ValueError):
    """Bad study configuration; the message names the field and the value."""


@dataclass(frozen=True)
class StudyConfig:
    seeds: list[int]
    methods: list[str]
    settings: list[dict]
    test_prompts: int
    train: dict
    path: str


@dataclass(frozen=True)
class RunSpec:
    setting: str
    method: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.setting}/{self.method}_s{self.seed}"


def load_study_config(path: str | Path) -> StudyConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise StudyConfigError(f"--config: file not found: {path}") from None
    if not isinstance(data, dict):
        raise StudyConfigError(f"{path}: top level must be a mapping")
    unknown = set(data) - _STUDY_KEYS
    missing = _STUDY_KEYS - set(data)
    if unknown or missing:
        raise StudyConfigError(f"{path}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    seeds, methods, settings = data["seeds"], data["methods"], data["settings"]
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and s >= 0 for s in seeds)
            and len(set(seeds)) == len(seeds)):
        raise StudyConfigError(f"{path}: seeds must be a list of distinct non-negative integers, got {seeds!r}")
    from epic_slime.losses import LOSS_MODES
    if not (isinstance(methods, list) and methods) or any(m not in LOSS_MODES for m in methods):
        raise StudyConfigError(f"{path}: methods must be loss modes of {sorted(LOSS_MODES)}, got {methods!r}")
    if "epic" not in methods:
        raise StudyConfigError(f"{path}: methods must include 'epic' (the paired baseline), got {methods!r}")
    if not (isinstance(settings, list) and settings) or any(
            not isinstance(s, dict) or not isinstance(s.get("name"), str) for s in settings):
        raise StudyConfigError(f"{path}: settings must be a list of mappings with a 'name', got {settings!r}")
    if len({s["name"] for s in settings}) != len(settings):
        raise StudyConfigError(f"{path}: setting names must be distinct, got {[s['name'] for s in settings]}")
    train = data["train"]
    if not isinstance(train, dict):
        raise StudyConfigError(f"{path}: train must be a mapping of `epic-slime train` keys, got {train!r}")
    for where, keys in [("train", set(train)), *((f"settings[{s['name']}]", set(s) - {"name"}) for s in settings)]:
        if keys & _RESERVED:
            raise StudyConfigError(f"{path}: {where} sets {sorted(keys & _RESERVED)}, which the study sets per run")
    test_prompts = data["test_prompts"]
    if not isinstance(test_prompts, int) or test_prompts < 1:
        raise StudyConfigError(f"{path}: test_prompts must be a positive integer, got {test_prompts!r}")
    return StudyConfig(seeds=list(seeds), methods=list(methods), settings=[dict(s) for s in settings],
                       test_prompts=test_prompts, train=dict(train), path=str(path))


def plan(cfg: StudyConfig) -> list[RunSpec]:
    """Seed-major order, so that a study cut short still holds complete pairs for its first seeds."""
    return [RunSpec(s["name"], m, seed) for seed in cfg.seeds for s in cfg.settings for m in cfg.methods]


def _flags(values: dict) -> list[str]:
    argv = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            argv += [flag, str(value)]
    return argv


def run_argv(cfg: StudyConfig, spec: RunSpec, run_dir: Path, cache_dir: Path) -> list[str]:
    """The `epic-slime train` argv of one run (checkpoints at every evaluation, for selection)."""
    setting = next(s for s in cfg.settings if s["name"] == spec.setting)
    values = {**cfg.train, **{k: v for k, v in setting.items() if k != "name"}}
    interval = values.get("eval_interval", 25)
    return [*_flags(values), "--policy-loss", spec.method, "--seed", str(spec.seed),
            "--output-dir", str(run_dir), "--save-interval", str(interval), "--no-progress", "--no-plots",
            "--warm-start-cache-dir", str(cache_dir)]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]


def _weights_at(run_cfg, run_dir: Path, version: int) -> dict:
    """Model weights of version v: the warm start for 0, else the step checkpoint."""
    import torch

    if version == 0:
        from epic_slime.runtime.warmstart import load_or_train_warm_start
        state, _ = load_or_train_warm_start(
            run_cfg.model, run_cfg.task, steps=run_cfg.warm_start_steps, lr=run_cfg.warm_start_lr,
            batch_size=run_cfg.warm_start_batch_size, seed=run_cfg.warm_start_seed_or_seed,
            cache_dir=run_cfg.warm_start_cache_dir, answer_noise=run_cfg.warm_start_answer_noise)
        return state
    path = run_cfg.checkpoint_dir / f"step_{version:06d}" / "trainer.pt"
    if not path.exists():
        raise FileNotFoundError(f"study: no checkpoint for version {version} in {run_dir} ({path})")
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def evaluate_split(run_cfg, state: dict, version: int, split: str, n_prompts: int) -> list[list[bool]]:
    """correct[prompt][sample] of `n_samples_per_eval_prompt` samples per prompt of a split."""
    from dataclasses import replace

    from epic_slime.runtime.rollout import PolicyEngine
    from epic_slime.study.task import split_problems

    problems = split_problems(split, replace(run_cfg.task, eval_num_prompts=n_prompts))
    engine = PolicyEngine(run_cfg.model, state, version, seed=run_cfg.seed)
    return engine.evaluate(problems, k=run_cfg.n_samples_per_eval_prompt, temperature=run_cfg.eval_temperature,
                           top_p=run_cfg.eval_top_p, max_new_tokens=run_cfg.rollout_max_response_len,
                           seed=run_cfg.seed)


def _mean(correct: list[list[bool]]) -> float:
    return statistics.fmean(c for row in correct for c in row)


def finish_run(cfg: StudyConfig, spec: RunSpec, run_cfg, run_dir: Path, wall_s: float) -> dict:
    """Select on validation, evaluate the test split at the selected and the final version."""
    k = run_cfg.n_samples_per_eval_prompt
    evals = [(r["eval/version"], r[f"eval/heldout/mean@{k}"]) for r in read_jsonl(run_dir / "eval_metrics.jsonl")]
    version, val_score = select_checkpoint(evals)
    final_version = max(v for v, _ in evals)
    test_sel = evaluate_split(run_cfg, _weights_at(run_cfg, run_dir, version), version, "test", cfg.test_prompts)
    test_final = test_sel if final_version == version else evaluate_split(
        run_cfg, _weights_at(run_cfg, run_dir, final_version), final_version, "test", cfg.test_prompts)
    result = {"setting": spec.setting, "method": spec.method, "seed": spec.seed, "k": k,
              "validation_curve": evals, "selected_version": version,
              "validation_at_selected": val_score, "test_at_selected": _mean(test_sel),
              "final_version": final_version, "validation_at_final": dict(evals)[final_version],
              "test_at_final": _mean(test_final),
              "test_correct_at_selected": test_sel, "wall_s": wall_s}
    shutil.rmtree(run_cfg.checkpoint_dir, ignore_errors=True)   # result.json holds what the study needs
    tmp = run_dir / (RESULT + ".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(run_dir / RESULT)                                 # the "finished" marker, written last
    return result


def execute(cfg: StudyConfig, out: Path, log=print, provenance: tuple[str, str] | None = None) -> list[dict]:
    """Run every planned run that has no result yet; returns every run's result."""
    from epic_slime.runtime.config import parse_config
    from epic_slime.runtime.driver import init_local_ray, run_training

    specs = plan(cfg)
    cache_dir = out / "warm_start"
    todo = [s for s in specs if not (out / "runs" / s.name / RESULT).exists()]
    log(f"[study] {len(specs)} runs planned, {len(specs) - len(todo)} already finished, {len(todo)} to run")
    for spec in todo:     # every run's config is checked before anything starts
        parse_config(run_argv(cfg, spec, out / "runs" / spec.name, cache_dir))
    t0, durations = time.time(), []
    if todo:
        if provenance is not None:
            from .report import record_provenance
            record_provenance(out, *provenance, runs_executed=len(todo))
        init_local_ray(num_cpus=4)
    try:
        for i, spec in enumerate(todo):
            run_dir = out / "runs" / spec.name
            if run_dir.exists():
                shutil.rmtree(run_dir)      # an unfinished run: start it again in a fresh directory
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            run_cfg = parse_config(run_argv(cfg, spec, run_dir, cache_dir))
            t = time.time()
            run_training(run_cfg, reuse_ray=True)
            finish_run(cfg, spec, run_cfg, run_dir, time.time() - t)
            durations.append(time.time() - t)
            done = len(specs) - len(todo) + i + 1
            typical = durations[1:] or durations     # the first run also trains the warm start
            left = statistics.fmean(typical) * (len(todo) - i - 1)
            log(f"[study] {done}/{len(specs)} done: {spec.name} in {durations[-1]:.0f}s; "
                f"elapsed {time.time() - t0:.0f}s, about {left / 60:.1f} min left")
    finally:
        if todo:
            import ray
            ray.shutdown()
    return [json.loads((out / "runs" / s.name / RESULT).read_text()) for s in specs]


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epic-slime study", description="The paper's claims at toy scale: Table 1 "
                                "methods + EPIC ablations, paired by seed, selected on validation, reported on test.")
    p.add_argument("--quick", action="store_true", help=f"the quick study ({QUICK_CONFIG.relative_to(REPO)})")
    p.add_argument("--config", default=None, help=f"study YAML (default: {DEFAULT_CONFIG.relative_to(REPO)})")
    p.add_argument("--output-dir", default=None, help="study directory (default: runs/study or runs/study-quick)")
    p.add_argument("--analyze-only", action="store_true", help="only write tables and figures from finished runs")
    return p


def main(argv: list[str]) -> int:
    args = _build_parser().parse_args(argv)
    if args.quick and args.config:
        print("epic-slime study: error: --quick and --config exclude each other", file=sys.stderr)
        return 2
    config_path = args.config or (QUICK_CONFIG if args.quick else DEFAULT_CONFIG)
    out = Path(args.output_dir or ("runs/study-quick" if args.quick else "runs/study"))
    try:
        cfg = load_study_config(config_path)
    except (StudyConfigError, ValueError) as e:
        print(f"epic-slime study: error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    command = "epic-slime study " + " ".join(argv)
    from .report import git_commit, write_report

    commit = git_commit(REPO)      # the code that runs, taken before the runs (edits meanwhile do not count)
    t0 = time.time()
    if args.analyze_only:
        results = [json.loads((out / "runs" / s.name / RESULT).read_text()) for s in plan(cfg)
                   if (out / "runs" / s.name / RESULT).exists()]
    else:
        from epic_slime.runtime.config import ConfigError
        try:
            results = execute(cfg, out, provenance=(command.strip(), commit))
        except ConfigError as e:
            print(f"epic-slime study: error: a run's train settings are invalid: {e}", file=sys.stderr)
            return 2
    write_report(cfg, out, results, command=command.strip(), study_s=time.time() - t0, commit=commit)
    print(f"[study] wrote {out / 'study.md'} and its figures in {time.time() - t0:.0f}s")
    return 0
