"""Multi-turn, tool-using trajectories under the stream, end to end on CPU (issue 44, item 1).

The e2e harness (tests/support/slime_e2e_harness.py: slime's real rollout side and loss_function,
the driver's own loops, the SGLang stand-in) runs the project's multi-turn generate function
(``epic_slime.slime.agent_generate`` through tests/support/slime_e2e_agent.py: up to 3 engine calls per
trajectory, a tool's output between them with loss mask 0) at K in {0, 1, 2, 4} and each push mode.
Checked per session: every prompt trained exactly once; every trained sample's loss mask and rollout
log-probs agree with its trajectory log (0.0 placeholders on tool tokens); every model token carries
the version of the call that produced it, versions never decrease along a response; the staleness
the stream recorded is counted from the oldest model token (abort mode: exactly the oldest model
span's version; in place / retract: a version no newer, the one known at submission) and never
exceeds K; trajectories span several turns and tool spans. Abort mode (stated and tested): a push
aborts the running turn; the sample keeps its finished turns, its tool outputs and the partial turn,
and the stream resubmits it: the turn continues on the new weights (the tokens after the push carry
the new version), no tool is run twice, nothing is regenerated.

CI runs four sessions that cover each K and each push mode; ``python
tests/slime_adapter/test_slime_e2e_agent.py`` runs the whole grid and prints the table (prompts
trained once, lag per turn).

The same sessions and checks run against the REAL SGLang server behind the REAL sglang-router (the
``real_engines`` fixture; ``support/slime_e2e_real.py``: slime's own push over gloo, each push confirmed
on the server). There, in addition: every model span's version is one the server served (a pushed
version, confirmed by ``/model_info``); the version-0 log-probs the server returned for the model's
tokens, across turns with tool output in their context, equal the trainer's float32 log-probs at those
weights within bf16 noise (tool tokens left out: their 0.0 is a placeholder); the last push took effect.
CI runs K = 2 under abort; ``python tests/slime_adapter/test_slime_e2e_agent.py --real`` runs K = 2 under
abort and in_place (EPIC_SLIME_SGLANG_PYTHON, or EPIC_SLIME_REAL_ENGINES for engines already up).
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict

import pytest

if __name__ == "__main__":
    sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.getcwd()]

from support import slime_e2e_harness as h  # noqa: E402
from support.preconditions import put_slime_on_path, skip_unless  # noqa: E402

if __name__ != "__main__":
    skip_unless("slime", "megatron.core", "httpx", "aiohttp", why="needs slime's source and the slime-contract extra")
else:
    put_slime_on_path()

NUM_ROLLOUT = 3
# the real server: 4 rollouts with 4 groups in flight, so that groups outside the batch being collected
# are in flight at pushes 2 and 3 and trained after them (push r waits for batch r + 1)
REAL_NUM_ROLLOUT, REAL_GROUPS_IN_FLIGHT = 4, 4
BATCH = 2  # --rollout-batch-size of the harness
GENERATE = "support.slime_e2e_agent.generate"
CI_GRID = [(0, "abort"), (1, "in_place"), (2, "abort"), (4, "retract")]
FULL_GRID = [(0, "abort")] + [(k, m) for k in (1, 2, 4) for m in ("abort", "in_place", "retract")]
# K = 2: oversampling leaves a group in flight at each push (at K = 1 none is); the tool takes 1 s there
REAL_CI_GRID = [(2, "abort")]
REAL_GRID = [(2, "abort"), (2, "in_place")]


def run_agent_session(workdir: str, k: int, mode: str, engines=None) -> dict:
    """One session on the stand-in, or on the real server and router when ``engines`` is given."""
    if engines is not None:
        return _run_real_session(engines, workdir, k, mode)
    h.prepare_workdir(workdir)
    held = k >= 2  # a request still running at each push (at K = 1 it would hold the very batch the push waits for)
    server = h.Server(
        workdir, os.path.join(workdir, "init.pt"), hold_max_new_tokens=h.ROLLOUT_MAX_RESPONSE_LEN if held else None
    )
    extra = ["--custom-generate-function-path", GENERATE, "--weight-push-mode", mode]
    config = {
        "trace": os.path.join(workdir, "agent.jsonl"),
        "port": server.port,
        "dist_file": os.path.join(workdir, "dist"),
        "argv": h.standard_argv(workdir, num_rollout=NUM_ROLLOUT, save_interval=None, max_staleness=k, extra=extra),
    }
    try:
        rc = h.run_session(config, timeout=240)
        stats = server.stats()
    finally:
        server.stop()
    assert rc == 0, f"logs in {workdir}"
    return {"events": h.read_trace(config["trace"]), "server": stats, "k": k, "mode": mode, "num_rollout": NUM_ROLLOUT}


def _run_real_session(engines, workdir: str, k: int, mode: str) -> dict:
    from support import slime_e2e_real as real

    extra = ["--custom-generate-function-path", GENERATE + "_slow_tool", "--weight-push-mode", mode]
    extra += ["--async-groups-in-flight", str(REAL_GROUPS_IN_FLIGHT)]  # after the harness's own: this one counts
    spec = {"max_staleness": k, "extra": extra}
    n = REAL_NUM_ROLLOUT
    result = real.run(engines, f"agent-K{k}-{mode}", workdir, num_rollout=n, spec=spec, eval_prompts=1)
    real.check_run(result, k=k, num_rollout=n)  # trained once, pushes confirmed, the last one served
    return {
        "events": result["events"],
        "k": k,
        "mode": mode,
        "engine": "real",
        "wall_s": result["wall_s"],
        "num_rollout": n,
    }


def _trained(run):
    return [e for e in run["events"] if e["event"] == "train"]


def _oldest(a: dict) -> int:
    """The stream's oldest version of a trajectory; the synchronous rollout (K = 0) records none, and
    its trajectories are on one version (check_session)."""
    if a["oldest"] is not None:
        return a["oldest"]
    return min(v for kind, v, _ in a["spans"] if kind == "model")


def summarize(run) -> dict:
    """Prompts trained once, turns, tool spans, resumed turns and the lag of each turn's tokens."""
    trains = _trained(run)
    pids = [p for e in trains for p in e["pids"]]
    lags = defaultdict(list)  # turn number -> the lag of its tokens (trainer version - token version)
    turns, tool_spans, resumed, spanning, between = [], 0, 0, 0, 0
    for e in trains:
        per_group = len(e["agent"]) // len(e["pids"])
        for g, staleness in enumerate(e["staleness"]):
            logs = e["agent"][g * per_group : (g + 1) * per_group]
            trainer_version = staleness + min(_oldest(a) for a in logs)
            for a in logs:
                turns.append(a["turns"])
                spanning += len({v for kind, v, _ in a["spans"] if kind == "model"}) > 1
                model = [(i, v) for i, (kind, v, _) in enumerate(a["spans"]) if kind == "model"]
                # a push landed while the tool ran: the turn after it starts on newer weights
                between += sum(v > pv and i > pi + 1 for (pi, pv), (i, v) in zip(model, model[1:]))
                turn = 1
                for i, (kind, version, _) in enumerate(a["spans"]):
                    if kind == "tool":
                        tool_spans += 1
                        turn += 1
                    else:
                        lags[turn].append(trainer_version - version)
                        resumed += i > 0 and a["spans"][i - 1][0] == "model"
    return {
        "trained_once": len(pids) == len(set(pids)) == run["num_rollout"] * BATCH,
        "prompts": len(set(pids)),
        "mean_turns": sum(turns) / len(turns),
        "max_turns": max(turns),
        "tool_spans": tool_spans,
        "turns_continued_across_a_push": resumed,
        "trajectories_spanning_versions": spanning,
        "pushes_between_turns": between,
        "lag_per_turn": {t: round(sum(v) / len(v), 2) for t, v in sorted(lags.items())},
        "max_lag": max(max(v) for v in lags.values()),
        "abort_resubmits": [e for e in run["events"] if e["event"] == "generate"][-1]["metrics"].get(
            "rollout/accounting/abort_resubmits", 0.0
        ),
    }


def check_session(run) -> dict:
    k, mode = run["k"], run["mode"]
    trains = _trained(run)
    assert len(trains) == run["num_rollout"]
    for e in trains:
        assert len(e["agent"]) == len(e["weight_versions"])
        for a, versions in zip(e["agent"], e["weight_versions"]):
            mask = [1 if kind == "model" else 0 for kind, _, n in a["spans"] for _ in range(n)]
            assert a["loss_mask"] == mask and len(mask) == a["response_length"]
            assert all(lp == 0.0 for lp, m in zip(a["rollout_log_probs"], mask) if m == 0)
            assert all(lp < 0.0 for lp, m in zip(a["rollout_log_probs"], mask) if m == 1)
            model_versions = [v for kind, v, _ in a["spans"] if kind == "model"]
            assert None not in model_versions and model_versions == sorted(model_versions)
            assert set(model_versions) <= {int(v) for v in versions}
            assert 1 <= a["turns"] <= 3 and a["stop_reason"] in ("answered", "turn_cap", "length_cap"), (k, mode, a)
            for i, (kind, _, n) in enumerate(a["spans"]):  # the tool's 2 tokens, or what fits at the cap
                last_at_cap = i == len(a["spans"]) - 1 and a["response_length"] == h.ROLLOUT_MAX_RESPONSE_LEN
                assert kind == "model" or n == 2 or (n == 1 and last_at_cap), a["spans"]
            if k == 0:  # the synchronous rollout (no stream, no push during it): one version per trajectory
                assert len(set(model_versions)) == 1
            elif mode == "abort":  # the stream's oldest version is the oldest model token's
                assert a["oldest"] == min(model_versions)
            else:  # held across pushes: the version known at submission, never newer
                assert a["oldest"] <= min(model_versions)
        assert max(e["staleness"]) <= k
    summary = summarize(run)
    assert summary["trained_once"], summary
    assert summary["max_turns"] >= 2 and summary["tool_spans"] >= run["num_rollout"], summary
    if k == 0:
        assert summary["max_lag"] == 0, summary
    if run.get("engine") == "real":
        summary.update(_check_against_the_server(run))
    return summary


def _check_against_the_server(run) -> dict:
    """Versions are the server's, and its log-probs of the model's tokens are the weights' own."""
    served = {e["rollout_id"] for e in run["events"] if e["event"] == "update_weights"}  # each confirmed
    for e in _trained(run):
        for a in e["agent"]:
            assert {v for kind, v, _ in a["spans"] if kind == "model"} <= served, (a["spans"], served)
    # the first batch, sampled at the first pushed version: the trainer's float32 forward at those weights
    # against the server's bf16 log-probs, over the model's tokens of every turn (tool output in context)
    mismatch = next(e for e in run["events"] if e["event"] == "version0_mismatch")["model_tokens"]
    assert mismatch["tokens"] >= 8 and mismatch["tool_tokens"] >= 2, mismatch
    assert 0 < mismatch["mean"] < 0.01 and mismatch["max"] < 0.1, mismatch
    # a push landed inside a trajectory, between its turns (the tool's wait, support/slime_e2e_agent.py)
    summary = summarize(run)
    assert summary["trajectories_spanning_versions"] >= 1 and summary["pushes_between_turns"] >= 1, summary
    return {"served_versions": sorted(served), "version0_model_token_mismatch": mismatch, "wall_s": run["wall_s"]}


@pytest.mark.slow
@pytest.mark.parametrize("k, mode", CI_GRID, ids=[f"K{k}-{m}" for k, m in CI_GRID])
def test_multi_turn_trajectories_train_once_with_versions_per_turn(tmp_path, k, mode):
    check_session(run_agent_session(str(tmp_path), k, mode))


@pytest.mark.slow
@pytest.mark.parametrize("k, mode", REAL_CI_GRID, ids=[f"K{k}-{m}" for k, m in REAL_CI_GRID])
def test_multi_turn_trajectories_on_the_real_server(real_engines, tmp_path, k, mode):
    """The test above, against the real SGLang server and sglang-router (slime's push over gloo)."""
    summary = check_session(run_agent_session(str(tmp_path), k, mode, engines=real_engines))
    print(f"\nreal-server agent session K{k}-{mode}: {summary}")


def main(argv: list[str]) -> None:
    import json
    import tempfile
    from pathlib import Path

    real = argv == ["--real"]
    engines = None
    if real:
        from support.real_sglang import engines_for_session

        engines = engines_for_session(Path(tempfile.mkdtemp(prefix="agent_real_"))).ready()
    try:
        for k, mode in REAL_GRID if real else FULL_GRID:
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    summary = check_session(run_agent_session(tmp, k, mode, engines=engines))
                except AssertionError as exc:
                    summary = {"failed": repr(exc)[:2000]}
            print(
                json.dumps({"K": k, "push_mode": mode, "engine": "real" if real else "stand-in", **summary}), flush=True
            )
    finally:
        if engines is not None:
            engines.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
