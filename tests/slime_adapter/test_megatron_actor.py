"""slime's own MegatronTrainRayActor on CPU (issue 45 item 5, without Ray): `init` from the HF checkpoint
with the vendored megatron.training (slime's parser, `initialize.init`, `get_model`, its HF -> Megatron
loader), `train` on two rollouts made into training data by slime's RolloutManager conversion and
per-DP split with the project's loss (`--loss-type custom_loss`, EPIC), `save_model` through slime's
checkpoint.py and megatron.training's `save_checkpoint`, and a fresh actor's `init` from that save.

What could not be met on CPU is stood in for at its interface and listed (support/megatron_actor.py
`STANDINS`, the harness's patches; docs/testing.md, "slime's Megatron actor on CPU"). The same actor
under a real Ray, behind the real router and server, in the asynchronous loop: test_megatron_ray_actor.py;
killed at a checkpoint's boundaries: test_megatron_checkpoint_kill.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.megatron_run import REPO, skip_reason, wait_or_kill, worker_env

pytestmark = pytest.mark.slow
if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)

ACTOR = REPO / "tests" / "support" / "megatron_actor.py"


def _start(phase: str, workdir, port: int, name: str | None = None, **env: str) -> subprocess.Popen:
    out = workdir / f"{name or phase}.json"
    log = open(workdir / f"{name or phase}.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, str(ACTOR), phase, "1", str(out), str(workdir)],
        env=worker_env(EPIC_ACTOR_PORT=str(port), **env),
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _result(proc: subprocess.Popen, workdir, name: str) -> dict:
    wait_or_kill(proc, 900)
    out = workdir / f"{name}.json"
    log = (workdir / f"{name}.log").read_text()[-4000:]
    assert proc.returncode == 0 and out.is_file(), f"{name} exited {proc.returncode}:\n{log}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The train phase, and beside it the same without the RNG-state patch; then the load phase, and beside
    it the same without the optimizer-state patch."""
    from support.real_sglang import free_port

    work, bare = tmp_path_factory.mktemp("actor"), tmp_path_factory.mktemp("actor_no_rng_patch")
    trained = _start("train", work, free_port())
    unpatched = _start("train", bare, free_port(), EPIC_SLIME_MEGATRON_SKIP_PATCH="cuda_rng_state")
    train = _result(trained, work, "train")
    no_rng = _result(unpatched, bare, "train")
    loading = _start("load", work, free_port())
    unpatched_load = _start(
        "load", work, free_port(), "load_no_patch", EPIC_SLIME_MEGATRON_SKIP_PATCH="optimizer_load_state"
    )
    load = _result(loading, work, "load")
    no_opt = _result(unpatched_load, work, "load_no_patch")
    return train, load, no_rng, no_opt, work


def test_the_actor_inits_trains_two_rollouts_and_saves(runs):
    train, _, _, _, _ = runs
    assert train.get("error") is None, train.get("traceback")
    assert train["reached"][-4:] == ["init", "train 0", "train 1", "save"]
    assert train["start_rollout_id"] == 1  # slime: an HF checkpoint loads as iteration 0
    # one step per rollout (global batch 4 = 2 prompts x 2 samples); the first step's trainer log-probs
    # (slime forces bf16) are the float HF model's that sampled the rollout within the bf16 gap, mean
    # |diff| per token < 0.01 (test_real_sglang.py's bound): slime's HF loader put the weights in place
    assert [s["train/global_batch_size"] for s in train["steps"]] == [4, 4]
    assert train["steps"][0]["train/train_rollout_logprob_abs_diff"] < 0.01
    assert "train/policy/abs_z_mean" in train["steps"][0]  # EPIC's diagnostics out of slime's actor
    moved = [n for n, d in train["digest_saved"].items() if d != train["digest_at_init"][n]]
    assert moved, "two training steps must move the weights"


def test_a_fresh_actor_loads_the_saved_weights_and_resumes_after_the_saved_rollout(runs):
    train, load, _, _, _ = runs
    assert load.get("error") is None, load.get("traceback")
    assert load["start_rollout_id"] == 2  # saved at rollout 1
    assert load["digest_at_init"] == train["digest_saved"]  # exactly: the same bf16 values


def test_the_checkpoint_needs_the_rng_state_patch(runs):
    _, _, no_rng, _, _ = runs
    assert no_rng["reached"][-1] == "train 1", no_rng["reached"]
    assert "Torch not compiled with CUDA enabled" in no_rng["error"]
    assert "get_rng_state" in no_rng["traceback"]


def test_the_load_needs_the_optimizer_state_patch(runs):
    _, _, _, no_opt, _ = runs
    assert no_opt["reached"][-1] == "constructed", no_opt["reached"]
    assert no_opt["error"] == "AssertionError: "  # distrib_optimizer.py's bare `assert len(steps) == 1`
    assert "assert len(steps) == 1" in no_opt["traceback"]


def test_the_projects_checkpoint_marks_read_megatrons_own_save(runs):
    """The resume rule (epic_slime.slime.stream.checkpoint_marks) trusts Megatron's tracker for its own iteration:
    megatron.training's real save writes it as the rule reads it."""
    from epic_slime.slime.stream.checkpoint_marks import megatron_tracker_iteration, model_checkpoint_complete

    ckpt = str(runs[-1] / "ckpt")
    assert megatron_tracker_iteration(ckpt) == 1
    assert model_checkpoint_complete(ckpt, 1)
    assert not model_checkpoint_complete(ckpt, 0) and not model_checkpoint_complete(ckpt, 2)
