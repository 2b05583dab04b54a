"""slime's training actor in one `train_async.py`-shaped asynchronous run at K = 2 (issue 45 item 5): the
project's driver (`epic_slime.slime.train.run`: slime's placement group, RolloutManager and
`RayTrainGroup`, the initial push, the overlap schedule) under a real local Ray (127.0.0.1, dashboard off,
one GPU it does not have), slime's `MegatronTrainRayActor` on CPU with the vendored `megatron.training`,
init from the served checkpoint, 4 rollouts trained with the EPIC loss, pushed after each into the REAL
SGLang server (slime's `UpdateWeightFromDistributed` over gloo), saved after the last; slime's
RolloutManager in external mode with the project's rollout function and stream, behind the REAL router.

Stood in for (tests/support/megatron_ray_run.py): slime's `SGLangEngine` actor (HTTP to the real server,
support.megatron_ray_hook.HttpEngine), SGLang's and the router's `add_cli_args` (recorded from the real
classes, support.sglang_cli), and what support/megatron_actor.py `STANDINS` lists for the actor on CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from support.megatron_run import REPO, skip_reason, worker_env

pytestmark = pytest.mark.slow
if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)
pytest.importorskip("ray", reason="the run needs Ray (the slime-contract extra)")

from support import megatron_ray_run as ray_run  # noqa: E402

RUN = REPO / "tests" / "support" / "megatron_ray_run.py"
BEFORE = "before-the-ray-run"
N_SAMPLES, BATCH = 2, 2  # support.megatron_actor.actor_argv: --n-samples-per-prompt, --rollout-batch-size


@pytest.fixture(scope="module")
def run(real_engines, tmp_path_factory):
    from support.real_push import restore_initial_weights

    work = tmp_path_factory.mktemp("ray_actor")
    engines = work / "engines.json"
    engines.write_text(
        json.dumps(
            {"server": real_engines.server.url, "router": real_engines.router.url, "model_dir": real_engines.model_dir}
        )
    )
    out, log = work / "out.json", work / "run.log"
    version = real_engines.server.weight_version()
    restore_initial_weights(real_engines, BEFORE)  # a version no push of the run can name
    try:
        with open(log, "w") as f:
            done = subprocess.run(
                [sys.executable, str(RUN), str(engines), str(out), str(work)],
                env=worker_env(),  # the driver adds tests/ for itself and the Ray workers
                cwd=REPO,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=1500,
            )
    finally:  # the server shared with the other tests serves the exported checkpoint again
        restore_initial_weights(real_engines, version)
    assert done.returncode == 0 and out.is_file(), f"exited {done.returncode}:\n{log.read_text()[-4000:]}"
    result = json.loads(out.read_text())
    print(f"\nslime actor under Ray: {result['seconds']:.0f} s, versions {result.get('version_before')} -> "
          f"{result.get('version_after')}")  # fmt: skip
    return result


def _lines(result, kind):
    return {m["id"]: m for m in result["metrics"] if m["kind"] == kind}


def _groups(rollout):
    groups: dict[int, list] = {}
    for s in rollout["samples"]:
        groups.setdefault(s["group_index"], []).append(s)
    return groups


def test_the_driver_ran_slimes_actor_group_under_ray(run):
    assert run.get("error") is None, run.get("traceback")
    assert run["reached"] == ["parse", "ray", "run"]
    steps, perf = _lines(run, "step"), _lines(run, "perf")
    assert sorted(steps) == list(range(ray_run.NUM_ROLLOUT))
    # the trainer's lines come from one Ray worker (slime's train actor), the rollout lines from another
    train_pids = {m["pid"] for m in steps.values()}
    assert len(train_pids) == 1 and not train_pids & {
        m["pid"] for m in perf.values() if "rollout/accounting/consumed_groups" in m["metrics"]
    }
    assert all(m["metrics"]["train/global_batch_size"] == BATCH * N_SAMPLES for m in steps.values())


def test_every_prompt_is_trained_exactly_once(run):
    """What slime's RolloutManager handed to the actor, rollout by rollout: B whole groups each, every prompt
    in one group of N samples, no prompt twice across the run; and the stream's own accounting balances
    (consumed = trained + in flight, none dropped)."""
    rollouts = run["rollouts"]
    assert [r["rollout_id"] for r in rollouts] == list(range(ray_run.NUM_ROLLOUT))
    trained = Counter()
    for r in rollouts:
        groups = _groups(r)
        assert len(groups) == BATCH, r
        for members in groups.values():
            assert len(members) == N_SAMPLES and len({s["pid"] for s in members}) == 1, members
            trained[members[0]["pid"]] += 1
    assert len(trained) == ray_run.NUM_ROLLOUT * BATCH and set(trained.values()) == {1}, trained
    for rollout_id, line in _lines(run, "perf").items():
        acc = line["metrics"]
        if "rollout/accounting/consumed_groups" not in acc:
            continue  # the train actor's perf line
        assert acc["rollout/accounting/dropped_groups"] == 0, (rollout_id, acc)
        assert acc["rollout/accounting/consumed_groups"] == (
            acc["rollout/accounting/trained_groups"] + acc["rollout/accounting/in_flight_groups"]
        ), (rollout_id, acc)


def test_the_actor_pushed_one_version_per_rollout_and_no_group_trains_more_than_k_stale(run):
    """slime's updater pushed version 1 before the first rollout and one after each (the server reports the
    last); rollout r trains at version r + 1, each group generated under versions at most K = 2 older, and
    the async schedule really ran stale groups (the K bound is met, not idle)."""
    assert run["version_before"] == BEFORE and run["version_after"] == str(ray_run.NUM_ROLLOUT + 1)
    k = ray_run.MAX_STALENESS
    staleness = []
    for r in run["rollouts"]:
        trainer_version = r["rollout_id"] + 1
        for members in _groups(r).values():
            versions = {int(v) for s in members for v in s["weight_versions"]}
            assert versions and max(versions) <= trainer_version, (r["rollout_id"], versions)
            staleness.append(trainer_version - min(versions))
    assert max(staleness) <= k and k in staleness, staleness
    perf = {i: m["metrics"] for i, m in _lines(run, "perf").items() if "rollout/staleness/max" in m["metrics"]}
    assert all(m["rollout/staleness/max"] <= k for m in perf.values()), perf
    assert [perf[i]["rollout/staleness/trainer_version"] for i in sorted(perf)] == [
        i + 1 for i in range(ray_run.NUM_ROLLOUT)
    ]


def test_the_epic_loss_ran_in_the_actor(run):
    """EPIC's diagnostics (the project's loss through slime's `loss_function` inside the Ray actor) in every
    step's metrics, finite."""
    for step in _lines(run, "step").values():
        metrics = step["metrics"]
        assert {"train/policy/abs_z_mean", "train/policy/grad_removed_frac"} <= set(metrics), sorted(metrics)
        assert 0 <= metrics["train/policy/abs_z_mean"] < 10 and 0 <= metrics["train/policy/grad_removed_frac"] <= 1
