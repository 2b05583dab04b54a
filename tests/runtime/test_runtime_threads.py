"""torch's thread count (epic_slime.runtime.threads) where the runtime's Ray actors start, and the
thread setting's empty value (issue 28 item 7's mutation pass: test_runtime_warm_start.py checks the warm
start's threads only)."""

from __future__ import annotations


import pytest
import torch

from epic_slime.runtime import actors, threads


@pytest.fixture
def callers_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _actor_class(handle):
    """The class a Ray actor handle's worker process instantiates (Ray's own metadata), so that its
    __init__ runs here, in this process, as it runs first thing in the actor's."""
    meta = getattr(handle, "__ray_metadata__", None)
    if meta is None or not hasattr(meta, "modified_class"):
        pytest.skip("this Ray version keeps the actor's class elsewhere")
    return meta.modified_class


# mutants: threads_not_set_in_trainer, threads_not_set_in_rollout_worker
@pytest.mark.parametrize(
    "name, args",
    [
        ("RolloutWorker", (0, "cfg", {}, 1, "float32", 7)),
        ("EvalWorker", ("cfg", {}, 7)),
        ("Trainer", ({}, {"lr": 1e-3})),
    ],
)
@pytest.mark.parametrize("env, expected", [(None, 1), ("3", 3)])
def test_each_actor_sets_torch_threads_before_it_builds_torch_state(
    monkeypatch, callers_threads, name, args, env, expected
):
    """The actors share the cores with each other and with other work: torch's default team (one per
    core) spins at OpenMP barriers on a busy machine (threads.py)."""
    from epic_slime.runtime import rollout, trainer

    seen = {}

    def recording(*a, **kw):
        seen["threads"] = torch.get_num_threads()
        return object()

    monkeypatch.setattr(rollout, "PolicyEngine", recording)
    monkeypatch.setattr(trainer, "PolicyTrainer", recording)
    if env is None:
        monkeypatch.delenv(threads.ENV, raising=False)
    else:
        monkeypatch.setenv(threads.ENV, env)
    _actor_class(getattr(actors, name))(*args)
    assert seen["threads"] == expected and torch.get_num_threads() == expected


# mutant: threads_empty_env_refused
@pytest.mark.parametrize("raw", ["", "  "])
def test_an_empty_thread_setting_means_the_default(monkeypatch, raw):
    monkeypatch.setenv(threads.ENV, raw)
    assert threads.configured_threads() == threads.DEFAULT_THREADS == 1
