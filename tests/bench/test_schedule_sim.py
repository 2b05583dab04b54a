"""bench/schedule_sim.py: the driver's real loops and the real GroupStream on a simulated clock."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
pytest.importorskip("slime.rollout.sglang_rollout", reason="slime is not importable (SLIME_PATH)")

import schedule_sim as sim  # noqa: E402
from support.schedsim_small import small  # noqa: E402

logging.getLogger("epic_slime").setLevel(logging.WARNING)


def test_the_simulator_runs_the_drivers_loops(monkeypatch):
    from epic_slime.slime import train

    calls = []
    real = train.async_training_loop

    def spy(*a, **kw):
        calls.append(a[3:])
        return real(*a, **kw)

    monkeypatch.setattr(train, "async_training_loop", spy)
    r = sim.simulate(small(), "async K=2", 4)
    assert len(calls) == 1
    assert r["trace"][:3] == [("generate", 0), ("generate", 1), ("train", 0)]
    assert [e for e, _ in r["trace"]].count("update_weights") == 4


def test_the_wall_time_comes_from_the_loop_given():
    """The simulated wall time comes from the loop it is given: a loop that asks for r + 1 only after
    training r and pushing times differently (the budget stream generates ahead in the background in
    both, so both beat the synchronous schedule; the serial loop's push lands right after training)."""
    from epic_slime.slime import train

    def serial(args, manager, actor, per_epoch, get):
        for r in range(args.start_rollout_id, args.num_rollout):
            data = get(manager.generate.remote(r))
            get(actor.async_train(r, data))
            actor.update_weights()
        return []

    p = small()
    overlap = sim.simulate(p, "async K=2", 5)["s_per_rollout"]
    serial_run = sim.simulate(p, "async K=2", 5, loop_fn=serial)
    no_overlap = serial_run["s_per_rollout"]
    # the serial loop pushes right after training: no push waits behind a generate call
    for r, (t0, _t1) in enumerate(serial_run["pushes"][1:]):
        assert t0 <= serial_run["trains"][r][1] + 1e-9
    sync = sim.simulate(p, "sync split", 5)["s_per_rollout"]
    assert overlap < 0.9 * sync and no_overlap < 0.9 * sync
    assert overlap != no_overlap
    assert train.async_training_loop is not serial


def test_pushes_wait_for_the_rollout_manager():
    """slime's update_weights asks the RolloutManager for the engines first, so the push after training r
    lands once generate(r + 1) returned; without that wait it lands during generate(r + 1) and aborts
    the batch in flight (its groups resubmitted as prompt + partial)."""
    # linear TP scaling: engines fast enough that the early push's aborts show in the rollout's time
    p = small(oversample_ratio=0.0, tp_alpha=1.0)
    waits = sim.simulate(p, "async K=2", 5)
    no_wait = sim.simulate(p, "async K=2", 5, push_waits_for_manager=False)
    ends = {r: b["end"] for r, b in waits["batches"].items()}
    for r, (t0, _t1) in enumerate(waits["pushes"][1:-1]):  # the push after training r
        assert t0 >= ends[r + 1] - 1e-9
    assert no_wait["abort_resubmits"] >= p.rollout_batch_size
    assert no_wait["abort_resubmits"] > waits["abort_resubmits"]
    assert (
        no_wait["per_rollout_hist"] != waits["per_rollout_hist"] or no_wait["s_per_rollout"] != waits["s_per_rollout"]
    )


def test_the_stream_is_the_real_group_stream_with_its_counts():
    """The real GroupStream with its admission budget: at most (g + K) B groups started (g <= the pushes),
    batch 0 on policy, every trained group within K (nothing requeued or dropped for staleness)."""
    import epic_slime.slime.rollout as ro

    made = []
    real_init = ro.GroupStream.__init__

    def spy(self, *a, **kw):
        made.append(self)
        real_init(self, *a, **kw)

    p = sim.paper_preset(mean_response_len=3000.0, max_response_len=6000)
    ro.GroupStream.__init__ = spy
    try:
        r = sim.simulate(p, "async K=2", 4)
    finally:
        ro.GroupStream.__init__ = real_init
    assert len(made) == 1 and type(made[0]) is ro.GroupStream and made[0].budget.max_staleness == 2
    assert 64 * 4 < r["started_groups"] <= (4 + 2) * 64
    assert r["per_rollout_hist"][0] == {0: 64}
    for k in (1, 2, 3):
        assert set(r["per_rollout_hist"][k]) <= {1, 2} and sum(r["per_rollout_hist"][k].values()) == 64
    assert r["requeued_groups"] == 0 and r["dropped_groups"] == 0


def test_k1_takes_no_oversampling_and_trains_every_group_at_staleness_1():
    """The driver's rule (command_line.oversampling_flags): no cap at K = 1 (the budget alone: one batch
    ahead), the oversampled cap at K = 2; at K = 1 nothing is requeued or dropped and no group is staler than 1."""
    assert sim.driver_groups_in_flight(64, 0.1, 1) is None and sim.driver_groups_in_flight(64, 0.1, 2) == 72
    r = sim.simulate(sim.paper_preset(mean_response_len=3000.0, max_response_len=6000), "async K=1", 5)
    assert r["requeued_groups"] == 0 and r["dropped_groups"] == 0 and r["started_groups"] <= (5 + 1) * 64
    assert all(set(h) <= {0, 1} for h in r["per_rollout_hist"].values())


def test_synchronous_schedules_train_on_policy_and_colocated_uses_every_gpu():
    p = small()
    for schedule in ("sync split", "sync colocated"):
        r = sim.simulate(p, schedule, 3)
        assert all(set(h) == {0} for h in r["per_rollout_hist"].values())
        assert ("offload_rollout", 0) in r["trace"] if schedule == "sync colocated" else True


MEASUREMENT = ROOT / "bench" / "runtime_measurement.json"


@pytest.mark.skipif(not MEASUREMENT.exists(), reason="run python bench/schedule_sim.py measure-runtime first")
def test_the_simulator_reproduces_the_embedded_runtimes_async_sync_ratio():
    """Given the runtime's own measured generation-request and train-step times (and its 2 shared cores),
    the simulated async/sync ratio is within 15% of the runtime's measured one (saved by
    `python bench/schedule_sim.py measure-runtime`)."""
    m = json.loads(MEASUREMENT.read_text())
    v = sim.runtime_validation(m)
    assert v["simulated"] == pytest.approx(m["measured_async_over_sync"], rel=0.15), v
    # and it is the shared cores that keep it there: without contention the simulator promises more
    free = sim.runtime_preset(
        m, shared_cores=None, total_gpus=m["num_rollout_workers"] + 1
    )  # 2 engines + a trainer, no sharing
    sync = sim.simulate(free, "sync split", 10)["s_per_rollout"]
    asyn = sim.simulate(free, "async K=2", 10)["s_per_rollout"]
    assert sync / asyn > v["simulated"]


def test_in_place_pushes_keep_requests_abort_pushes_resubmit_and_re_prefill():
    """abort: the pushes meet requests in flight (K = 4 keeps engines busy across them), which return
    partial responses and re-prefill; in place: none is aborted, nothing is re-prefilled for a push;
    retract: none is aborted either, the engine re-prefills the retracted contexts; the trained groups'
    true lag (first token's version) is never negative."""
    p = small(oversample_ratio=0.5)  # leftovers: groups still generating when the push lands
    rows = {m: sim.simulate(sim.split_preset(p, 16, 8, m), "async K=4", 6) for m in ("abort", "in_place", "retract")}
    assert rows["abort"]["abort_resubmits"] > 0 and rows["abort"]["reprefill_tokens"] > 0
    assert rows["in_place"]["abort_resubmits"] == 0 and rows["in_place"]["push_retractions"] == 0
    assert rows["in_place"]["reprefill_tokens"] < rows["abort"]["reprefill_tokens"]
    # retract: the engine re-prefills the running requests itself (nothing resubmitted)
    assert rows["retract"]["abort_resubmits"] == 0 and rows["retract"]["push_retractions"] > 0
    assert rows["retract"]["reprefill_tokens"] > rows["in_place"]["reprefill_tokens"]
    for r in rows.values():
        assert all(g["true_lag"] is None or g["true_lag"] >= 0 for g in r["groups"])


def test_no_schedule_beats_its_throughput_bound():
    p = small()
    for schedule in ("sync colocated", "sync split", "async K=2", "async K=4"):
        r = sim.simulate(p, schedule, 5)
        b = sim.bound_for(p, r)
        assert r["s_per_rollout"] >= 0.97 * b["bound_s"], (schedule, r["s_per_rollout"], b)
