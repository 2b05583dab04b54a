"""The agent task end to end on local Ray (issue 44 item 4): `epic-slime train --config
configs/local/agent_calc.yaml` as one command, on a tiny setting, through the runtime's asynchronous
loop; and the rollout pool with real rollout workers, a push landing between two turns.

Checks: every prompt is trained exactly once (the run's batches.jsonl and its accounting), every
trained group's lag counts from its oldest model token, trajectories span versions in the async run
at K = 1, the tool's counts reach the metrics, the eval lines and the end-of-run lines."""

from __future__ import annotations

import contextlib
import io
import json
import statistics

import pytest

from support.runtime_helpers import REPO, read_jsonl

ray = pytest.importorskip("ray")

import torch  # noqa: E402

from epic_slime.evaluation.records import read_records  # noqa: E402
from epic_slime.runtime import cli, driver, local_ray  # noqa: E402
from epic_slime.runtime.config import parse_config  # noqa: E402
from epic_slime.runtime.model import ModelConfig, build_policy, response_log_probs  # noqa: E402
from epic_slime.runtime.rollout_pool import RolloutPool  # noqa: E402
from epic_slime.runtime.task import Tokenizer  # noqa: E402
from epic_slime.runtime.train_step import model_versions  # noqa: E402

STEPS, GROUPS, SAMPLES, K = 6, 4, 4, 1
TINY = [
    *("--num-rollout", str(STEPS), "--rollout-batch-size", str(GROUPS), "--n-samples-per-prompt", str(SAMPLES)),
    *("--max-staleness", str(K), "--warm-start-steps", "20", "--warm-start-batch-size", "16"),
    *("--eval-interval", "0", "--task-eval-num-prompts", "8", "--n-samples-per-eval-prompt", "2"),
    *("--no-progress", "--no-plots", "--on-bad-tokens", "raise"),
]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    local_ray.init_local_ray(num_cpus=4)  # one Ray start for the module
    yield tmp_path_factory.mktemp("runtime_agent_e2e")
    ray.shutdown()


@pytest.fixture(scope="module")
def agent_run(root):
    """The one command, in this process (on the module's Ray): `epic-slime train --config ...`."""
    argv = ["--config", str(REPO / "configs/local/agent_calc.yaml"), *TINY]
    argv += ["--output-dir", str(root / "run"), "--warm-start-cache-dir", str(root / "warm")]
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout):
        real = driver.run_training
        mp.setattr(driver, "run_training", lambda cfg: real(cfg, reuse_ray=True))
        rc = cli.train_main(argv)
    out = root / "run"
    return rc, stdout.getvalue(), out, parse_config(argv)


def test_the_one_command_runs_the_agent_task_to_the_end(agent_run):
    rc, stdout, out, cfg = agent_run
    assert rc == 0, stdout
    assert cfg.task_name == "calc" and cfg.rollout_mode == "async"
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert r["rollout/turns_per_response"] >= 1.0
        assert 0 <= r["rollout/tool_errors_per_response"] <= r["rollout/tool_calls_per_response"]
    evals = read_jsonl(out / "eval_metrics.jsonl")
    assert [e["eval/version"] for e in evals] == [0, STEPS]
    for e in evals:
        assert e["eval/heldout/turns_per_response"] >= 1.0 and "eval/heldout/tool_calls_per_response" in e
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_final_tool"] == {
        k.split("/")[-1]: v for k, v in evals[-1].items() if k.endswith("_per_response")
    }
    assert "tool use at the last eval, per response: tool_calls" in stdout
    records = read_records(str(out / "eval_records.jsonl"))  # the report's input carries each trajectory's counts
    for e in evals:
        scored = [r for r in records if r.step == e["eval/version"]]
        assert len(scored) == 8 * 2
        for name in ("tool_calls", "tool_errors", "turns"):
            mean = statistics.fmean(getattr(r, name) for r in scored)
            assert mean == pytest.approx(e[f"eval/heldout/{name}_per_response"]), name


def test_every_prompt_is_trained_exactly_once(agent_run):
    _, _, out, _ = agent_run
    batches = read_jsonl(out / "batches.jsonl")
    trained = [gid for b in batches for gid in b["trained_group_ids"]]
    dropped = [gid for b in batches for gid in b["dropped_group_ids"]]
    assert dropped == []  # the admission budget holds every group within K
    assert trained == list(range(STEPS * GROUPS))  # each once, in start order
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accounting/trained"] == STEPS * GROUPS * SAMPLES and summary["accounting/lost"] == 0
    assert summary["accounting/generated"] == summary["accounting/trained"] + summary["buffered"]


def test_lags_count_from_each_groups_oldest_model_token_and_trajectories_span_pushes(agent_run):
    _, _, out, _ = agent_run
    spanning = 0
    for b in read_jsonl(out / "batches.jsonl"):
        trained_at = b["step"] - 1  # the version the step trained on
        assert len(b["model_versions"]) == len(b["lags"]) == GROUPS
        for lag, versions in zip(b["lags"], b["model_versions"]):
            assert lag == trained_at - min(versions) <= K
            spanning += len(versions) > 1
    print(f"groups spanning two or more versions: {spanning} of {STEPS * GROUPS}")
    assert spanning >= 1


def _policy_state(seed: int) -> dict:
    tok = Tokenizer()
    model = build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=seed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _log_probs(state: dict, s: dict) -> list[float]:
    tok = Tokenizer()
    model = build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=0)
    model.load_state_dict(state)
    with torch.no_grad():
        lp, _ = response_log_probs(model.eval(), [s["prompt_ids"]], [s["response_ids"]], 1.0, tok.pad_id)
    return lp[0, : len(s["response_ids"])].tolist()


def test_a_push_between_two_turns_lands_inside_the_trajectory(root):
    """The pool with one real rollout worker: the first turns of 4 groups on version 0, then new
    weights (version 1), then their next turns. The continued groups run on version 1 (their
    behaviour log-probs are version 1's, teacher-forced) and keep version 0, their oldest token's."""
    cfg = parse_config(
        ["--task-name", "calc", "--num-rollout-workers", "1", "--rollout-batch-size", "4"]
        + ["--n-samples-per-prompt", "4", "--output-dir", str(root / "pool")]
    )
    v0, v1 = _policy_state(0), _policy_state(1)
    pool = RolloutPool(cfg)
    try:
        pool.start(ray.put(v0))
        pool.fill()
        ((_, first, version),) = pool.pending.values()
        assert version == 0 and len(first) == 4
        while (done := pool.wait([])) is None:
            pass
        pool.collect(done)
        assert pool.continuing, "no trajectory called the tool (the untrained model calls in most)"
        continued = {g.group_id for g in pool.continuing}
        assert pool.first_unfinished() == min(continued)
        pool.new_weights(1, ray.put(v1))
        pool.fill()  # the trajectories already admitted go first, on the new weights
        ((_, reqs, version),) = pool.pending.values()
        assert version == 1 and {g.group_id for g in reqs} == continued
        pool.drain()
    finally:
        ray.kill(pool.workers[0])
    assert not pool.continuing and sorted(g.group_id for g in pool.buffer) == [0, 1, 2, 3]
    assert pool.acc.generated == 16
    for g in pool.buffer:
        assert g.version == 0  # the oldest model token's version
        spans = model_versions([g])[0]
        assert spans == ([0, 1] if g.group_id in continued else [0])
        for s in g.samples:
            lp0, lp1 = _log_probs(v0, s), _log_probs(v1, s)
            for t, (v, m) in enumerate(zip(s["token_versions"], s["loss_mask"])):
                if m:  # each model token was sampled by the weights its version names
                    assert s["behavior_log_probs"][t] == pytest.approx((lp0, lp1)[v][t], abs=1e-4)
                else:
                    assert v is None and s["behavior_log_probs"][t] == 0.0
