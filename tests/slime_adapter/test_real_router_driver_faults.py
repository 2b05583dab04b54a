"""Issue 35 items 3 and 4 on the REAL SGLang 0.5.15.post1 server and sglang-router 0.3.2
(``support/fault_probes.py``, ``support/router_driver_e2e.py``):

- the router loses its worker mid-run through slime's own ``SGLangEngine.shutdown`` calls and regains it
  through slime's ``_register_to_router``; the held request, the empty router's answer, the return, and a
  whole slime e2e session over such an outage (every prompt trained once);
- the trainer side of a push dies between two tensors: what the server answers, that it keeps serving,
  that the group it keeps blocks a new one of that name until destroyed; and the whole driver SIGKILLed
  mid-push, then resumed from its last checkpoint (every prompt trained once across both lineages; the
  engine, left with weights no checkpoint has, serves the checkpoint's after the resume's first push,
  before any generation).

Item 4 runs on an engine of its own (a torn push must never reach the suite's shared server).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from support.preconditions import SLIME_CONTRACT, skip_unless


skip_unless(
    *SLIME_CONTRACT,
    why="the real-engine fault tests need slime's source and the slime-contract extra",
)

from support import fault_probes, real_sglang  # noqa: E402
from support import router_driver_e2e as rd  # noqa: E402
from support.slime_e2e_train import KILL_BUCKET  # noqa: E402


@pytest.fixture(scope="module")
def own_engines(tmp_path_factory):
    """A real server and router of this module's own, launched at once (its start overlaps the router tests)."""
    reason = real_sglang.unavailable_reason()
    if reason is not None:
        if real_sglang.required():
            pytest.fail(f"{real_sglang.REQUIRE_ENV}=1 and {reason}", pytrace=False)
        pytest.skip(reason)
    engines = real_sglang.RealEngines(tmp_path_factory.mktemp("own_engines"))
    try:
        yield engines
    finally:
        engines.stop()


@pytest.fixture(scope="module")
def outage_run(real_engines, own_engines, tmp_path_factory):
    result = rd.router_outage_run(real_engines, str(tmp_path_factory.mktemp("router_outage")))
    print(
        "\nrouter outage run:",
        json.dumps({**result["summary"], **rd.outage_counts(result), "outage": result["outage"]}),
    )
    return result


def test_router_answers_an_empty_pool_at_once_and_lets_a_removed_workers_request_finish(real_engines, tmp_path):
    """Probed on the shared server behind a router of its own (slime's flags): the request in flight when
    slime's shutdown calls remove the worker finishes (200); with zero workers the router answers 503
    ``no_available_workers`` within a second; after slime's register call it routes again."""
    server = real_engines.server
    ids = rd.real._probe_ids()[:8]
    probe = fault_probes.router_probe(server, tmp_path, ids)
    print(
        "\nrouter probe:",
        json.dumps({k: v for k, v in probe.items() if k != "empty"}),
        "empty-pool answers:",
        [(e["status"], e["seconds"]) for e in probe["empty"]],
    )
    assert probe["remove_call"]["killed_pids"] == [-1]  # slime's shutdown ran to its (stood-in) process kill
    assert probe["held_done_while_removed"] is False and probe["held"]["status"] == 200, probe["held"]
    assert all(e["status"] == 503 and "no_available_workers" in e["body"] and e["seconds"] < 5 for e in probe["empty"])
    assert probe["after"]["status"] == 200, probe["after"]


def test_slimes_client_waits_about_a_minute_per_request_for_an_empty_router():
    """What bounds an outage (docs/cluster.md, Router and driver faults): slime 624b824a's HTTP client tries a
    failed request 60 times, a second apart, before it raises; only then does GroupStream regenerate the
    group (at most MAX_GROUP_ATTEMPTS tries). With the empty router's 503 in ~0.4 s, that is about 85 s per
    attempt and over 4 minutes before a run without workers fails."""
    import inspect

    from slime.utils import http_utils

    from epic_slime.slime.stream.group_stream import MAX_GROUP_ATTEMPTS

    assert inspect.signature(http_utils._post).parameters["max_retries"].default == 60
    assert inspect.signature(http_utils.post).parameters["max_retries"].default == 60
    assert "await asyncio.sleep(1)" in inspect.getsource(http_utils._post)
    assert MAX_GROUP_ATTEMPTS == 3


def test_every_prompt_trained_once_over_a_router_outage(outage_run):
    """slime's client retries the empty router's 503 (once a second, up to 60 times per request), so an
    outage shorter than that costs no group attempt: every prompt is trained once, none dropped, none
    regenerated, and the outage did hit requests (retries counted)."""
    real_check = rd.real.check_run
    real_check(outage_run, k=rd.real.RUNS["async-k2-abort"]["max_staleness"], num_rollout=rd.ROLLOUTS)
    outage, counts = outage_run["outage"], rd.outage_counts(outage_run)
    assert {"removed_at", "empty_at", "added_at", "back_at"} <= set(outage), outage
    assert outage["added_at"] - outage["empty_at"] >= rd.DOWN_S and outage["back_at"] >= outage["added_at"]
    assert counts["http_retries"] >= 1, counts
    assert counts["crashed_group_tasks"] == 0 and counts["crash_retries"] == 0 and counts["dropped_groups"] == 0, counts
    trains = [e for e in outage_run["events"] if e["event"] == "train"]
    assert any(e["t"] > outage["added_at"] for e in trains), "no rollout trained after the worker was added back"


def test_a_push_whose_trainer_dies_fails_at_once_and_its_group_blocks_a_new_one_until_destroyed(own_engines):
    """The trainer side killed between two tensors of a bucket: the server answers 400 at once and keeps
    serving the weights it had; a group of the same name is refused until destroyed; then a full push works."""
    engines = own_engines.ready()
    out = fault_probes.push_peer_death_probe(engines.server, engines.model, rd.real._probe_ids())
    print("\npush peer death:", json.dumps({k: v for k, v in out.items()}, default=str)[:3000])
    killed = out["killed_push"]
    assert killed["pusher_rc"] == -9 and killed["update"]["status"] == 400, killed
    assert "partially updated" in killed["update"]["body"] and killed["update_answered_after_s"] < 30, killed
    assert out["alive"] and out["health_after_kill"]["status"] == 200
    assert out["version_after_kill"] == out["version_before"]
    assert out["probe_gap_to_launched"] < 0.01 < out["probe_gap_to_pushed"], out  # one bucket: nothing loaded
    assert (
        out["same_name_again"]["init"]["status"] == 400
        and "already been created" in out["same_name_again"]["init"]["body"]
    )
    assert out["after_destroy"]["update"]["status"] == 200 and out["final_probe_gap_to_pushed"] < 0.01, out
    assert out["final_version"] == "recovered"
    # back to the launched weights for the next test
    from support.real_push import restore_initial_weights

    restore_initial_weights(engines, out["version_before"])


@pytest.fixture(scope="module")
def killed_in_push(own_engines, tmp_path_factory):
    result = rd.driver_kill_in_push(own_engines.ready(), str(tmp_path_factory.mktemp("driver_kill")))
    print("\ndriver killed in a push:", json.dumps({"rc": result["rc"], "after_kill": result["after_kill"]}))
    return result


def _events(trace, name):
    return [e for e in trace if e["event"] == name]


def test_driver_killed_mid_push_leaves_weights_no_checkpoint_has(killed_in_push):
    assert killed_in_push["rc"][0] == -9, f"the first session must die by SIGKILL; {killed_in_push['workdir']}"
    kill = _events(killed_in_push["first"], "kill_in_push")
    assert [k["rollout_id"] for k in kill] == [rd.KILL_IN_PUSH_AFTER] and kill[0]["bucket"] == KILL_BUCKET > 0, kill
    after = killed_in_push["after_kill"]
    assert after["alive"] and after["paused"], after  # the push paused the engine; nobody continued it
    # the buckets before the kill loaded, the last not: neither the last checkpoint's weights, nor the
    # killed push's, nor the initial ones; under the killed push's version
    assert min(after["gap_to_last_checkpoint"], after["gap_to_killed_push"], after["gap_to_initial"]) > 0.01, after
    assert after["version"] == str(kill[0]["weight_version"]), after


def test_resume_serves_the_checkpoint_before_any_generation_and_trains_every_prompt_once(killed_in_push):
    assert killed_in_push["rc"][1] == 0, f"the resumed session failed; {killed_in_push['workdir']}/resumed.jsonl.log"
    first, resumed = killed_in_push["first"], killed_in_push["resumed"]
    # the resumed session's first push came before any generation and is confirmed (probe + version) as the
    # checkpoint's model (the session's model is the checkpoint it loaded)
    kinds = [e["event"] for e in resumed if e["event"] in ("update_weights", "generate", "eval")]
    assert kinds[0] == "update_weights", kinds
    assert _events(resumed, "update_weights")[0]["confirmed_gap"] < 0.01
    saved = max(e["rollout_id"] for e in _events(first, "save"))
    assert saved == rd.KILL_IN_PUSH_AFTER - 1
    assert [e["rollout_id"] for e in _events(resumed, "train")] == list(range(saved + 1, rd.ROLLOUTS))
    before = [p for e in _events(first, "train") if e["rollout_id"] <= saved for p in e["pids"]]
    after = [p for e in _events(resumed, "train") for p in e["pids"]]
    trained = before + after
    assert not [p for p, n in Counter(trained).items() if n > 1], f"trained twice: {sorted(trained)}"
    assert len(trained) == 2 * rd.ROLLOUTS
    pending = _events(resumed, "done")[-1]["pending_pids"]
    assert sorted(trained + pending) == list(range(len(trained) + len(pending)))  # nothing skipped
