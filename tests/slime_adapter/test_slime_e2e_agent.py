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
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections import defaultdict

import pytest

if __name__ == "__main__":
    sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.getcwd()]

from support import slime_e2e_harness as h  # noqa: E402

_SLIME = h.slime_path()
if _SLIME and _SLIME not in sys.path:
    sys.path.insert(0, _SLIME)
_MISSING = [
    m for m in ("slime", "megatron.core", "httpx", "aiohttp") if importlib.util.find_spec(m.split(".")[0]) is None
]
if _MISSING and __name__ != "__main__":
    pytest.skip(f"needs slime's source and the slime-contract extra; missing: {_MISSING}", allow_module_level=True)

NUM_ROLLOUT = 3
BATCH = 2  # --rollout-batch-size of the harness
GENERATE = "support.slime_e2e_agent.generate"
CI_GRID = [(0, "abort"), (1, "in_place"), (2, "abort"), (4, "retract")]
FULL_GRID = [(0, "abort")] + [(k, m) for k in (1, 2, 4) for m in ("abort", "in_place", "retract")]


def run_agent_session(workdir: str, k: int, mode: str) -> dict:
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
    return {"events": h.read_trace(config["trace"]), "server": stats, "k": k, "mode": mode}


def _trained(run):
    return [e for e in run["events"] if e["event"] == "train"]


def summarize(run) -> dict:
    """Prompts trained once, turns, tool spans, resumed turns and the lag of each turn's tokens."""
    trains = _trained(run)
    pids = [p for e in trains for p in e["pids"]]
    lags = defaultdict(list)  # turn number -> the lag of its tokens (trainer version - token version)
    turns, tool_spans, resumed = [], 0, 0
    for e in trains:
        per_group = len(e["agent"]) // len(e["pids"])
        for g, staleness in enumerate(e["staleness"]):
            logs = e["agent"][g * per_group : (g + 1) * per_group]
            trainer_version = staleness + min(a["oldest"] for a in logs)
            for a in logs:
                turns.append(a["turns"])
                turn = 1
                for i, (kind, version, _) in enumerate(a["spans"]):
                    if kind == "tool":
                        tool_spans += 1
                        turn += 1
                    else:
                        lags[turn].append(trainer_version - version)
                        resumed += i > 0 and a["spans"][i - 1][0] == "model"
    return {
        "trained_once": len(pids) == len(set(pids)) == NUM_ROLLOUT * BATCH,
        "prompts": len(set(pids)),
        "mean_turns": sum(turns) / len(turns),
        "max_turns": max(turns),
        "tool_spans": tool_spans,
        "turns_continued_across_a_push": resumed,
        "lag_per_turn": {t: round(sum(v) / len(v), 2) for t, v in sorted(lags.items())},
        "max_lag": max(max(v) for v in lags.values()),
        "abort_resubmits": [e for e in run["events"] if e["event"] == "generate"][-1]["metrics"].get(
            "rollout/accounting/abort_resubmits", 0.0
        ),
    }


def check_session(run) -> dict:
    k, mode = run["k"], run["mode"]
    trains = _trained(run)
    assert len(trains) == NUM_ROLLOUT
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
            if mode == "abort" or k == 0:  # the stream's oldest version is the oldest model token's
                assert a["oldest"] == min(model_versions)
            else:  # held across pushes: the version known at submission, never newer
                assert a["oldest"] <= min(model_versions)
        assert max(e["staleness"]) <= k
    summary = summarize(run)
    assert summary["trained_once"], summary
    assert summary["max_turns"] >= 2 and summary["tool_spans"] >= NUM_ROLLOUT, summary
    if k == 0:
        assert summary["max_lag"] == 0, summary
    return summary


@pytest.mark.slow
@pytest.mark.parametrize("k, mode", CI_GRID, ids=[f"K{k}-{m}" for k, m in CI_GRID])
def test_multi_turn_trajectories_train_once_with_versions_per_turn(tmp_path, k, mode):
    check_session(run_agent_session(str(tmp_path), k, mode))


def main() -> None:
    import json
    import tempfile

    rows = []
    for k, mode in FULL_GRID:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                summary = check_session(run_agent_session(tmp, k, mode))
            except AssertionError as exc:
                summary = {"failed": repr(exc)[:2000]}
        rows.append({"K": k, "push_mode": mode, **summary})
        print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
