"""`epic-slime study`: its config, its plan (paired by seed), and a tiny end-to-end study that is
killed half-way (one run's result removed) and resumed."""

import json
from pathlib import Path

import pytest
import yaml

from epic_slime.cli import main as cli_main
from epic_slime.runtime.config import parse_config
from epic_slime.study.files import RESULT
from epic_slime.study.plan import (
    DEFAULT_CONFIG,
    LADDER_QUICK_CONFIG,
    QUICK_CONFIG,
    STRESS_QUICK_CONFIG,
    StudyConfigError,
    load_study_config,
    plan,
    run_argv,
)

TINY_TRAIN = {
    "task_name": "chain",
    "task_min_operands": 12,
    "task_max_operands": 12,
    "model_max_positions": 144,
    "rollout_max_response_len": 80,
    "task_eval_num_prompts": 4,
    "n_samples_per_eval_prompt": 2,
    "rollout_batch_size": 2,
    "n_samples_per_prompt": 4,
    "num_rollout": 2,
    "eval_interval": 1,
    "num_rollout_workers": 1,
    "lr": 1.0e-4,
    "warm_start_steps": 5,
    "warm_start_batch_size": 8,
    "warm_start_answer_noise": 0.0,
    "warm_start_seed": 0,
}


def _write(tmp_path: Path, **over) -> Path:
    data = {
        "seeds": [1],
        "methods": ["epic", "grpo"],
        "test_prompts": 4,
        "train": dict(TINY_TRAIN),
        "settings": [{"name": "d2", "update_depth": 2, "rollout_mode": "sync", "max_staleness": 0}],
        **over,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_shipped_configs_parse_into_valid_runs(tmp_path):
    for path in (QUICK_CONFIG, DEFAULT_CONFIG):
        cfg = load_study_config(path)
        assert {"epic", "grpo", "dapo", "gspo", "ctpo", "ripo", "epic_raw_prob", "epic_cumulative"} == set(cfg.methods)
        for spec in plan(cfg):
            parse_config(run_argv(cfg, spec, tmp_path / spec.name, tmp_path / "ws"))


def test_runs_of_one_seed_differ_only_in_the_method(tmp_path):
    cfg = load_study_config(DEFAULT_CONFIG)
    specs = plan(cfg)
    assert len(specs) == len(cfg.seeds) * len(cfg.settings) * len(cfg.methods)
    assert [s.seed for s in specs] == sorted(s.seed for s in specs)  # seed-major: pairs complete first
    by_seed = {}
    for spec in specs:
        if spec.setting != "d8":
            continue
        run = parse_config(run_argv(cfg, spec, tmp_path / "x", tmp_path / "ws")).to_dict()
        keep = {
            k: v
            for k, v in run.items()
            if not k.startswith(("policy_loss", "epic_", "grpo_", "dapo_", "gspo_", "ctpo_", "ripo_"))
        }
        by_seed.setdefault(spec.seed, []).append(keep)
    for seed, runs in by_seed.items():
        assert all(r == runs[0] for r in runs), f"seed {seed}: runs differ beyond the method"
        assert runs[0]["warm_start_seed"] == 0 and runs[0]["seed"] == seed
    assert by_seed[1][0]["seed"] != by_seed[2][0]["seed"]


@pytest.mark.parametrize(
    "over, match",
    [
        ({"methods": ["grpo"]}, "must include 'epic'"),
        ({"methods": ["epic", "nope"]}, "loss modes"),
        ({"seeds": [1, 1]}, "distinct"),
        ({"extra": 1}, "unknown keys"),
        ({"train": {**TINY_TRAIN, "seed": 3}}, "sets \\['seed'\\]"),
        ({"test_prompts": 0}, "test_prompts"),
    ],
)
def test_bad_study_configs_are_clear_errors(tmp_path, over, match):
    with pytest.raises(StudyConfigError, match=match):
        load_study_config(_write(tmp_path, **over))


def test_bad_train_value_is_reported_before_any_run(tmp_path, capsys):
    path = _write(tmp_path, train={**TINY_TRAIN, "rollout_max_response_len": 200})
    assert cli_main(["study", "--config", str(path), "--output-dir", str(tmp_path / "out")]) == 2
    assert "model_max_positions" in capsys.readouterr().err
    assert not (tmp_path / "out" / "runs").exists()


@pytest.mark.slow
def test_tiny_study_end_to_end_and_resume(tmp_path, capsys):
    path = _write(tmp_path)
    out = tmp_path / "out"
    assert cli_main(["study", "--config", str(path), "--output-dir", str(out)]) == 0
    log = capsys.readouterr().out
    assert "2 runs planned, 0 already finished, 2 to run" in log and "2/2 done" in log
    results = {}
    for method in ("epic", "grpo"):
        run = out / "runs" / "d2" / f"{method}_s1"
        r = json.loads((run / RESULT).read_text())
        evals = [json.loads(ln) for ln in (run / "eval_metrics.jsonl").read_text().splitlines()]
        # every due evaluation runs, on the weights it was due on, even while another is in flight
        assert [e["eval/version"] for e in evals] == [0, 1, 2]
        best = max(e["eval/heldout/mean@2"] for e in evals)
        assert r["validation_at_selected"] == best
        assert r["selected_version"] == min(e["eval/version"] for e in evals if e["eval/heldout/mean@2"] == best)
        assert len(r["test_correct_at_selected"]) == 4 and 0 <= r["test_at_selected"] <= 1
        assert not (run / "checkpoints").exists()
        rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
        assert all(0 < row["train/entropy"] < 3.0 for row in rows)  # logged, below log(19) = 2.94
        results[method] = r
    # same warm start and evaluation streams: version 0 scores agree across methods
    assert results["epic"]["validation_curve"][0] == results["grpo"]["validation_curve"][0]
    md = (out / "study.md").read_text()
    assert "| epic |" in md and "| grpo |" in md and "one seed no paired interval" in md
    for png in (
        "entropy_profile.png",
        "table1_d2.png",
        "fig3a_position_d2.png",
        "fig3c_rawprob_d2.png",
        "fig6_entropy_d2.png",
        "fig7_abs_log_r_pre_d2.png",
    ):
        assert (out / png).stat().st_size > 1000, png

    # a killed study: grpo's run has no result (its directory is half-written); a restart reruns only it
    (out / "runs" / "d2" / "grpo_s1" / RESULT).unlink()
    epic_mtime = (out / "runs" / "d2" / "epic_s1" / RESULT).stat().st_mtime_ns
    assert cli_main(["study", "--config", str(path), "--output-dir", str(out)]) == 0
    log = capsys.readouterr().out
    assert "2 runs planned, 1 already finished, 1 to run" in log and "2/2 done: d2/grpo_s1" in log
    assert (out / "runs" / "d2" / "epic_s1" / RESULT).stat().st_mtime_ns == epic_mtime
    again = json.loads((out / "runs" / "d2" / "grpo_s1" / RESULT).read_text())
    # a rerun is the same run: the same validation value at every version
    assert again["validation_curve"] == results["grpo"]["validation_curve"]


@pytest.mark.slow
def test_quick_ladder_end_to_end(tmp_path, capsys):
    """`epic-slime study --ladder --quick`: every cell, the warm start's record, the figure and summary.json;
    then `--stress --quick` on the same directory: the two quick studies share one run plan, so the stress
    report runs nothing new (CI does not grow) and still computes every cell, breaking point and the test."""
    out = tmp_path / "ladder"
    assert cli_main(["study", "--ladder", "--quick", "--output-dir", str(out)]) == 0
    cfg = load_study_config(LADDER_QUICK_CONFIG)
    assert cfg.ladder and len(plan(cfg)) == len(cfg.seeds) * len(cfg.settings) * len(cfg.methods)
    summary = json.loads((out / "summary.json").read_text())
    warm = json.loads((out / "warm_start.json").read_text())
    assert 0.1 <= summary["chance"] < 0.11  # ten equally likely answer digits
    assert summary["warm_start_test"] == warm["test_mean"] and 0 <= warm["test_mean"] <= 1
    cells = summary["ladder"]["cells"]
    assert sorted(cells) == sorted(s["name"] for s in cfg.settings)
    assert (cells["d16"]["D"], cells["d16"]["K"]) == (16, 0) and (cells["d8_k2"]["D"], cells["d8_k2"]["K"]) == (8, 2)
    for name, c in cells.items():
        for m in cfg.methods:
            d = c["methods"][m]
            assert d["n_seeds"] == len(cfg.seeds) and 0 <= d["test_last_mean"] <= 1 and 0 <= d["collapse_frac"] <= 1
            assert d["test_last_sd"] is not None
            run_results = [json.loads((out / "runs" / name / f"{m}_s{s}" / RESULT).read_text()) for s in cfg.seeds]
            assert d["test_last_mean"] == pytest.approx(sum(r["test_at_final"] for r in run_results) / len(cfg.seeds))
    assert (
        cells["d8"]["methods"]["epic"]["staleness_max"] == 0 and cells["d8_k2"]["methods"]["epic"]["staleness_max"] <= 2
    )
    assert summary["ladder"]["power"]["n_seeds"] == len(cfg.seeds)
    md = (out / "study.md").read_text()
    assert "## The policy-lag ladder" in md and "collapses" in md and "Power:" in md and "Chance:" in md
    assert (out / "ladder.png").stat().st_size > 10_000
    # the report phase reads files only: a second report from the same files is the same report
    first = (out / "summary.json").read_text()
    assert cli_main(["study", "--ladder", "--quick", "--output-dir", str(out), "--analyze-only"]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["ladder"] == json.loads(first)["ladder"]

    # the quick stress ladder: its plan is the quick ladder's, so every run is found finished
    capsys.readouterr()
    assert cli_main(["study", "--stress", "--quick", "--output-dir", str(out)]) == 0
    n = len(plan(load_study_config(STRESS_QUICK_CONFIG)))
    assert f"{n} runs planned, {n} already finished, 0 to run" in capsys.readouterr().out
    st = json.loads((out / "summary.json").read_text())["stress"]
    assert st["runs_finished"] == st["runs_planned"] == n and sorted(st["cells_complete"]) == sorted(cells)
    for name, c in st["cells"].items():
        for m in cfg.methods:
            d = c["methods"][m]
            assert d["test_last_mean"] == pytest.approx(cells[name]["methods"][m]["test_last_mean"])
            assert isinstance(d["breaks"], bool) and d["mean_abs_log_ratio"] >= 0 and d["prefix_log_ratio_p90"] >= 0
            assert 0 <= d["grad_removed_frac"] <= 1 and d["collapse_frac"] == cells[name]["methods"][m]["collapse_frac"]
    assert set(st["breaking_point"]) == set(cfg.methods) and st["hypothesis"]["verdict"] in (
        "untested",
        "rejected",
        "supported",
        "not rejected",
    )
    assert "## The stress ladder" in (out / "study.md").read_text() and (out / "stress.png").stat().st_size > 10_000


def _stage(folder: Path, **over):
    folder.mkdir()
    return load_study_config(_write(folder, **over))


def test_a_study_run_in_stages_of_different_seeds_ends_with_one_warm_start_record_of_all(tmp_path):
    """warm_start.json measured by a stage of seed 1 gains seed 2 when a stage of seed 2 runs (before: the
    record was measured once, so the stress report's warm start per seed lacked the later stages' seeds),
    and keeps another task's warm-start scores. Equal to measuring both seeds at once (same streams)."""
    from epic_slime.study.files import read_warm_start
    from epic_slime.study.run import measure_other_warm_start, measure_warm_start, missing_warm_start_seeds

    settings = [
        {"name": "d2", "update_depth": 2, "rollout_mode": "sync", "max_staleness": 0},
        {"name": "other", "update_depth": 2, "rollout_mode": "sync", "max_staleness": 0, "warm_start_steps": 6},
    ]  # another warm start (the stress ladder's long task has its own)
    out = tmp_path / "staged"
    out.mkdir()
    stage1 = _stage(tmp_path / "a", settings=settings)
    measure_warm_start(stage1, out, log=lambda *_: None)
    measure_other_warm_start(stage1, out, "other", log=lambda *_: None)
    first = read_warm_start(out)
    assert set(first["test_by_seed"]) == {"1"} and set(first["by_setting"]) == {"d2", "other"}

    stage2 = _stage(tmp_path / "b", seeds=[2], settings=settings)
    assert missing_warm_start_seeds(stage2, first) == [2]
    measure_warm_start(stage2, out, log=lambda *_: None, previous=first)
    measure_other_warm_start(stage2, out, "other", log=lambda *_: None)
    staged = read_warm_start(out)
    assert set(staged["test_by_seed"]) == {"1", "2"} and missing_warm_start_seeds(stage2, staged) == []
    for name in ("d2", "other"):
        assert set(staged["by_setting"][name]["test_by_seed"]) == {"1", "2"}, name
    assert staged["by_setting"]["other"]["test_by_seed"]["1"] == first["by_setting"]["other"]["test_by_seed"]["1"]

    both = _stage(tmp_path / "c", seeds=[1, 2], settings=settings)
    once = tmp_path / "once"
    once.mkdir()
    measure_warm_start(both, once, log=lambda *_: None)
    measure_other_warm_start(both, once, "other", log=lambda *_: None)
    reference = read_warm_start(once)
    assert staged["test_by_seed"] == reference["test_by_seed"]
    assert staged["by_setting"] == reference["by_setting"]


def test_the_study_trains_its_warm_start_with_progress_shown(tmp_path, monkeypatch):
    """The quick study's warm start (2,500 steps) was silent for 858 s under load: it now says it trains,
    with the runtime's progress bar (the call the driver makes with progress on)."""
    from epic_slime.runtime import warmstart
    from epic_slime.study.run import measure_warm_start

    seen = []

    class Stop(Exception):
        pass

    def fake_warm_start_for(run_cfg, progress=False):
        seen.append(progress)
        raise Stop

    monkeypatch.setattr(warmstart, "warm_start_for", fake_warm_start_for)
    with pytest.raises(Stop):
        measure_warm_start(load_study_config(QUICK_CONFIG), tmp_path, log=lambda *_: None)
    assert seen == [True]
