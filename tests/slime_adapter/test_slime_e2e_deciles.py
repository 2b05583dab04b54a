"""Length bias on the CPU e2e (issue 26 item 3): one K = 2 session of the slime e2e harness (slime's
real rollout side, the SGLang stand-in with its long-response third, pushes queued behind the
RolloutManager), reported by response-length decile (a group's mean response length) in steady state: 0 dropped, at most 1% requeued, and the
longest decile's mean staleness within 1 version of the shortest's."""

from __future__ import annotations

import os


from support import slime_e2e_harness as h
from support.preconditions import SLIME_CONTRACT, skip_unless

skip_unless(
    *SLIME_CONTRACT,
    why="the slime e2e needs slime's source and the slime-contract extra",
)

NUM_ROLLOUT = 10
K = 2


def test_k2_no_drops_no_requeues_and_no_length_bias(tmp_path):
    workdir = str(tmp_path)
    h.prepare_workdir(workdir)
    server = h.Server(workdir, os.path.join(workdir, "init.pt"))
    config = {
        "trace": os.path.join(workdir, "deciles.jsonl"),
        "port": server.port,
        "dist_file": os.path.join(workdir, "dist"),
        "argv": h.standard_argv(workdir, num_rollout=NUM_ROLLOUT, save_interval=None, max_staleness=K),
    }
    try:
        rc = h.run_session(config, timeout=250)
    finally:
        server.stop()
    assert rc == 0, f"logs in {workdir}"
    events = h.read_trace(config["trace"])
    report = h.decile_report(events)
    print(report["table"])
    rows = report["rows"]
    groups = sum(r["groups"] for r in rows)
    # the run's report is of the steady state: rollouts from trainer version K + 2 on (rollout id K + 1)
    trained = sum(len(e["pids"]) for e in events if e["event"] == "train" and e["rollout_id"] >= K + 1)
    assert groups >= trained == 2 * (NUM_ROLLOUT - K - 1)  # every trained group is in the report
    assert sum(r["dropped"] for r in rows) == 0
    assert sum(r["requeued"] for r in rows) <= 0.01 * groups
    assert sum(r["over_k"] for r in rows) == 0
    known = [r for r in rows if r["mean_staleness"] is not None]
    assert abs(known[-1]["mean_staleness"] - known[0]["mean_staleness"]) <= 1.0, report["table"]
    # the long third of the stand-in's responses is there: the top decile is longer than the bottom
    assert known[-1]["min_length"] > known[0]["max_length"]
