"""Issue 28, section 2: an eval scores the weights it is keyed by, on both schedules.

slime's RolloutManager is a Ray actor that serves one call at a time, in the order they were
submitted; the weight push (``RayTrainGroup.update_weights``) asks it for the engines
(``get_updatable_engines_and_lock``), so in the overlap schedule the push after rollout r waits
behind ``generate(r + 1)``. The fake below is that actor: one worker thread, FIFO, and engines
whose weight version the push raises, as SGLang's ``weight_version`` does. Its eval runs the
project's real eval hook on samples tagged with the engines' version, so each record names the
weights it scored, and ``read_records`` (what ``epic-slime report`` reads with) refuses a record
whose step and weights disagree.

Before the fix records named no weights (nothing could notice an eval keyed step r scoring
rollout r - 1's policy); ``test_an_eval_before_its_push_is_refused_by_the_report`` runs a loop
with the eval and the push swapped and fails at read time, naming file, step and version.
"""

from __future__ import annotations

import types
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from epic_slime.evaluation import read_records
from epic_slime.evaluation.records import PRE_TRAINING_STEP, VersionMismatchError
from epic_slime.slime import eval_hooks
from epic_slime.slime import rollout as project_rollout
from epic_slime.slime import train
from epic_slime.slime.cli.flags import ROLLOUT_FUNCTION_PATH

BENCH, PROMPTS, K = "aime_2024", 2, 2


class SerialRolloutManager:
    """slime's RolloutManager as the driver meets it: ``x.remote(...)`` queues a call on one worker."""

    def __init__(self, args, log: list):
        self.args, self.log = args, log
        self.version = 0  # SGLang's weight_version: the pushes so far ("default" before the first)
        self._actor = ThreadPoolExecutor(max_workers=1)
        for name in ("generate", "eval", "save", "get_updatable_engines_and_lock"):
            setattr(self, name, types.SimpleNamespace(remote=self._method(getattr(self, "_" + name))))

    def _method(self, fn):
        return lambda *a, **k: self._actor.submit(fn, *a, **k)

    def _generate(self, rollout_id):
        if project_rollout._first_rollout_id is None:  # what the project's rollout function records
            project_rollout._first_rollout_id = rollout_id
        self.log.append(("generate", rollout_id, self.version))
        return ("data", rollout_id)

    def _eval(self, rollout_id):
        samples = [
            types.SimpleNamespace(
                index=i, weight_versions=[str(self.version)], metadata={"benchmark": BENCH, "problem_id": f"p{i // K}"}
            )
            for i in range(PROMPTS * K)
        ]
        data = {BENCH: {"rewards": [float(i % 2) for i in range(PROMPTS * K)], "samples": samples}}
        self.log.append(("eval", rollout_id, self.version))
        eval_hooks.log_eval_rollout(rollout_id, self.args, data, {})

    def _save(self, rollout_id):
        self.log.append(("save", rollout_id, self.version))

    def _get_updatable_engines_and_lock(self):
        return ["engine"]

    def close(self):
        self._actor.shutdown(wait=True)


class ActorGroup:
    """slime's RayTrainGroup: async_train returns refs; update_weights blocks until the push landed."""

    def __init__(self, manager: SerialRolloutManager, log: list):
        self.manager, self.log = manager, log

    def async_train(self, rollout_id, data):
        assert data == ("data", rollout_id)
        self.log.append(("train", rollout_id, self.manager.version))
        return None

    def save_model(self, rollout_id, force_sync=False):
        self.log.append(("save_model", rollout_id, self.manager.version))

    def clear_memory(self):
        self.log.append(("clear_memory", None, self.manager.version))

    def update_weights(self):
        # the Megatron actor asks the RolloutManager for the engines: queued behind its calls in flight
        self.manager.get_updatable_engines_and_lock.remote().result()
        self.manager.version += 1
        self.log.append(("update_weights", None, self.manager.version))


def _get(ref):
    return ref.result() if isinstance(ref, Future) else ref


def _args(path, **overrides):
    values = dict(
        start_rollout_id=0,
        num_rollout=4,
        eval_interval=1,
        save_interval=2,
        rollout_global_dataset=True,
        skip_eval_before_train=False,
        max_staleness=1,
        offload_rollout=False,
        offload_train=False,
        release_train=False,
        check_weight_update_equal=False,
        colocate=False,
        epic_eval_records_path=str(path),
        epic_run_name="r1",
        epic_method="epic",
        seed=1,
        n_samples_per_eval_prompt=K,
        rollout_function_path=ROLLOUT_FUNCTION_PATH,
    )
    values.update(overrides)
    return types.SimpleNamespace(**values)


@pytest.fixture
def process(monkeypatch):
    """One fresh RolloutManager process: no training rollout generated, the hook's state empty."""
    monkeypatch.setattr(eval_hooks, "_last_written", {})
    monkeypatch.setattr(project_rollout, "_first_rollout_id", None)


def _run(args, loop):
    log: list = []
    manager = SerialRolloutManager(args, log)
    actor = ActorGroup(manager, log)
    try:
        train.push_initial_weights(args, manager, actor, _get)
        trace = loop(args, manager, actor, None, _get)
    finally:
        manager.close()
    return trace, log


def _steps_and_weights(path) -> dict[int, set]:
    out: dict[int, set] = {}
    for r in read_records(str(path)):
        out.setdefault(r.step, set()).add(r.weight_version)
    return out


@pytest.mark.parametrize("loop", [train.async_training_loop, train.sync_training_loop])
def test_every_eval_scores_the_weights_its_step_names(tmp_path, process, loop):
    path = tmp_path / "evals.jsonl"
    args = _args(path, max_staleness=0 if loop is train.sync_training_loop else 1)
    trace, log = _run(args, loop)
    # the engine version each eval ran on: the initial push (1) for the pre-training eval, then
    # the push after rollout r (r + 2) for the eval keyed r
    assert [(r, v) for e, r, v in log if e == "eval"] == [(0, 1)] + [(r, r + 2) for r in range(4)]
    # every record names the weights it scored, in step numbering, and they match its step
    assert _steps_and_weights(path) == {PRE_TRAINING_STEP: {PRE_TRAINING_STEP}, 0: {0}, 1: {1}, 2: {2}, 3: {3}}


def test_the_overlap_schedule_pushes_before_it_evaluates(tmp_path, process):
    """The async loop's order, pinned as the sync loop's is (test_slime_sync): per rollout r, train,
    save when due, push r's weights, then evaluate r; generate(r + 1) was asked for before training."""
    trace, _ = _run(_args(tmp_path / "e.jsonl"), train.async_training_loop)
    assert trace[0] == ("eval", 0)  # the pre-training eval (slime keys it rollout 0 too)
    trace = trace[1:]
    for r in range(4):
        events = [e for e, rid in trace if rid == r and e != "generate"]
        assert events == (
            ["train", "save", "update_weights", "eval"] if r in (1, 3) else ["train", "update_weights", "eval"]
        ), (r, events)
        if r + 1 < 4:
            assert trace.index(("generate", r + 1)) < trace.index(("train", r))


def test_a_resumed_process_counts_weight_versions_from_its_start(tmp_path, process):
    """A resume from the rollout-5 checkpoint: its pushes count from 1 again, on step 5's weights."""
    path = tmp_path / "evals.jsonl"
    _run(_args(path, start_rollout_id=6, num_rollout=8), train.async_training_loop)
    assert _steps_and_weights(path) == {6: {6}, 7: {7}}


def _eval_before_push_loop(args, manager, actor, per_epoch, get):
    """The overlap loop with the eval and the push swapped: the bug this section guards against."""
    for rollout_id in range(args.start_rollout_id, args.num_rollout):
        data = get(manager.generate.remote(rollout_id))
        get(actor.async_train(rollout_id, data))
        get(manager.eval.remote(rollout_id))
        actor.update_weights()
    return []


def test_an_eval_before_its_push_is_refused_by_the_report(tmp_path, process, capsys):
    path = tmp_path / "evals.jsonl"
    _run(_args(path, num_rollout=2), _eval_before_push_loop)
    with pytest.raises(
        VersionMismatchError,
        match=r"evals\.jsonl:\d+: run 'r1' record at step 0 scored weight "
        r"version -1",
    ):
        read_records(str(path))
    from epic_slime.evaluation import report

    assert (
        report.main(["--records", str(path), "--out", str(tmp_path / "rep"), "--no-plots"]) == 2
    )  # bad input: exit 2, as every command
    err = capsys.readouterr().err
    assert str(path) in err and "step 0" in err and "weight version -1" in err


def test_an_eval_only_process_names_the_loaded_weights(tmp_path, process):
    """An eval-only run of the rollout-6 checkpoint: the one push holds step 6's weights."""
    path = tmp_path / "evals.jsonl"
    _run(_args(path, start_rollout_id=7, num_rollout=7), train.async_training_loop)
    assert _steps_and_weights(path) == {6: {6}}


def test_served_step_translates_sglang_versions():
    assert eval_hooks.served_step("1", PRE_TRAINING_STEP, None) == PRE_TRAINING_STEP
    assert eval_hooks.served_step("default", 4, None) == 3  # before any push: not step 4's weights
    assert eval_hooks.served_step("3", 1, 0) == 1  # f = 0: version v holds step v - 2
    assert eval_hooks.served_step(2, 9, 6) == 6


def test_an_eval_sample_that_spans_a_push_names_its_oldest_weights():
    """A request aborted by a push and finished on the next weights carries both versions: its record
    names the older step (so the report refuses an eval partly scored before its step's push)."""
    sample = types.SimpleNamespace(index=0, weight_versions=["3", "4"], metadata={"benchmark": "aime_2024"})
    data = {"aime_2024": {"rewards": [1.0], "samples": [sample]}}
    args = types.SimpleNamespace(n_samples_per_eval_prompt=1)
    (record,) = eval_hooks.eval_records_from_rollout(3, args, data, first_training_rollout=1, versions_known=True)
    assert record.weight_version == 2  # version 3 holds step f + 3 - 2 = 2, version 4 step 3
