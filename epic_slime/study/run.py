"""The study's run phase: execute every planned run as an ordinary `train` run, measure it on the test
split at its validation-selected and its last checkpoint, and measure the warm start itself (chance
level, test score, entropy profile). Everything it learns goes into files (`study.files`).

Resumable: a run is finished when its `result.json` exists; a killed study skips finished runs on
restart, and an unfinished run directory is removed and rerun from scratch (a fresh output dir).
"""

from __future__ import annotations

import functools
import shutil
import statistics
import time
from collections import Counter
from pathlib import Path

from .analysis import select_checkpoint
from .files import (
    RESULT,
    WARM_START,
    finished_results,
    read_jsonl,
    read_warm_start,
    record_provenance,
    run_dir as _run_dir,
    write_json_atomically,
)
from .plan import RunSpec, StudyConfig, plan, run_argv


def run_dir_of(out: Path, spec: RunSpec) -> Path:
    return _run_dir(out, spec.setting, spec.method, spec.seed)


def weights_at(run_cfg, run_dir: Path, version: int, progress: bool = False) -> dict:
    """Model weights of version v: the warm start for 0, else the step checkpoint. progress: the warm
    start says it trains, with a progress bar (minutes at the quick study's 2500 steps, once)."""
    import torch

    if version == 0:
        from epic_slime.runtime.warmstart import warm_start_for

        return warm_start_for(run_cfg, progress=progress)[0]
    path = run_cfg.checkpoint_dir / f"step_{version:06d}" / "trainer.pt"
    if not path.exists():
        raise FileNotFoundError(f"study: no checkpoint for version {version} in {run_dir} ({path})")
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def evaluate_split(run_cfg, state: dict, version: int, split: str, n_prompts: int) -> list[list[bool]]:
    """correct[prompt][sample] of `n_samples_per_eval_prompt` samples per prompt of a split."""
    from dataclasses import replace

    from epic_slime.runtime.rollout import PolicyEngine
    from epic_slime.runtime.tasks import split_problems

    problems = split_problems(split, replace(run_cfg.task, eval_num_prompts=n_prompts))
    engine = PolicyEngine(run_cfg.model, state, version, seed=run_cfg.seed)
    return engine.evaluate(
        problems,
        k=run_cfg.n_samples_per_eval_prompt,
        temperature=run_cfg.eval_temperature,
        top_p=run_cfg.eval_top_p,
        max_new_tokens=run_cfg.rollout_max_response_len,
        seed=run_cfg.seed,
    )


def _mean(correct: list[list[bool]]) -> float:
    return statistics.fmean(c for row in correct for c in row)


def finish_run(
    cfg: StudyConfig, spec: RunSpec, run_cfg, run_dir: Path, wall_s: float, failed: str | None = None
) -> dict:
    """Select on validation, evaluate the test split at the selected and the final version.

    failed: the error that stopped the run (a numerical divergence); its last evaluated checkpoint
    counts as its final one, and the study's analyses count the run as collapsed."""
    k = run_cfg.n_samples_per_eval_prompt
    evals = [(r["eval/version"], r[f"eval/heldout/mean@{k}"]) for r in read_jsonl(run_dir / "eval_metrics.jsonl")]
    if failed:  # only versions whose checkpoint was written can be evaluated
        evals = [
            (v, x) for v, x in evals if v == 0 or (run_cfg.checkpoint_dir / f"step_{v:06d}" / "trainer.pt").exists()
        ]
    version, val_score = select_checkpoint(evals)
    final_version = max(v for v, _ in evals)
    test_sel = evaluate_split(run_cfg, weights_at(run_cfg, run_dir, version), version, "test", cfg.test_prompts)
    test_final = (
        test_sel
        if final_version == version
        else evaluate_split(
            run_cfg, weights_at(run_cfg, run_dir, final_version), final_version, "test", cfg.test_prompts
        )
    )
    result = {
        "setting": spec.setting,
        "method": spec.method,
        "seed": spec.seed,
        "k": k,
        "validation_curve": evals,
        "selected_version": version,
        "validation_at_selected": val_score,
        "test_at_selected": _mean(test_sel),
        "final_version": final_version,
        "validation_at_final": dict(evals)[final_version],
        "test_at_final": _mean(test_final),
        "test_correct_at_selected": test_sel,
        "wall_s": wall_s,
        "failed": failed,
    }
    shutil.rmtree(run_cfg.checkpoint_dir, ignore_errors=True)  # result.json holds what the study needs
    write_json_atomically(run_dir / RESULT, result)  # the "finished" marker, written last
    return result


def execute(cfg: StudyConfig, out: Path, log=print, provenance: tuple[str, str] | None = None) -> list[dict]:
    """Run every planned run that has no result yet; returns every run's result."""
    from epic_slime.runtime.config import parse_config
    from epic_slime.runtime.driver import run_training
    from epic_slime.runtime.local_ray import init_local_ray

    specs = plan(cfg)
    cache_dir = out / "warm_start"
    todo = [s for s in specs if not (run_dir_of(out, s) / RESULT).exists()]
    log(f"[study] {len(specs)} runs planned, {len(specs) - len(todo)} already finished, {len(todo)} to run")
    for spec in todo:  # every run's config is checked before anything starts
        parse_config(run_argv(cfg, spec, run_dir_of(out, spec), cache_dir))
    t0, durations = time.time(), []
    if todo:
        if provenance is not None:
            record_provenance(out, *provenance, runs_executed=len(todo))
        init_local_ray(num_cpus=4)
    try:
        previous = read_warm_start(out)  # in-process (no Ray): also after every run has finished
        if previous is None or missing_warm_start_seeds(cfg, previous):
            measure_warm_start(cfg, out, log, previous=previous)
        for i, spec in enumerate(todo):
            run_dir = run_dir_of(out, spec)
            if run_dir.exists():
                shutil.rmtree(run_dir)  # an unfinished run: start it again in a fresh directory
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            run_cfg = parse_config(run_argv(cfg, spec, run_dir, cache_dir))
            t = time.time()
            try:
                run_training(run_cfg, reuse_ray=True)
            except FloatingPointError as e:  # a diverged run is a result, not a crash (Ray re-raises the trainer's
                # error as an instance of its cause's type, so this catches it from the trainer actor too)
                if not (run_dir / "eval_metrics.jsonl").exists():
                    raise
                log(f"[study] {spec.name} failed ({type(e).__name__}: {e}); kept as a failed run")
                finish_run(cfg, spec, run_cfg, run_dir, time.time() - t, failed=f"{type(e).__name__}: {e}")
            else:
                finish_run(cfg, spec, run_cfg, run_dir, time.time() - t)
            durations.append(time.time() - t)
            done = len(specs) - len(todo) + i + 1
            typical = durations[1:] or durations  # the first run also trains the warm start
            left = statistics.fmean(typical) * (len(todo) - i - 1)
            log(
                f"[study] {done}/{len(specs)} done: {spec.name} in {durations[-1]:.0f}s; "
                f"elapsed {time.time() - t0:.0f}s, about {left / 60:.1f} min left"
            )
            measure_other_warm_start(cfg, out, spec.setting, log)
        finished = {s.setting for s in specs if (run_dir_of(out, s) / RESULT).exists()}
        for setting in sorted(finished):  # a resumed study whose runs had all finished before
            measure_other_warm_start(cfg, out, setting, log)
    finally:
        if todo:
            import ray

            ray.shutdown()
    return finished_results(out, specs)


CHANCE_SAMPLE = 20_000  # training problems the answer distribution is estimated from


def chance_level(train_problems, test_problems) -> dict:
    """Accuracy of answering without reading the prompt: the most frequent answer of the training
    distribution, its frequency there (the expected score of that guess) and its score on the test split;
    and a uniform guess over the answers that occur. The guess is fitted on training problems, not on the
    split it is scored on, so that chance is not inflated by the split's own sampling noise."""
    counts = Counter(p.answer for p in train_problems)
    n_train = sum(counts.values())
    best = max(counts, key=lambda a: (counts[a], -a))
    test = [p.answer for p in test_problems]
    return {
        "chance": counts[best] / n_train,
        "best_constant_answer": best,
        "best_constant_on_test": sum(a == best for a in test) / len(test),
        "uniform_guess": 1.0 / len(counts),
        "distinct_answers": len(counts),
        "train_problems": n_train,
        "problems": len(test),
    }


def missing_warm_start_seeds(cfg: StudyConfig, record: dict) -> list[int]:
    """Seeds of the config that warm_start.json has no score for (a study run in stages, or resumed
    with more seeds, than the invocation that measured it)."""
    known = {int(s) for s in record.get("test_by_seed", {})}
    return [s for s in cfg.seeds if s not in known]


def measure_warm_start(cfg: StudyConfig, out: Path, log=print, previous: dict | None = None) -> dict:
    """The warm start on the test split (per seed, with the runs' evaluation streams: version 0 of a run),
    its entropy profile on the validation prompts, and the task's chance level; written to warm_start.json.

    previous: the record an earlier invocation wrote, which lacks some of cfg's seeds. It is measured
    again for the union of both seed lists (evaluation only: the weights are cached), and keeps the
    scores of other warm starts (another task's) and each setting's entry that covers every seed, so
    that a study run in stages of different seeds ends with one record of all of them."""
    from dataclasses import replace

    from epic_slime.runtime.config import parse_config
    from epic_slime.runtime.tasks import split_problems
    from epic_slime.runtime.tasks import train_problem

    from .entropy import warm_start_entropy_profile

    if previous is not None:
        cfg = replace(cfg, seeds=sorted({int(s) for s in previous.get("test_by_seed", {})} | set(cfg.seeds)))
    t = time.time()
    by_seed, per_prompt, state, run_cfg = {}, {}, None, None
    for seed in cfg.seeds:
        spec = next(s for s in plan(cfg) if s.seed == seed)
        run_cfg = parse_config(run_argv(cfg, spec, run_dir_of(out, spec), out / "warm_start"))
        if state is None:
            state = weights_at(run_cfg, run_dir_of(out, spec), 0, progress=True)
        correct = evaluate_split(run_cfg, state, 0, "test", cfg.test_prompts)
        by_seed[seed] = _mean(correct)
        per_prompt[seed] = [statistics.fmean(row) for row in correct]
    test = split_problems("test", replace(run_cfg.task, eval_num_prompts=cfg.test_prompts))
    validation = split_problems("validation", replace(run_cfg.task, eval_num_prompts=run_cfg.task_eval_num_prompts))
    train = [train_problem(i, 0, run_cfg.task) for i in range(CHANCE_SAMPLE)]
    record = {
        "test_by_seed": by_seed,
        "test_mean": statistics.fmean(by_seed.values()),
        "test_by_prompt": [statistics.fmean(col) for col in zip(*per_prompt.values())],
        "chance_test": chance_level(train, test),
        "chance_validation": chance_level(train, validation),
        "entropy_profile": warm_start_entropy_profile(run_cfg, state, validation),
        "measure_s": time.time() - t,
    }
    first = cfg.settings[0]["name"]
    record["warm_start_scores"] = {
        **(previous or {}).get("warm_start_scores", {}),
        **{_identity_of(cfg, out, first, seed)[1]: by_seed[seed] for seed in cfg.seeds},
    }
    record["by_setting"] = {
        name: entry for name, entry in (previous or {}).get("by_setting", {}).items() if _covers(entry, cfg.seeds)
    }
    # settings on the same warm start as the first; the others are measured after their first run
    warm_starts_by_setting(cfg, out, record, [s["name"] for s in cfg.settings], train=False)
    record["measure_s"] = time.time() - t
    write_json_atomically(out / WARM_START, record)
    log(
        f"[study] warm start: test mean@{run_cfg.n_samples_per_eval_prompt} {record['test_mean']:.3f} "
        f"(chance {record['chance_test']['chance']:.3f}) in {record['measure_s']:.0f}s"
    )
    return record


def _warm_start_identity(run_cfg) -> tuple:
    """What makes two settings' warm starts (and their test splits) the same policy on the same task.
    The init file is named only when set, so the identities recorded before it existed still match, and by
    its content too: another file written to the same path is another warm start."""
    identity = (
        repr(run_cfg.model),
        repr(run_cfg.task),
        run_cfg.warm_start_steps,
        run_cfg.warm_start_lr,
        run_cfg.warm_start_batch_size,
        run_cfg.warm_start_answer_noise,
        run_cfg.warm_start_step_noise,
        run_cfg.warm_start_seed_or_seed,
        run_cfg.n_samples_per_eval_prompt,
        run_cfg.eval_temperature,
        run_cfg.eval_top_p,
        run_cfg.rollout_max_response_len,
    )
    return identity + (_init_identity(run_cfg.warm_start_init),) if run_cfg.warm_start_init else identity


def _init_identity(path: str) -> tuple:
    resolved = Path(path).resolve()
    try:
        stat = resolved.stat()
    except OSError:
        return ("init", path, "missing")  # its run fails with the field's one-line error
    return ("init", path, _sha256(str(resolved), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=16)
def _sha256(path: str, mtime_ns: int, size: int) -> str:
    """Keyed by modification time and size too: a rewritten file is hashed again."""
    from epic_slime.data.hub import file_sha256

    return file_sha256(path)


def _identity_of(cfg: StudyConfig, out: Path, setting: str, seed: int):
    from epic_slime.runtime.config import parse_config

    spec = RunSpec(setting, cfg.methods[0], seed)
    run_cfg = parse_config(run_argv(cfg, spec, run_dir_of(out, spec), out / "warm_start"))
    return run_cfg, f"{_warm_start_identity(run_cfg)!r}|seed {seed}"


def warm_starts_by_setting(cfg: StudyConfig, out: Path, record: dict, only: list[str], train: bool) -> None:
    """Add to record["by_setting"] {setting: {test_by_seed, test_mean, chance}}: the warm start each
    setting starts from, on the test split of its own task (the stress ladder has a long-response task
    beside the short one). Scores are kept per (warm start, seed) in record["warm_start_scores"], so a
    warm start is measured once however many settings share it. train=False: only settings whose every
    score is known already (no warm start is trained or evaluated)."""
    from dataclasses import replace

    from epic_slime.runtime.tasks import split_problems
    from epic_slime.runtime.tasks import train_problem

    cfg = replace(cfg, seeds=_record_seeds(cfg, record))  # every seed of the record, not only this invocation's
    scores = record.setdefault("warm_start_scores", {})
    by_setting = record.setdefault("by_setting", {})
    states = {}
    for name in only:
        if is_current(cfg, out, record, name):
            continue
        keys = [_identity_of(cfg, out, name, seed) for seed in cfg.seeds]
        if not train and any(key not in scores for _, key in keys):
            continue
        for seed, (run_cfg, key) in zip(cfg.seeds, keys):
            if key not in scores:
                ident = key.rsplit("|", 1)[0]
                if ident not in states:
                    states[ident] = weights_at(
                        run_cfg, run_dir_of(out, RunSpec(name, cfg.methods[0], seed)), 0, progress=train
                    )
                scores[key] = _mean(evaluate_split(run_cfg, states[ident], 0, "test", cfg.test_prompts))
        run_cfg = keys[0][0]
        test = split_problems("test", replace(run_cfg.task, eval_num_prompts=cfg.test_prompts))
        train_set = [train_problem(i, 0, run_cfg.task) for i in range(CHANCE_SAMPLE)]
        by_seed = {seed: scores[key] for seed, (_, key) in zip(cfg.seeds, keys)}
        by_setting[name] = {
            "test_by_seed": by_seed,
            "test_mean": statistics.fmean(by_seed.values()),
            "chance": chance_level(train_set, test)["chance"],
        }


def _record_seeds(cfg: StudyConfig, record: dict) -> list[int]:
    return sorted({int(s) for s in record.get("test_by_seed", {})} | set(cfg.seeds))


def _covers(entry: dict | None, seeds: list[int]) -> bool:
    """A by_setting entry that holds a score for every one of these seeds."""
    return entry is not None and {int(s) for s in entry["test_by_seed"]} >= set(seeds)


def is_current(cfg: StudyConfig, out: Path, record: dict, setting: str) -> bool:
    """The setting's by_setting entry holds, for every seed, the score of the warm start the setting
    has now: a setting whose warm-start recipe changed after it was measured is measured again, not
    reported with the old policy's score."""
    entry = record.get("by_setting", {}).get(setting)
    seeds = _record_seeds(cfg, record)
    if not _covers(entry, seeds):
        return False
    scores, by_seed = record.get("warm_start_scores", {}), {int(s): v for s, v in entry["test_by_seed"].items()}
    return all(scores.get(_identity_of(cfg, out, setting, seed)[1]) == by_seed[seed] for seed in seeds)


def measure_other_warm_start(cfg: StudyConfig, out: Path, setting: str, log=print) -> None:
    """After a run of a setting whose warm start was not measured yet (the run trained and cached it):
    measure it and record it for every setting that shares it (warm_start.json)."""
    record = read_warm_start(out)
    if is_current(cfg, out, record, setting):
        return
    t = time.time()
    warm_starts_by_setting(cfg, out, record, [setting], train=True)
    warm_starts_by_setting(cfg, out, record, [s["name"] for s in cfg.settings], train=False)
    write_json_atomically(out / WARM_START, record)
    log(
        f"[study] warm start of {setting}: test {record['by_setting'][setting]['test_mean']:.3f} "
        f"in {time.time() - t:.0f}s"
    )
