"""End-to-end runs of the embedded runtime on local Ray (CI: 2 cores; each run ~15-30 s).

One asynchronous run with K = 0 and a rollout worker killed mid-run checks the whole loop; two
runs check checkpoint/resume equivalence; one synchronous on-policy run checks K = 0, D = 1."""

import json
from pathlib import Path

import pytest

from support.runtime_helpers import read_jsonl, tiny_config

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")

from epic_slime.runtime import checkpoint, driver, local_ray  # noqa: E402

REQUIRED = ("step", "rollout/raw_reward", "rollout/staleness/mean", "rollout/staleness/max", "train/policy/clipfrac")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    local_ray.init_local_ray(num_cpus=4)  # one Ray start for the module (several seconds each)
    yield tmp_path_factory.mktemp("runtime_e2e")
    ray.shutdown()


def run_training(cfg):
    return driver.run_training(cfg, reuse_ray=True)


@pytest.fixture(scope="module")
def async_run(root):
    cfg = tiny_config(
        root,
        "--num-rollout",
        "5",
        "--max-staleness",
        "0",
        "--stale-policy",
        "drop",
        "--debug-kill-rollout-worker-at-step",
        "2",
        name="async",
    )
    summary = run_training(cfg)
    return cfg, summary, Path(cfg.output_dir)


def test_async_run_writes_the_metrics_plots_and_eval_records(async_run):
    cfg, summary, out = async_run
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    for r in rows:
        for key in REQUIRED:
            assert key in r, key
    k = cfg.n_samples_per_eval_prompt
    evals = [r for r in rows if f"eval/heldout/mean@{k}" in r]
    assert evals and evals[-1]["step"] == 5 and evals[-1]["eval/version"] == 5
    assert {r["eval/version"] for r in evals} >= {0, 5}  # warm-start level and final
    for name in ("reward.png", "eval.png", "clipfrac.png", "staleness_hist.png"):
        assert (out / name).stat().st_size > 1000
    all_evals = read_jsonl(out / "eval_metrics.jsonl")  # every evaluation, also those not on a step line
    assert {e["eval/version"] for e in all_evals} >= {r["eval/version"] for r in evals}
    records = read_jsonl(out / "eval_records.jsonl")
    assert set(records[0]) == {
        "run",
        "method",
        "seed",
        "step",
        "benchmark",
        "prompt_id",
        "sample_idx",
        "correct",
        "weight_version",
    }
    assert all(rec["weight_version"] == rec["step"] for rec in records)  # each eval scored the version it is keyed by
    by_step = {}
    for rec in records:
        by_step.setdefault(rec["step"], []).append(rec)
    for step, recs in by_step.items():
        assert len(recs) == cfg.task_eval_num_prompts * k
        mean = sum(r["correct"] for r in recs) / len(recs)
        assert [e[f"eval/heldout/mean@{k}"] for e in all_evals if e["eval/version"] == step] == [pytest.approx(mean)]


def test_no_trained_sample_exceeds_k_and_accounting_adds_up(async_run):
    cfg, summary, out = async_run
    rows = read_jsonl(out / "metrics.jsonl")
    batches = read_jsonl(out / "batches.jsonl")
    for r, b in zip(rows, batches):
        assert r["rollout/staleness/max"] <= cfg.max_staleness == 0
        assert max(b["lags"]) <= 0 and len(b["trained_group_ids"]) == cfg.rollout_batch_size
        assert r["accounting/generated"] == r["accounting/trained"] + r["accounting/dropped"] + r["accounting/buffered"]
        assert r["accounting/trained"] == r["step"] * cfg.samples_per_step
        # K = 0: the first minibatch of a step sees exactly the weights that sampled it
        assert r["train/logprob_abs_diff_step_start"] < 1e-4
    # the admission budget (K = 0: at most one batch live at version g) starts nothing that would be
    # stale at training: nothing dropped (before it, asynchrony at K = 0 dropped stale samples)
    assert rows[-1]["rollout/staleness/dropped_total"] == 0
    assert summary["accounting/dropped"] == rows[-1]["accounting/dropped"]
    trained = [g for b in batches for g in b["trained_group_ids"]]
    dropped = [g for b in batches for g in b["dropped_group_ids"]]
    assert len(set(trained)) == len(trained) and not set(trained) & set(dropped)


def test_killed_worker_is_restarted_and_losses_are_counted(async_run):
    cfg, summary, out = async_run
    assert summary["accounting/worker_restarts"] == 1
    assert summary["accounting/lost"] > 0 and summary["accounting/lost"] % cfg.n_samples_per_prompt == 0
    assert read_jsonl(out / "metrics.jsonl")[-1]["step"] == cfg.num_rollout


def test_resume_continues_exactly(root):
    a = tiny_config(root, "--num-rollout", "3", "--save-interval", "2", "--eval-interval", "0", name="A")
    run_training(a)
    ckpt = Path(a.output_dir) / "checkpoints" / "step_000002"
    assert (ckpt / "driver.pkl").exists() and (ckpt / "trainer.pt").exists()
    b = tiny_config(root, "--num-rollout", "3", "--eval-interval", "0", "--load", str(ckpt), name="B")
    summary_b = run_training(b)
    rows_a = read_jsonl(Path(a.output_dir) / "metrics.jsonl")
    rows_b = read_jsonl(Path(b.output_dir) / "metrics.jsonl")
    assert [r["step"] for r in rows_b] == [3]
    for key in ("train/pg_loss", "train/grad_norm", "rollout/raw_reward", "train/policy/clipfrac"):
        assert rows_b[0][key] == pytest.approx(rows_a[2][key], rel=1e-6, abs=1e-9), key
    batches_a = read_jsonl(Path(a.output_dir) / "batches.jsonl")
    batches_b = read_jsonl(Path(b.output_dir) / "batches.jsonl")
    assert batches_b[0]["trained_group_ids"] == batches_a[2]["trained_group_ids"]
    before = [g for bt in batches_a[:2] for g in bt["trained_group_ids"] + bt["dropped_group_ids"]]
    after = batches_b[0]["trained_group_ids"] + batches_b[0]["dropped_group_ids"]
    assert not set(before) & set(after)  # nothing trained twice
    acc = {k.split("/", 1)[1]: v for k, v in summary_b.items() if k.startswith("accounting/")}
    assert acc["generated"] == acc["trained"] + acc["dropped"] + summary_b["buffered"]  # nothing lost
    assert acc["trained"] == 3 * a.samples_per_step
    # a checkpoints directory resolves to its latest step
    assert checkpoint.resolve_checkpoint(str(Path(a.output_dir) / "checkpoints")).name == "step_000003"
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        checkpoint.resolve_checkpoint(str(root))


def test_sync_on_policy_run(root):
    cfg = tiny_config(
        root,
        "--num-rollout",
        "2",
        "--rollout-mode",
        "sync",
        "--max-staleness",
        "0",
        "--update-depth",
        "1",
        "--eval-interval",
        "0",
        "--no-plots",
        name="sync",
    )
    summary = run_training(cfg)
    rows = read_jsonl(Path(cfg.output_dir) / "metrics.jsonl")
    assert [r["rollout/staleness/max"] for r in rows] == [0, 0]
    assert all(r["train/logprob_abs_diff_step_start"] < 1e-4 for r in rows)
    assert summary["accounting/dropped"] == 0 and summary["accounting/lag_hist"] == {"0": 2 * cfg.samples_per_step}
    assert json.loads((Path(cfg.output_dir) / "config.json").read_text())["rollout_mode"] == "sync"


def test_sync_rollout_lag_generates_every_batch_exactly_l_versions_behind(root):
    """--rollout-lag 2: batches at steps 1, 2 come from version 0 (lags 0, 1), every later one from
    version step - 3, i.e. lag exactly 2; with router noise on, the step-start gap is measured per step."""
    cfg = tiny_config(
        root,
        "--num-rollout",
        "5",
        "--rollout-mode",
        "sync",
        "--max-staleness",
        "2",
        "--rollout-lag",
        "2",
        "--rollout-router-noise",
        "0.5",
        "--lr-warmup-steps",
        "3",
        name="lag2",
    )
    run_training(cfg)
    rows = read_jsonl(Path(cfg.output_dir) / "metrics.jsonl")
    assert [r["rollout/staleness/max"] for r in rows] == [0, 1, 2, 2, 2]
    assert [r["rollout/staleness/mean"] for r in rows] == [0, 1, 2, 2, 2]
    assert all(r["train/logprob_abs_diff_step_start"] > 0 for r in rows)
    assert rows[0]["train/lr"] < rows[-1]["train/lr"] == cfg.lr


def test_sweep_writes_a_comparison_table(root):
    from support.runtime_helpers import TINY_FLAGS
    from epic_slime.runtime.cli import sweep_main

    out = root / "sweep"
    flags = [f for f in TINY_FLAGS]
    i = flags.index("--update-depth")
    del flags[i : i + 2]
    config = root / "sweep_base.yaml"
    config.write_text("update_depth: 2\n")  # no --update-depths: the config's depth is used
    argv = [
        "--config",
        str(config),
        "--policy-losses",
        "epic,grpo",
        "--seeds",
        "1",
        "--output-dir",
        str(out),
        *flags,
        "--num-rollout",
        "2",
        "--eval-interval",
        "0",
        "--no-plots",
        "--warm-start-cache-dir",
        str(root / "warm_cache"),
    ]
    assert sweep_main(argv) == 0
    table = (out / "comparison.md").read_text()
    assert "| epic | 2 | 1 | ok |" in table and "| grpo | 2 | 1 | ok |" in table
    assert table.startswith("> Smoke test: 2 steps per run")  # says it compares nothing
    assert (out / "sweep_reward.png").exists() and (out / "comparison.csv").read_text().count("\n") == 3
    assert sweep_main(argv) == 2  # a rerun would mix runs: refused


TIMING_KEYS = ("time/", "perf/", "driver/", "eval/")  # eval lines land on whichever step they finish by


def _without_timings(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)} for r in rows]


def test_sigint_checkpoints_and_the_resumed_sync_run_equals_an_uninterrupted_one(root):
    """A real SIGINT mid-run: checkpoint, summary, plots; resuming continues exactly. Sync mode with a
    fixed seed is reproducible, so the interrupted + resumed run must equal an uninterrupted run
    line for line (apart from timings), which also checks the README's reproducibility claim."""
    import os
    import signal
    import threading
    import time

    flags = ("--num-rollout", "4", "--rollout-mode", "sync", "--eval-interval", "0")
    ref = tiny_config(root, *flags, "--no-plots", name="sync_ref")
    run_training(ref)

    cfg = tiny_config(root, *flags, name="sync_int")
    metrics = Path(cfg.output_dir) / "metrics.jsonl"

    def interrupt_after_first_step():
        deadline = time.time() + 120
        while time.time() < deadline:
            if metrics.exists() and metrics.read_text().count("\n") >= 1:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=interrupt_after_first_step, daemon=True)
    watcher.start()
    summary = run_training(cfg)
    watcher.join()
    assert summary["interrupted"] == "SIGINT" and 1 <= summary["steps"] < 4
    assert Path(summary["checkpoint"]).name == f"step_{summary['steps']:06d}"
    assert json.loads((Path(cfg.output_dir) / "summary.json").read_text())["interrupted"] == "SIGINT"
    assert (Path(cfg.output_dir) / "reward.png").exists()
    interrupted_at = summary["steps"]

    resumed = tiny_config(root, *flags, "--load", str(Path(cfg.output_dir) / "checkpoints"), name="sync_int")
    summary = run_training(resumed)
    assert summary["interrupted"] is None and summary["start_step"] == interrupted_at
    assert summary["steps_this_run"] == 4 - interrupted_at
    rows, ref_rows = read_jsonl(metrics), read_jsonl(Path(ref.output_dir) / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert _without_timings(rows) == _without_timings(ref_rows)  # bit for bit, every step
    assert read_jsonl(Path(cfg.output_dir) / "batches.jsonl") == read_jsonl(Path(ref.output_dir) / "batches.jsonl")
    evals = {
        e["eval/version"]: e["eval/heldout/mean@2"] for e in read_jsonl(Path(cfg.output_dir) / "eval_metrics.jsonl")
    }
    ref_evals = {
        e["eval/version"]: e["eval/heldout/mean@2"] for e in read_jsonl(Path(ref.output_dir) / "eval_metrics.jsonl")
    }
    assert evals == ref_evals and set(evals) == {0, 4}


def test_every_due_evaluation_runs_on_the_weights_it_was_due_on(root):
    """Evaluation far slower than a training step (256 eval samples against 16 trained, every
    step): each due evaluation is queued with its weights, none is skipped or replaced by a newer
    version, and each version's records are one full evaluation. Before the queue, an evaluation
    due while one was in flight later ran on the newest weights, so versions went missing."""
    cfg = tiny_config(
        root,
        "--num-rollout",
        "4",
        "--eval-interval",
        "1",
        "--task-eval-num-prompts",
        "64",
        "--n-samples-per-eval-prompt",
        "4",
        "--rollout-mode",
        "async",
        name="eval_queue",
    )
    run_training(cfg)
    out = Path(cfg.output_dir)
    k = cfg.n_samples_per_eval_prompt
    evals = read_jsonl(out / "eval_metrics.jsonl")
    assert [e["eval/version"] for e in evals] == [0, 1, 2, 3, 4]
    per_version = {}
    for rec in read_jsonl(out / "eval_records.jsonl"):
        per_version[rec["step"]] = per_version.get(rec["step"], 0) + 1
    assert per_version == {v: 64 * k for v in range(5)}
    # eval step lines carry the newest finished evaluation; every version is in eval_metrics.jsonl
    rows = read_jsonl(out / "metrics.jsonl")
    assert rows[-1]["eval/version"] == 4
