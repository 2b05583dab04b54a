"""slime eval hook: ``--custom-eval-rollout-log-function-path epic_slime.slime.eval_hooks.log_eval_rollout``.

slime calls ``log_eval_rollout(rollout_id, args, data, extra_metrics)`` after each eval
rollout with ``data[name] = {"rewards": [...], "samples": [Sample, ...], ...}``. This writes one
eval record per sample (see ``epic_slime.evaluation.records``) and returns False so that slime
still logs its own ``eval/<name>`` metrics. It needs no slime import: it reads
``sample.index``, ``sample.metadata`` and the rewards, so it runs on plain objects too.

Settings on ``args`` (e.g. top-level keys of ``--custom-config-path``):
- ``epic_eval_records_path`` (required to write anything): the JSONL file records go to.
- ``epic_run_name`` (default: ``wandb_group``, else "run"), ``epic_method`` (default:
  ``policy_loss``, else "unknown"), ``seed`` (slime's ``--seed``).
Step = the rollout id (slime's ``eval/step`` without ``--wandb-always-use-train-step``), the
number of the checkpoint the evaluated weights were saved as, except the evaluation before
training rollout 0: slime gives it rollout id 0 too (with ``--eval-interval 1`` the one after
rollout 0 follows with the same id), so its records get ``PRE_TRAINING_STEP`` (-1, see
``epic_slime.evaluation.records``). It is recognised as an eval at rollout id 0 before this
process generated a training rollout (``epic_slime.slime.rollout.training_rollouts_started``);
with another rollout function, as this process's first eval when it is at rollout id 0 and
``--skip-eval-before-train`` is off (the driver's and slime's train.py schedule; under slime's
train_async.py, which has no pre-training eval, that first one would be mislabelled -1).
A sample is correct when its reward is > 0.5 (1/0 rewards, and DAPO's +1/-1 scores).
Each record names the weights it scored (``weight_version``, in step numbering): the sample's
SGLang ``weight_versions`` translated by ``served_step`` (the project's rollout function only: it
knows this process's first training rollout; with another, records name none). An eval that ran
before the push of its step's weights names the step before, is logged as an error here, and
``epic-slime report`` refuses the file.
The agent generate function's samples (``epic_slime.slime.agent_generate``: its ``TrajectoryLog`` in
``sample.metadata["agent"]``) give each record its ``tool_calls``, ``tool_errors`` (the errors of
every kind) and ``turns``; other samples' records carry none.

Resume: each eval of a training run replaces the run's records from its step on
(``replace_run_records``, atomic), so a run resumed from a checkpoint supersedes the evals its
crashed process wrote after that checkpoint, and a run restarted from scratch supersedes its
earlier attempt; other runs' records in the same file are untouched. An eval-only run
(``--num-rollout`` <= ``start_rollout_id``: it trains nothing and re-scores one checkpoint, e.g.
step -1 for the initial weights) replaces exactly its own step and keeps every other one. Within one process the steps must increase: a repeat means two
evals were keyed alike, and is refused rather than let one silently replace the other.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict

from epic_slime.evaluation.records import PRE_TRAINING_STEP, EvalRecord, replace_run_records
from epic_slime.slime import rollout as project_rollout
from epic_slime.slime.cli.flags import ROLLOUT_FUNCTION_PATH
from epic_slime.slime.stream.gate import parse_weight_version

logger = logging.getLogger(__name__)
_warned_no_path = False
# (records path, run) -> the last step this process wrote: a new process (a resume) starts empty
_last_written: dict[tuple[str, str], int] = {}


def _run_identity(args) -> tuple[str, str, int]:
    run = getattr(args, "epic_run_name", None) or getattr(args, "wandb_group", None) or "run"
    method = getattr(args, "epic_method", None) or getattr(args, "policy_loss", None) or "unknown"
    seed = getattr(args, "seed", None)
    return str(run), str(method), int(seed if seed is not None else 0)


def _reward_value(reward) -> float:
    if isinstance(reward, dict):  # slime keeps dict rewards when no reward key is set
        for key in ("score", "reward", "acc"):
            if key in reward:
                return float(reward[key])
        raise ValueError(f"eval reward is a dict without a score/reward/acc key: {sorted(reward)}")
    return float(reward)


def served_step(served, step: int, first_training_rollout: int | None) -> int:
    """The step of the weights SGLang served at weight version ``served`` (its ``weight_version``:
    the pushes of this process, the initial one 1), in the records' step numbering.

    The driver pushes once before its first training rollout ``f`` (the weights of step ``f - 1``,
    loaded or initial) and once after each trained rollout, so version ``v`` holds step
    ``f + v - 2``. Before this process trained anything (the pre-training eval, an eval-only run)
    only the initial push exists, and it holds the weights the eval is keyed by: version ``v``
    holds ``step + v - 1``."""
    version = parse_weight_version(served)
    if first_training_rollout is None:
        return step + version - 1
    return first_training_rollout + version - 2


def _sample_weights_step(sample, step: int, first_training_rollout: int | None, known: bool) -> int | None:
    versions = getattr(sample, "weight_versions", None)
    if not known or not versions:
        return None
    return served_step(min(versions, key=parse_weight_version), step, first_training_rollout)


def _agent_counts(metadata: dict) -> dict:
    """A tool-using sample's counts for its record (``TrajectoryLog`` fields), else none."""
    log = metadata.get("agent")
    if not log:
        return {}
    errors = log.get("tool_errors") or {}
    return {"tool_calls": int(log["tool_calls"]), "tool_errors": sum(errors.values()), "turns": int(log["turns"])}


def eval_records_from_rollout(
    rollout_id: int, args, data: dict, first_training_rollout: int | None = None, versions_known: bool = False
) -> list[EvalRecord]:
    """The records of one eval rollout (pure: no I/O). ``versions_known``: the samples'
    ``weight_versions`` can be translated into steps (``served_step``, with the process's
    ``first_training_rollout``), so each record names the weights it scored; else it names none."""
    run, method, seed = _run_identity(args)
    default_k = int(getattr(args, "n_samples_per_eval_prompt", None) or 1)
    records = []
    for dataset_name, entry in data.items():
        rewards = entry["rewards"]
        samples = entry.get("samples")
        if samples is not None and len(samples) != len(rewards):
            raise ValueError(f"eval dataset {dataset_name!r}: {len(samples)} samples but {len(rewards)} rewards")
        keyed = []  # (benchmark, prompt_id, order key, correct, weights step, tool counts)
        for position, reward in enumerate(rewards):
            sample = samples[position] if samples is not None else None
            metadata = getattr(sample, "metadata", None) or {}
            index = getattr(sample, "index", None)
            index = position if index is None else int(index)
            benchmark = str(metadata.get("benchmark") or dataset_name)
            prompt_id = metadata.get("problem_id")
            prompt_id = str(prompt_id) if prompt_id is not None else str(index // default_k)
            weights = _sample_weights_step(sample, int(rollout_id), first_training_rollout, versions_known)
            counts = _agent_counts(metadata)
            keyed.append((benchmark, prompt_id, index, _reward_value(reward) > 0.5, weights, counts))
        groups = defaultdict(list)
        for benchmark, prompt_id, index, correct, weights, counts in keyed:
            groups[(benchmark, prompt_id)].append((index, correct, weights, counts))
        for (benchmark, prompt_id), members in groups.items():
            for sample_idx, (_, correct, weights, counts) in enumerate(sorted(members, key=lambda m: m[0])):
                records.append(
                    EvalRecord(
                        run,
                        method,
                        seed,
                        int(rollout_id),
                        benchmark,
                        prompt_id,
                        sample_idx,
                        correct,
                        weight_version=weights,
                        **counts,
                    )
                )
    return records


def eval_step(rollout_id: int, args, first_eval_in_process: bool) -> int:
    """The record step of slime's eval at ``rollout_id``: the id, or -1 for the pre-training eval."""
    rollout_id = int(rollout_id)
    if rollout_id != 0:
        return rollout_id
    if getattr(args, "rollout_function_path", None) == ROLLOUT_FUNCTION_PATH:
        trained = project_rollout.training_rollouts_started()
    else:  # no record of training rollouts in this process: go by the schedule
        trained = not first_eval_in_process or bool(getattr(args, "skip_eval_before_train", False))
    return rollout_id if trained else PRE_TRAINING_STEP


def eval_only_run(args) -> bool:
    """An eval-only run: ``--num-rollout`` at or below the start (``launch/reeval.sh``, ``--num-rollout 0``).

    In slime's RolloutManager ``start_rollout_id`` is None when a Megatron checkpoint is loaded
    (slime sets it in the driver only after the manager got its copy of args), so ``--num-rollout
    0`` alone marks an eval-only run there; a start above a positive ``--num-rollout`` is seen only
    when ``--start-rollout-id`` is given."""
    start, end = getattr(args, "start_rollout_id", None), getattr(args, "num_rollout", None)
    if end is None:
        return False
    return int(end) <= 0 or (start is not None and int(start) >= int(end))


def log_eval_rollout(rollout_id, args, data, extra_metrics=None) -> bool:
    global _warned_no_path
    path = getattr(args, "epic_eval_records_path", None)
    if not path:
        if not _warned_no_path:
            logger.warning("epic_eval_records_path is not set: eval records are not written")
            _warned_no_path = True
        return False
    run = _run_identity(args)[0]
    key = (os.path.abspath(path), run)
    last = _last_written.get(key)
    step = eval_step(rollout_id, args, first_eval_in_process=last is None)
    if last is not None and step <= last:
        raise ValueError(
            f"eval records: run {run!r} step {step} (rollout id {rollout_id}) comes after step {last} "
            f"in this process; two evals keyed alike would replace one another in {path}"
        )
    ours = getattr(args, "rollout_function_path", None) == ROLLOUT_FUNCTION_PATH
    records = eval_records_from_rollout(
        step, args, data, first_training_rollout=project_rollout._first_rollout_id, versions_known=ours
    )
    wrong = sorted({r.weight_version for r in records if r.weight_version not in (None, step)})
    if wrong:  # written as scored (the report refuses the file), and said here where it happened
        logger.error(
            "eval at rollout id %s (step %d) scored the weights of step(s) %s: the eval ran before "
            "the push of its step's weights",
            rollout_id,
            step,
            wrong,
        )
    # an eval-only run re-scores one checkpoint: replace that step only, keep the run's others
    replace_run_records(path, records, run=run, from_step=step, to_step=step if eval_only_run(args) else None)
    _last_written[key] = step
    logger.info("wrote %d eval records for rollout %s (step %d) to %s", len(records), rollout_id, step, path)
    return False  # slime logs eval/<name> as usual
