"""The slime e2e harness (``slime_e2e_harness.py``) against the REAL SGLang 0.5.15.post1 server behind the
REAL sglang-router 0.3.2 (``real_sglang.py``), instead of the stand-ins.

What runs: slime 624b824a's rollout function path (the project's ``generate_rollout`` around slime's
``generate_and_rm``), the project's ``GroupStream``, slime's own ``UpdateWeightFromDistributed.
update_weights`` over a gloo group into the real server (the checkpoint's tensor names:
per-expert weights and the untied ``lm_head``, ``hf_export.checkpoint_tensors``), every push confirmed
by scoring a probe on the server (``served_probe.confirm_push``) and by ``/model_info``'s version.

Three runs (``RUNS``): async K = 2 under ``--weight-push-mode abort``, async K = 2 under ``in_place``,
sync K = 0. CI runs one of them (``tests/slime_adapter/test_slime_e2e_real.py``); all three:

    EPIC_SLIME_SGLANG_PYTHON=... PYTHONPATH=.:tests:$SLIME_PATH python tests/support/slime_e2e_real.py [RUN ...]

(docs/testing.md). Each run leaves the server serving the exported initial checkpoint again, at the
version it found (``/update_weights_from_disk`` while idle), so the tests sharing the server see it
as launched.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

if __name__ == "__main__":  # run as a script: the repository and tests/ on the path
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [os.path.dirname(os.path.dirname(_HERE)), os.path.dirname(_HERE)]

from support import slime_e2e_harness as h
from support.real_push import restore_initial_weights

RUNS = {
    "async-k2-abort": {"max_staleness": 2, "extra": ["--weight-push-mode", "abort"]},
    "async-k2-in_place": {"max_staleness": 2, "extra": ["--weight-push-mode", "in_place"]},
    "sync-k0": {"max_staleness": 0, "extra": []},
}
CI_RUN = "async-k2-abort"  # the most informative: pushes abort requests in flight, groups span versions
NUM_ROLLOUT = 4
EVAL_PROMPTS = 4  # x 4 samples = 16 eval samples every rollout
SESSION_TIMEOUT_S = 900


def run(
    engines,
    name: str,
    workdir: str | None = None,
    num_rollout: int = NUM_ROLLOUT,
    spec: dict | None = None,
    eval_prompts: int = EVAL_PROMPTS,
) -> dict:
    """One e2e session of ``RUNS[name]`` (or of ``spec``, named ``name``: the multi-turn agent's runs in
    tests/slime_adapter/test_slime_e2e_agent.py) against ``engines`` (a ready ``RealEngines``); its trace
    and summary."""
    from support.served_probe import confirm_push, model_logprobs, served_logprobs, served_weight_version

    spec = spec or RUNS[name]
    workdir = workdir or tempfile.mkdtemp(prefix=f"slime_e2e_real_{name}_")
    h.prepare_workdir(workdir, train_prompts=100, eval_prompts=eval_prompts)
    trace = os.path.join(workdir, "trace.jsonl")
    found_version = served_weight_version(engines.server.url)
    started = time.time()
    try:
        rc = h.run_session(
            {
                "trace": trace,
                "port": engines.router.port,
                "dist_file": os.path.join(workdir, "dist"),
                "engine_urls": [engines.server.url],
                "real_engines": True,
                "argv": h.standard_argv(
                    workdir,
                    num_rollout=num_rollout,
                    save_interval=None,
                    max_staleness=spec["max_staleness"],
                    extra=spec["extra"],
                ),
            },
            timeout=SESSION_TIMEOUT_S,
        )
        wall = time.time() - started
        events = h.read_trace(trace) if os.path.exists(trace) else []
        # the last push took effect: the server scores the probe as the trained model, not as the initial one
        final = _final_model(workdir, events)
        probe = _probe_ids()
        served = served_logprobs(engines.server.url, probe)
        gaps = {
            "trained": confirm_push(engines.server.url, final, probe) if final is not None else None,
            "initial": sum(abs(a - b) for a, b in zip(served, model_logprobs(engines.model, probe))) / len(served),
        }
        last_version = served_weight_version(engines.server.url)
    finally:
        if engines.server.alive():
            restore_initial_weights(engines, found_version)
    return {
        "name": name,
        "rc": rc,
        "events": events,
        "workdir": workdir,
        "wall_s": wall,
        "probe_gaps": gaps,
        "last_version": last_version,
        "summary": summarise(name, events, wall, gaps),
    }


def _probe_ids() -> list[int]:
    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    return [tok.bos_id] + tok.encode("9-4+8=Answer:13")


def _final_model(workdir: str, events: list[dict]):
    """The trained model as the session left it (its last push), saved by the session at its end."""
    import torch

    from epic_slime.runtime.model import ModelConfig, build_policy
    from epic_slime.runtime.task import Tokenizer

    path = os.path.join(workdir, "final_model.pt")
    if not os.path.exists(path):
        return None
    tok = Tokenizer()
    model = build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=0).eval()
    model.load_state_dict(torch.load(path))
    return model


def summarise(name: str, events: list[dict], wall: float, gaps: dict) -> dict:
    trains = [e for e in events if e["event"] == "train"]
    mismatch = next((e for e in events if e["event"] == "version0_mismatch"), None)
    pushes = [e for e in events if e["event"] == "update_weights"]
    last = [e["metrics"] for e in events if e["event"] == "generate"][-1:] or [{}]
    return {
        "run": name,
        "wall_s": round(wall, 1),
        "prompts_trained": sum(len(e["pids"]) for e in trains),
        "staleness_per_group": [s for e in trains for s in e["staleness"]],
        "staleness_histogram": dict(sorted(Counter(s for e in trains for s in e["staleness"]).items())),
        "version0_mismatch": {k: mismatch[k] for k in ("mean", "max", "tokens")} if mismatch else None,
        "pushes": len(pushes),
        "max_confirmed_gap": max((e.get("confirmed_gap") or 0.0 for e in pushes), default=None),
        "final_probe_gap_trained": gaps.get("trained"),
        "final_probe_gap_initial": gaps.get("initial"),
        "abort_resubmits": last[0].get("rollout/accounting/abort_resubmits"),
        "dropped_groups": last[0].get("rollout/staleness/total_dropped_groups"),
    }


def events(result: dict, name: str) -> list[dict]:
    return [e for e in result["events"] if e["event"] == name]


def check_run(result: dict, k: int, num_rollout: int = NUM_ROLLOUT) -> None:
    """What every run against the real engines must show (the CI test and the script, for all three)."""
    assert result["rc"] == 0, f"session failed; log {result['workdir']}/trace.jsonl.log"
    trains = events(result, "train")
    assert [e["rollout_id"] for e in trains] == list(range(num_rollout))
    pids = [p for e in trains for p in e["pids"]]
    assert len(pids) == 2 * num_rollout and not [p for p, n in Counter(pids).items() if n > 1], pids
    for e in trains:
        assert max(e["staleness"]) <= k, e["staleness"]
        # the version span of each group's samples (every version any token of it was sampled on)
        n = len(e["weight_versions"]) // len(e["pids"])
        for g in range(len(e["pids"])):
            versions = {int(v) for s in e["weight_versions"][g * n : (g + 1) * n] for v in s}
            assert max(versions) - min(versions) <= k, (e["rollout_id"], g, versions)
    pushes = events(result, "update_weights")
    assert len(pushes) >= num_rollout and all(p["confirmed_gap"] is not None for p in pushes)
    # the last push took effect: the server scores the probe as the pushed (trained) model, lm_head
    # included, and no longer as the initial one
    gaps = result["probe_gaps"]
    assert gaps["trained"] <= 0.01 < gaps["initial"], gaps
    assert result["last_version"] == str(pushes[-1]["rollout_id"])


def check_eval_records(result: dict, num_rollout: int = NUM_ROLLOUT) -> None:
    """Every rollout's (and the pre-training) evaluation scored the weights its step names."""
    from epic_slime.evaluation.records import read_records

    records = read_records(os.path.join(result["workdir"], "eval_records.jsonl"))
    steps = sorted({r.step for r in records})
    assert steps == list(range(-1, num_rollout)), steps
    assert {(r.step, r.weight_version) for r in records} == {(s, s) for s in steps}
    assert Counter(r.step for r in records) == {s: EVAL_PROMPTS * 4 for s in steps}


def main(argv: list[str]) -> int:
    from support.real_sglang import engines_for_session

    names = argv or list(RUNS)
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        raise SystemExit(f"unknown run(s) {unknown}; choose from {list(RUNS)}")
    workdir, failed = tempfile.mkdtemp(prefix="slime_e2e_real_"), False
    engines = engines_for_session(Path(workdir))  # EPIC_SLIME_REAL_ENGINES: engines already up
    try:
        engines.ready()
        for name in names:
            result = run(engines, name, os.path.join(workdir, name))
            try:
                check_run(result, k=RUNS[name]["max_staleness"])
                check_eval_records(result)
                verdict = "passed"
            except AssertionError as exc:
                verdict, failed = f"FAILED: {exc}", True
            print(
                json.dumps({**result["summary"], "rc": result["rc"], "checks": verdict, "workdir": result["workdir"]}),
                flush=True,
            )
    finally:
        engines.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
