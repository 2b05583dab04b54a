"""The synchronous schedule (--max-staleness 0) of the slime driver, colocated or not (no slime needed).

The schedule runs on fakes of slime's RolloutManager and actor group (their method names at
624b824a), with the project's real rollout function and staleness gate in between: the fake
engines tag every sample with the weight version they hold, as SGLang does, so a schedule that
generated ahead of the push would produce stale groups and the gate would refuse them.
The overlap loop's eval-after-push order is pinned in test_eval_weight_order.py, on a fake
RolloutManager that serves one call at a time as slime's does.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from epic_slime.slime import rollout
from epic_slime.slime.cli.dry_run import check_argv
from epic_slime.slime.cli.flags import ASYNCHRONOUS, SYNCHRONOUS, ProjectFlagError
from epic_slime.slime.train import (
    async_training_loop,
    push_initial_weights,
    sync_training_loop,
    training_loop_for,
)

REPO = Path(__file__).resolve().parents[2]
BASE = [
    "--loss-type",
    "custom_loss",
    "--custom-loss-function-path",
    "epic_slime.slime.loss.policy_loss",
    "--rollout-function-path",
    "epic_slime.slime.rollout.generate_rollout",
    "--rollout-batch-size",
    "4",
    "--n-samples-per-prompt",
    "2",
]


# ---- fakes at slime's interfaces -------------------------------------------------------------


@dataclasses.dataclass
class _TrainOutput:  # the shape of slime's RolloutFnTrainOutput
    samples: list
    metrics: dict | None = None


def _ledger_data_source():
    """The project's StreamingDataSource without slime's inner data source: just its prompt ledger
    (what slime's generate_rollout consumes through get_samples is recorded in it)."""
    from collections import deque

    from epic_slime.slime.stream.ledger import GroupLedger

    source = object.__new__(rollout.StreamingDataSource)
    source.ledger, source._returned = GroupLedger(), deque()
    return source


class _Engines:
    """SGLang as the schedule sees it: a weight version, and weights / KV cache on or off the GPU."""

    def __init__(self) -> None:
        self.version = 0  # SGLang's "default" before the first push
        self.weights_on = self.kv_on = True
        self.next_index = 0

    def generate_batch(self, args, rollout_id, data_source):
        assert self.weights_on and self.kv_on, f"rollout {rollout_id} generated with offloaded engines"
        groups = []
        for _ in range(args.rollout_batch_size):
            weight = "default" if self.version == 0 else str(self.version)
            group = [
                SimpleNamespace(
                    index=self.next_index, group_index=self.next_index, weight_versions=[weight], metadata={}
                )
                for _ in range(args.n_samples_per_prompt)
            ]
            data_source.ledger.consume(self.next_index, copy.deepcopy(group))  # slime: data_source.get_samples
            groups.append(group)
            self.next_index += 1
        return _TrainOutput(samples=groups, metrics={"rollout/fake": 1.0})


class _Call:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


class _FakeRolloutManager:
    """generate / eval / save / offload / onload_weights / onload_kv, as slime's RolloutManager."""

    def __init__(self, args, engines: _Engines, log: list):
        self.args, self.engines, self.log, self.metrics = args, engines, log, {}
        self.data_source = _ledger_data_source()
        self.generate = _Call(self._generate)
        self.eval = _Call(lambda rollout_id: self._record("eval", rollout_id))
        self.save = _Call(lambda rollout_id: self._record("save", rollout_id))
        self.offload = _Call(self._offload)
        self.onload_weights = _Call(self._onload_weights)
        self.onload_kv = _Call(self._onload_kv)
        self.check_weights = _Call(lambda action: self._record("check_weights", action))

    def _record(self, name, value):
        if name == "eval":
            assert self.engines.weights_on and self.engines.kv_on, "evaluation on offloaded engines"
        self.log.append((name, value))

    def _generate(self, rollout_id):
        # the project's rollout function, as slime's RolloutManager calls it
        out = rollout.generate_rollout(self.args, rollout_id, data_source=self.data_source)
        self.metrics[rollout_id] = out.metrics
        self.log.append(("generate", rollout_id))
        return ("data", rollout_id, [s for group in out.samples for s in group])

    def _offload(self):
        self.engines.weights_on = self.engines.kv_on = False
        self.log.append(("offload", None))

    def _onload_weights(self):
        self.engines.weights_on = True
        self.log.append(("onload_weights", None))

    def _onload_kv(self):
        self.engines.kv_on = True
        self.log.append(("onload_kv", None))


class _FakeActorGroup:
    """async_train / save_model / update_weights / clear_memory / create, as slime's RayTrainGroup."""

    def __init__(self, args, engines: _Engines, log: list):
        self.args, self.engines, self.log = args, engines, log
        self.trained: dict[int, list] = {}

    def async_train(self, rollout_id, data_ref):
        assert data_ref[:2] == ("data", rollout_id), "trains on the data of its own rollout"
        if self.args.colocate:
            assert not self.engines.kv_on, "Megatron trained while SGLang held the shared GPU"
        self.trained[rollout_id] = data_ref[2]
        self.log.append(("train", rollout_id))
        return ["train-ref"]

    def save_model(self, rollout_id, force_sync=False):
        self.log.append(("save_model", (rollout_id, force_sync)))

    def update_weights(self):
        if self.args.release_train:  # slime's disk push onloads the engines' weights before reloading
            self.engines.weights_on = True
        if self.args.offload_rollout:
            assert self.engines.weights_on, "weights pushed into offloaded engines"
        self.engines.version += 1
        self.log.append(("update_weights", self.engines.version))

    def clear_memory(self):
        self.log.append(("clear_memory", None))

    def create(self):
        self.log.append(("create", None))


def _args(**overrides: Any) -> SimpleNamespace:
    values = dict(
        start_rollout_id=0,
        num_rollout=5,
        eval_interval=2,
        save_interval=3,
        rollout_global_dataset=True,
        skip_eval_before_train=False,
        rollout_batch_size=4,
        n_samples_per_prompt=2,
        max_staleness=0,
        stale_policy="drop",
        colocate=False,
        offload_train=False,
        offload_rollout=False,
        release_train=False,
        check_weight_update_equal=False,
    )
    values.update(overrides)
    return SimpleNamespace(**values)


@pytest.fixture
def fake_slime(monkeypatch):
    """Fresh rollout-module state, and slime's synchronous batch generation replaced by the fake engines."""
    engines = _Engines()
    monkeypatch.setattr(rollout, "_first_rollout_id", None)
    monkeypatch.setattr(rollout, "_stream", None)
    monkeypatch.setattr(rollout, "_slime_generate_batch", engines.generate_batch)
    return engines


def _run(args, engines, loop=sync_training_loop):
    log: list = []
    manager, actor = _FakeRolloutManager(args, engines, log), _FakeActorGroup(args, engines, log)
    trace = push_initial_weights(args, manager, actor, get=lambda ref: ref)
    trace += loop(args, manager, actor, None, get=lambda ref: ref)
    return trace, log, manager, actor


# ---- the schedule ----------------------------------------------------------------------------


def test_synchronous_schedule_generates_trains_pushes_in_turn_and_every_group_is_on_policy(fake_slime):
    args = _args()
    trace, log, manager, actor = _run(args, fake_slime)
    core = [(e, r) for e, r in trace if e in ("generate", "train", "update_weights")]
    expected = [("update_weights", -1)]
    for r in range(5):
        expected += [("generate", r), ("train", r), ("update_weights", r)]
    assert core == expected  # rollout r + 1 is generated only after the push of rollout r
    assert [r for e, r in trace if e == "eval"] == [0, 1, 3]  # before training, then every 2
    assert [r for e, r in trace if e == "save"] == [2, 4]  # every 3 and the last
    assert ("save_model", (4, True)) in log and ("save_model", (2, False)) in log
    for r in range(5):  # the real gate's metrics, as logged by slime
        m = manager.metrics[r]
        assert m["rollout/staleness/max"] == 0.0 and m["rollout/staleness/frac_on_policy"] == 1.0
        assert m["rollout/staleness/admitted_groups"] == 4.0 and m["rollout/staleness/dropped_groups"] == 0.0
        assert m["rollout/staleness/trainer_version"] == r + 1 and m["rollout/fake"] == 1.0
        samples = actor.trained[r]
        assert len(samples) == 8
        assert {s.metadata["epic_group_staleness"] for s in samples} == {0}
        assert {s.metadata["epic_policy_version"] for s in samples} == {r + 1}
        # accounting: rollout r delivered and r - 1 trained when r is generated, nothing else in flight
        assert m["rollout/accounting/consumed_groups"] == 4 * (r + 1)
        assert m["rollout/accounting/trained_groups"] == 4 * r
        assert m["rollout/accounting/in_flight_groups"] == 4 and m["rollout/accounting/dropped_groups"] == 0
    assert rollout._stream is None  # no background generator with old weights
    # every prompt trained once, in order
    assert [s.index for r in range(5) for s in actor.trained[r][::2]] == list(range(20))


def test_overlap_schedule_cannot_pass_the_synchronous_gate(fake_slime):
    # generating rollout r + 1 before the push of r makes it 1 update stale: K = 0 refuses it loudly
    with pytest.raises(RuntimeError, match=r"rollout 1: 4 of 4 groups were generated \[1\] weight updates"):
        _run(_args(), fake_slime, loop=async_training_loop)


def test_resumed_synchronous_run_counts_versions_from_its_start(fake_slime):
    args = _args(start_rollout_id=3, num_rollout=5)
    trace, _, manager, _ = _run(args, fake_slime)
    assert [r for e, r in trace if e == "train"] == [3, 4] and ("eval", 0) not in trace
    assert [manager.metrics[r]["rollout/staleness/trainer_version"] for r in (3, 4)] == [1.0, 2.0]
    assert all(manager.metrics[r]["rollout/staleness/max"] == 0.0 for r in (3, 4))


def _events(trace, rollout_id):
    return [e for e, r in trace if r == rollout_id]


def test_colocated_schedule_offloads_and_onloads_in_slime_train_order(fake_slime):
    # --colocate: slime sets --offload-train and --offload-rollout
    args = _args(
        num_rollout=2,
        colocate=True,
        offload_train=True,
        offload_rollout=True,
        eval_interval=1,
        save_interval=None,
        check_weight_update_equal=True,
    )
    trace, log, manager, _ = _run(args, fake_slime)
    assert _events(trace, -1) == ["onload_weights", "update_weights", "check_weights", "onload_kv"]
    assert _events(trace, 0) == [
        "eval",
        "generate",
        "offload_rollout",
        "train",
        "onload_weights",
        "update_weights",
        "onload_kv",
        "eval",
    ]
    assert _events(trace, 1) == [
        "generate",
        "offload_rollout",
        "train",
        "onload_weights",
        "update_weights",
        "onload_kv",
        "eval",
    ]  # no --save-interval: no save
    assert ("clear_memory", None) not in log  # offload-train actors sleep by themselves
    assert all(manager.metrics[r]["rollout/staleness/max"] == 0.0 for r in (0, 1))


def test_colocated_without_offload_train_frees_train_memory(fake_slime):
    args = _args(num_rollout=1, colocate=True, offload_train=False, offload_rollout=True, eval_interval=None)
    trace, _, _, _ = _run(args, fake_slime)
    assert _events(trace, 0) == [
        "generate",
        "offload_rollout",
        "train",
        "save",
        "clear_memory",
        "onload_weights",
        "update_weights",
        "onload_kv",
    ]


def test_split_gpus_free_train_memory_every_rollout_too(fake_slime):
    """slime's train.py frees the train actors' cached memory whenever --offload-train is off, also
    when SGLang has GPUs of its own."""
    args = _args(num_rollout=2, colocate=False, offload_train=False, eval_interval=None, save_interval=None)
    trace, log, _, _ = _run(args, fake_slime)
    assert [e for e, _ in trace if e == "clear_memory"] == ["clear_memory"] * 2
    assert _events(trace, 0) == ["generate", "train", "clear_memory", "update_weights"]


@pytest.mark.parametrize("loop", [sync_training_loop, async_training_loop])
def test_num_rollout_0_with_eval_is_an_eval_only_run(fake_slime, loop):
    """--num-rollout 0: evaluate the loaded weights once, train nothing, save nothing."""
    trace, log, _, _ = _run(_args(num_rollout=0, eval_interval=5), fake_slime, loop=loop)
    assert [(e, r) for e, r in trace if e not in ("update_weights",)] == [("eval", 0)]
    # a loaded checkpoint of rollout 6: its evaluation is keyed as the one after rollout 6
    trace, _, _, _ = _run(_args(start_rollout_id=7, num_rollout=7, eval_interval=5), fake_slime, loop=loop)
    assert [(e, r) for e, r in trace if e == "eval"] == [("eval", 6)]
    trace, _, _, _ = _run(_args(num_rollout=0, eval_interval=None), fake_slime, loop=loop)
    assert [e for e, _ in trace if e != "update_weights"] == []


def test_the_data_state_is_saved_before_the_model_checkpoint(fake_slime):
    """A resume starts from the newest model checkpoint: its data state must already be on disk."""
    _, log, _, _ = _run(_args(num_rollout=4, save_interval=2, eval_interval=None), fake_slime)
    saves = [(e, a) for e, a in log if e in ("save", "save_model")]
    assert saves == [("save", 1), ("save_model", (1, False)), ("save", 3), ("save_model", (3, True))], saves


def test_release_train_recreates_actors_saves_every_rollout_and_lets_the_disk_push_onload(fake_slime):
    # colocated --release-train: slime turns --offload-train off and --offload-rollout on
    args = _args(
        num_rollout=3,
        colocate=True,
        release_train=True,
        offload_train=False,
        offload_rollout=True,
        eval_interval=None,
        save_interval=None,
    )
    trace, log, _, _ = _run(args, fake_slime)
    assert _events(trace, -1) == ["update_weights", "onload_kv"]
    for r in range(3):
        assert _events(trace, r) == [
            "generate",
            "offload_rollout",
            "create_train",
            "train",
            "save",
            "clear_memory",
            "update_weights",
            "onload_kv",
        ]
    assert [v for e, v in log if e == "save_model"] == [(0, True), (1, True), (2, True)]


def test_the_driver_picks_the_schedule_from_max_staleness():
    assert training_loop_for(_args(max_staleness=0)) is sync_training_loop
    assert training_loop_for(_args(max_staleness=2)) is async_training_loop
    assert training_loop_for(_args(max_staleness=None)) is async_training_loop


def test_synchronous_rollout_without_the_initial_push_is_refused(fake_slime):
    with pytest.raises(RuntimeError, match=r"generated \[1\] weight updates before the training policy \(version 1\)"):
        rollout.generate_rollout(_args(), 0, _ledger_data_source())


def _slime_rollout_modules():
    path = os.environ.get("SLIME_PATH")
    if path and path not in sys.path:
        sys.path.insert(0, path)
    try:
        import slime.rollout.sglang_rollout as sglang_rollout
        from slime.rollout.base_types import RolloutFnTrainOutput
        from slime.utils.types import Sample
    except Exception as exc:  # noqa: BLE001 - any import failure means the precondition is absent
        pytest.skip(f"needs slime's source (set SLIME_PATH) with httpx and megatron-core: {exc!r}")
    return sglang_rollout, RolloutFnTrainOutput, Sample


def test_synchronous_rollout_is_slimes_own_batch_generation_on_slimes_types(monkeypatch):
    sglang_rollout, output_type, sample_type = _slime_rollout_modules()
    calls = []

    def slime_generate_rollout(args, rollout_id, data_source, evaluation=False):
        calls.append((rollout_id, data_source, evaluation))
        groups = [
            [sample_type(index=2 * g + i, group_index=g, weight_versions=["1"]) for i in range(2)] for g in (1, 0)
        ]
        for g in groups:
            data_source.ledger.consume(g[0].group_index, g)
        return output_type(samples=groups, metrics={"rollout/slime_metric": 2.0})

    def no_worker(*_args, **_kwargs):
        raise AssertionError("the synchronous schedule must not start the background worker")

    monkeypatch.setattr(sglang_rollout, "generate_rollout", slime_generate_rollout)
    monkeypatch.setattr(rollout, "_get_stream", no_worker)
    monkeypatch.setattr(rollout, "_first_rollout_id", None)
    source = _ledger_data_source()
    out = rollout.generate_rollout(_args(rollout_batch_size=2), 7, source)
    assert calls == [(7, source, False)]
    assert out.metrics["rollout/accounting/in_flight_groups"] == 2.0
    with pytest.raises(ValueError, match="--data-source-path"):  # no ledger, no accounting: refused
        rollout.generate_rollout(_args(rollout_batch_size=2), 8, "not the project's data source")
    assert isinstance(out, output_type) and isinstance(out.samples[0][0], sample_type)
    assert [[s.index for s in g] for g in out.samples] == [[2, 3], [0, 1]]  # slime's order is kept
    assert out.metrics["rollout/slime_metric"] == 2.0 and out.metrics["rollout/staleness/max"] == 0.0
    assert out.samples[0][0].metadata["epic_group_staleness"] == 0


def _methods_used_by_the_driver() -> tuple[set, set]:
    manager_used, actor_used = set(), set()

    class Manager:
        def __getattr__(self, name):
            manager_used.add(name)
            return _Call(lambda *args, **kwargs: None)

    class Actor:
        def __getattr__(self, name):
            actor_used.add(name)
            return lambda *args, **kwargs: None

    every_branch = [
        _args(colocate=True, offload_train=True, offload_rollout=True, check_weight_update_equal=True),
        _args(colocate=True, offload_train=False, offload_rollout=True, release_train=True),
        _args(max_staleness=2),
    ]
    for args in every_branch:
        push_initial_weights(args, Manager(), Actor(), get=lambda ref: ref)
        training_loop_for(args)(args, Manager(), Actor(), None, get=lambda ref: ref)
    return manager_used, actor_used


def test_the_driver_calls_only_methods_that_slimes_rollout_manager_and_train_group_have():
    """Method names at slime 624b824a: RayTrainGroup imported, RolloutManager read from its source
    (importing slime.ray.rollout needs SGLang)."""
    import ast
    import importlib.util

    _slime_rollout_modules()
    from slime.ray.actor_group import RayTrainGroup

    source = Path(importlib.util.find_spec("slime.ray.rollout").origin).read_text()
    manager_class = next(
        node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef) and node.name == "RolloutManager"
    )
    manager_methods = {node.name for node in manager_class.body if isinstance(node, ast.FunctionDef)}
    manager_used, actor_used = _methods_used_by_the_driver()
    assert {"generate", "eval", "save", "offload", "onload_weights", "onload_kv", "check_weights"} <= manager_used
    assert {"async_train", "save_model", "update_weights", "create", "clear_memory"} <= actor_used
    assert manager_used <= manager_methods, manager_used - manager_methods
    assert all(callable(getattr(RayTrainGroup, name, None)) for name in actor_used), actor_used


# ---- flags -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        ["--max-staleness", "0"],
        ["--max-staleness", "0", "--colocate"],
        ["--max-staleness", "0", "--colocate", "--offload"],
        ["--max-staleness", "0", "--offload-train", "--offload-rollout"],
        ["--max-staleness", "0", "--colocate", "--release-train"],
        ["--max-staleness", "0", "--update-depth", "4"],
    ],
)
def test_max_staleness_0_is_the_synchronous_schedule_and_allows_shared_gpus(extra):
    config, _, _ = check_argv(BASE + extra)
    assert config.schedule == SYNCHRONOUS and config.max_staleness == 0


@pytest.mark.parametrize("extra", [[], ["--max-staleness", "2"], ["--max-staleness", "1", "--no-offload-train"]])
def test_other_bounds_are_the_asynchronous_schedule(extra):
    assert check_argv(BASE + extra)[0].schedule == ASYNCHRONOUS


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--colocate"],
            r"--colocate needs the synchronous schedule \(--max-staleness 0\); with --max-staleness unset",
        ),
        (["--max-staleness", "2", "--colocate"], "with --max-staleness 2 the driver generates rollout r . 1 while"),
        (["--max-staleness", "1", "--offload"], "--offload only work with the synchronous schedule"),
        (["--max-staleness", "1", "--offload-train"], "--offload-train only work with the synchronous"),
        (["--max-staleness", "1", "--offload-rollout"], "--offload-rollout only work with the synchronous"),
        (
            ["--release-train"],
            "--release-train only work with the synchronous schedule .--max-staleness 0.; with --max-staleness unset",
        ),
        (["--max-staleness", "0", "--async-groups-in-flight", "4"], "no background generator"),
        (["--max-staleness", "0", "--partial-rollout"], "--partial-rollout continues aborted responses"),
    ],
)
def test_flags_the_schedule_cannot_honour_are_refused_by_name(extra, message):
    with pytest.raises(ProjectFlagError, match=message):
        check_argv(BASE + extra)


def test_slimes_parsed_offload_flags_are_checked_too():
    # after slime's parse_args, --offload / --colocate have become offload_train / offload_rollout
    from epic_slime.slime.cli.checks import check_schedule_flags

    with pytest.raises(ProjectFlagError, match="--offload-rollout only work"):
        check_schedule_flags(SimpleNamespace(colocate=False, offload_train=False, offload_rollout=True), None)
    parsed = SimpleNamespace(colocate=True, offload_train=True, offload_rollout=True, release_train=False)
    assert check_schedule_flags(parsed, 0) == SYNCHRONOUS


# ---- launchers (DRY_RUN=1) -------------------------------------------------------------------


def _dry_run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "ASYNC", "MAX_STALENESS")}
    full_env.update(DRY_RUN="1", PYTHON=sys.executable, **env)
    return subprocess.run(["bash", script, *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=120)


def _driver(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("ray job submit")]
    assert len(lines) == 1, result.stdout
    argv = shlex.split(lines[0])
    return argv[argv.index("--") + 1 :]


def _last(argv: list[str], name: str) -> str:
    """The value argparse keeps: the last occurrence."""
    return argv[len(argv) - 1 - argv[::-1].index(name) + 1]


@pytest.mark.parametrize("row", ["epic", "grpo_r3"])
def test_table1_rows_default_to_the_papers_synchronous_protocol(row):
    result = _dry_run(f"launch/table1/{row}.sh")
    driver = _driver(result)
    assert _last(driver, "--max-staleness") == "0" and _last(driver, "--update-depth") == "8"
    assert (_last(driver, "--rollout-batch-size"), _last(driver, "--n-samples-per-prompt")) == ("64", "8")
    assert "--colocate" in driver  # the paper's synchronous protocol shares the GPUs (--layout split: not)
    assert "schedule=synchronous" in result.stdout and "global batch 64 of 512 samples" in result.stdout
    assert f"qwen3-30b-a3b-{row}-d8-k0-s1234" in result.stdout  # the run name says K = 0


@pytest.mark.parametrize(
    "args, env, bound",
    [((), {"ASYNC": "1"}, "2"), (("--max-staleness", "1"), {}, "1"), ((), {"ASYNC": "1", "MAX_STALENESS": "3"}, "3")],
)
def test_table1_rows_have_an_asynchronous_variant(args, env, bound):
    result = _dry_run("launch/table1/epic.sh", *args, **env)
    driver = _driver(result)
    assert _last(driver, "--max-staleness") == bound and _last(driver, "--update-depth") == "8"
    assert "schedule=asynchronous" in result.stdout


@pytest.mark.parametrize(
    "env, message",
    [
        ({"ASYNC": "yes"}, "ASYNC must be 0"),
        ({"ASYNC": "1", "MAX_STALENESS": "0"}, "MAX_STALENESS=0 is the synchronous"),
    ],
)
def test_table1_bad_schedule_settings_fail_with_a_reason(env, message):
    result = _dry_run("launch/table1/epic.sh", **env)
    assert result.returncode == 2 and message in result.stderr


def test_one_gpu_smoke_launcher_prints_a_colocated_synchronous_command():
    result = _dry_run("launch/smoke_1gpu.sh", NUM_ROLLOUT="3", WANDB_API_KEY="sk-smoke-secret-9")
    driver = _driver(result)
    assert driver[:3] == ["python3", "-m", "epic_slime.slime.train"]
    assert "--colocate" in driver and _last(driver, "--max-staleness") == "0"
    one_gpu = (
        "--actor-num-nodes",
        "--actor-num-gpus-per-node",
        "--rollout-num-gpus",
        "--num-gpus-per-node",
        "--rollout-num-gpus-per-engine",
        "--tensor-model-parallel-size",
        "--expert-model-parallel-size",
    )
    assert [_last(driver, f) for f in one_gpu] == ["1"] * len(one_gpu)
    assert _last(driver, "--policy-loss") == "epic" and _last(driver, "--hidden-size") == "896"
    assert _last(driver, "--hf-checkpoint") == "/root/models/Qwen2.5-0.5B-Instruct"
    assert _last(driver, "--ref-load") == "/root/models/Qwen2.5-0.5B-Instruct_torch_dist"
    assert (_last(driver, "--num-rollout"), _last(driver, "--eval-interval")) == ("3", "3")  # eval at the end
    assert "--skip-eval-before-train" in driver and driver.count("--eval-interval") == 1
    assert _last(driver, "--prompt-data") == "/root/data/train/dapo_math_17k.jsonl"
    assert _last(driver, "--seed") == _last(driver, "--rollout-seed") == "1234"
    assert "schedule=synchronous" in result.stdout and "global batch 32 of 64 samples" in result.stdout
    assert "sk-smoke-secret-9" not in result.stdout + result.stderr
    script = (REPO / "launch" / "smoke_1gpu.sh").read_text()
    assert "0.0.0.0" not in script and "--dashboard-host 127.0.0.1" in script


def test_one_gpu_smoke_launcher_refuses_the_asynchronous_schedule():
    result = _dry_run("launch/smoke_1gpu.sh", "--", "--max-staleness", "1")
    assert result.returncode == 2 and "--colocate needs the synchronous schedule" in result.stderr
