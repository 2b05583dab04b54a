"""The stress ladder: its configs, the breaking rule, breaking points, the paired comparisons next to
them, the hypothesis test, and the report written from synthetic run files (no model, no Ray)."""

import json
import statistics

import pytest
import yaml

from epic_slime.runtime.config import parse_config
from epic_slime.runtime.task import Tokenizer
from epic_slime.runtime.tasks import train_problem
from epic_slime.study import stress
from epic_slime.study.analysis import t_quantile_975
from epic_slime.study.files import RESULT, WARM_START
from epic_slime.study.plan import (
    LADDER_QUICK_CONFIG,
    STRESS_CONFIG,
    STRESS_QUICK_CONFIG,
    StudyConfigError,
    load_study_config,
    plan,
    run_argv,
)
from epic_slime.study.report import write_report

METHODS = ["epic", "epic_raw_prob", "grpo", "gspo", "ctpo", "dppo_tv", "cispo", "bandpo"]


def test_shipped_stress_config_parses_into_valid_runs(tmp_path):
    cfg = load_study_config(STRESS_CONFIG)
    assert cfg.methods == METHODS and cfg.seeds == [1, 2, 3]
    axes = cfg.stress["axes"]
    assert set(axes) == {"lr", "depth", "staleness", "length"}
    lrs = [
        parse_config(run_argv(cfg, plan(cfg)[0].__class__(s, "epic", 1), tmp_path / s, tmp_path / "w")).lr
        for s in axes["lr"]
    ]
    assert lrs == sorted(lrs) and lrs[-1] / lrs[0] >= 16  # a multiplier that grows along the axis
    for spec in plan(cfg):
        run = parse_config(run_argv(cfg, spec, tmp_path / spec.name, tmp_path / "ws"))
        if spec.setting == "long_lr4":  # 4x the ladder's 51-token responses, all of them room to finish
            p = train_problem(0, 1, run.task)
            tokens = len(Tokenizer().encode(p.solution)) + 1  # + <eos>
            assert run.task_name == "chain_long" and tokens >= 4 * 51 - 3 and run.rollout_max_response_len >= tokens
        if spec.setting == "lr4_k16":
            assert run.max_staleness == 16 and run.rollout_buffer_batches == 16 and run.num_rollout > 16
    assert (
        parse_config(
            run_argv(cfg, plan(cfg)[0].__class__("lr4_d128", "epic", 1), tmp_path / "d", tmp_path / "w")
        ).update_depth
        == 128
    )


def test_quick_stress_shares_the_quick_ladders_run_plan():
    """So that in the suite the quick stress report reads the quick ladder's runs: CI does not grow."""
    a, b = load_study_config(STRESS_QUICK_CONFIG), load_study_config(LADDER_QUICK_CONFIG)
    assert (a.seeds, a.methods, a.settings, a.test_prompts, a.train) == (
        b.seeds,
        b.methods,
        b.settings,
        b.test_prompts,
        b.train,
    )
    assert plan(a) == plan(b) and a.stress and not b.stress


def _write(tmp_path, stress_block, settings=("a", "b")):
    data = {
        "seeds": [1],
        "methods": ["epic"],
        "test_prompts": 4,
        "train": {"lr": 1e-4},
        "settings": [{"name": s, "update_depth": 2} for s in settings],
        "stress": stress_block,
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    "block, match",
    [
        ({"axes": {"lr": ["a"]}}, "at least two distinct"),
        ({"axes": {"lr": ["a", "zz"]}}, "not in settings"),
        ({"axes": {"lr": ["a", "a"]}}, "at least two distinct"),
        ({"axes": {}}, "must be a mapping"),
        ({"levels": 1}, "must be a mapping"),
    ],
)
def test_bad_stress_blocks_are_clear_errors(tmp_path, block, match):
    with pytest.raises(StudyConfigError, match=match):
        load_study_config(_write(tmp_path, block))


def test_a_setting_on_no_axis_is_an_error(tmp_path):
    with pytest.raises(StudyConfigError, match="settings \\['c'\\] are on no stress axis"):
        load_study_config(_write(tmp_path, {"axes": {"lr": ["a", "b"]}}, settings=("a", "b", "c")))


def _result(setting, method, seed, last, curve, failed=None):
    return {
        "setting": setting,
        "method": method,
        "seed": seed,
        "k": 8,
        "test_at_final": last,
        "test_at_selected": last,
        "validation_curve": curve,
        "selected_version": 0,
        "failed": failed,
        "final_version": curve[-1][0],
        "validation_at_final": curve[-1][1],
        "validation_at_selected": curve[0][1],
        "test_correct_at_selected": [[True]],
        "wall_s": 1.0,
    }


def _rows(clip):
    return [
        {
            "step": i,
            "train/policy/clipfrac": clip,
            "train/policy/clipfrac_upper": clip / 2,
            "train/policy/clipfrac_lower": clip / 2,
            "train/policy/logprob_abs_diff": 0.01 + clip,
            "train/policy/abs_L_p50_position": 0.1,
            "train/policy/abs_L_p90_position": 0.2 + clip,
            "train/policy/abs_L_mean": 0.1,
            "train/policy/grad_removed_frac": clip,
            "train/entropy": 0.5,
            "train/grad_norm": 1.0,
            "train/logprob_abs_diff_step_start": 0.0,
            "train/policy/finite_lower_frac": 1.0,
            **{f"train/policy/clipfrac_position_bin_{b}": clip for b in range(10)},
        }
        for i in range(1, 9)
    ]


UP, DOWN = [(0, 0.40), (5, 0.50), (10, 0.55)], [(0, 0.40), (5, 0.20), (10, 0.15)]
WARM = {1: 0.40, 2: 0.42, 3: 0.38}
# per setting, (method -> last test score per seed, collapsing?): grpo and gspo break at s2 and s3, epic
# holds above the warm start at s2 and falls at s3; dppo_tv never breaks
SCORES = {
    "s1": {
        "epic": ([0.60, 0.62, 0.58], False),
        "grpo": ([0.55, 0.57, 0.50], False),
        "gspo": ([0.5, 0.5, 0.5], False),
        "dppo_tv": ([0.61, 0.60, 0.63], False),
    },
    "s2": {
        "epic": ([0.50, 0.55, 0.47], False),
        "grpo": ([0.10, 0.12, 0.09], True),
        "gspo": ([0.3, 0.2, 0.25], False),
        "dppo_tv": ([0.58, 0.57, 0.60], False),
    },
    "s3": {
        "epic": ([0.30, 0.20, 0.25], True),
        "grpo": ([0.05, 0.05, 0.06], True),
        "gspo": ([0.1, 0.1, 0.1], True),
        "dppo_tv": ([0.50, 0.52, 0.49], False),
    },
}


def _stress_study(tmp_path):
    cfg_path = tmp_path / "stress.yaml"
    cfg_path.write_text(
        yaml.safe_dump(
            {
                "seeds": [1, 2, 3],
                "methods": ["epic", "grpo", "gspo", "dppo_tv"],
                "test_prompts": 8,
                "train": {"lr": 1e-4},
                "settings": [
                    {"name": "s1", "update_depth": 8},
                    {"name": "s2", "update_depth": 8, "lr": 4e-4},
                    {"name": "s3", "update_depth": 8, "lr": 1.6e-3},
                ],
                "stress": {"axes": {"lr": ["s1", "s2", "s3"], "depth": ["s2", "s3"]}},
            }
        )
    )
    cfg = load_study_config(cfg_path)
    results, metrics = [], {}
    for setting, by_method in SCORES.items():
        for m, (scores, falls) in by_method.items():
            for seed, x in zip((1, 2, 3), scores):
                results.append(_result(setting, m, seed, x, DOWN if falls else UP))
                metrics[(setting, m, seed)] = _rows({"epic": 0.05, "dppo_tv": 0.2}.get(m, 0.01))
    return cfg, results, metrics


def test_cells_breaks_and_breaking_points(tmp_path):
    cfg, results, metrics = _stress_study(tmp_path)
    st = stress.stress_summary(cfg, results, metrics, {"test_by_seed": {str(k): v for k, v in WARM.items()}})
    c = st["cells"]
    warm_mean = statistics.fmean(WARM.values())
    e1 = c["s1"]["epic"]
    assert e1["test_last_mean"] == pytest.approx(0.60) and e1["test_last_sd"] == pytest.approx(0.02)
    assert e1["warm_start_mean"] == pytest.approx(warm_mean) and not e1["breaks"]
    assert c["s2"]["grpo"]["collapse_frac"] == 1.0 and c["s2"]["grpo"]["breaks"]
    # gspo at s2: no collapse, but 0.25 < 0.40 - 0.05: the margin rule
    assert c["s2"]["gspo"]["collapse_frac"] == 0.0 and c["s2"]["gspo"]["breaks"]
    assert c["s3"]["epic"]["breaks"] and not c["s3"]["dppo_tv"]["breaks"]
    assert c["s2"]["grpo"]["diff_vs_epic"]["mean"] == pytest.approx(
        statistics.fmean([0.10 - 0.50, 0.12 - 0.55, 0.09 - 0.47])
    )
    assert c["s1"]["dppo_tv"]["clipfrac"] == pytest.approx(0.2) and c["s1"]["dppo_tv"][
        "grad_removed_frac"
    ] == pytest.approx(0.2)
    assert c["s1"]["dppo_tv"]["prefix_log_ratio_p90"] == pytest.approx(0.4)
    bp = st["breaking_points"]
    assert bp["grpo"]["lr"]["level"] == "s2" and bp["gspo"]["lr"]["level"] == "s2" and bp["epic"]["lr"]["level"] == "s3"
    assert bp["grpo"]["depth"]["level"] == "s2" and bp["epic"]["depth"]["level"] == "s3"
    assert bp["dppo_tv"]["lr"]["level"] is None and bp["dppo_tv"]["lr"]["finished_levels"] == 3
    assert not bp["grpo"]["lr"]["provisional"] and not bp["dppo_tv"]["lr"]["provisional"]
    # with the middle level unfinished, a break at the harshest level is provisional
    partial = stress.breaking_points({"s1": c["s1"], "s3": c["s3"]}, {"lr": ["s1", "s2", "s3"]}, ["epic", "dppo_tv"])
    assert partial["epic"]["lr"]["level"] == "s3" and partial["epic"]["lr"]["provisional"]
    assert partial["dppo_tv"]["lr"]["level"] is None and partial["dppo_tv"]["lr"]["provisional"]
    near = [(r["method"], r["axis"], r["setting"], r["offset"]) for r in st["near_breaks"]]
    assert ("grpo", "lr", "s1", -1) in near and ("grpo", "lr", "s2", 0) in near and ("grpo", "lr", "s3", 1) in near
    assert not any(r[0] == "dppo_tv" for r in near)
    assert [r[0] for r in stress.robustness_ranking(st, cfg.methods)][0] == "dppo_tv"


def test_the_hypothesis_test_pools_epic_minus_warm_start_where_grpo_or_gspo_break(tmp_path):
    cfg, results, metrics = _stress_study(tmp_path)
    warm_record = {"test_by_seed": {str(k): v for k, v in WARM.items()}}
    h = stress.stress_summary(cfg, results, metrics, warm_record)["hypothesis"]
    assert h["cells"] == ["s2", "s3"] and h["epic_breaks_at"] == ["s3"]
    diffs = [x - WARM[s] for x, s in zip(SCORES["s2"]["epic"][0] + SCORES["s3"]["epic"][0], [1, 2, 3] * 2)]
    half = t_quantile_975(5) * statistics.stdev(diffs) / 6**0.5
    assert h["pairs"] == 6 and h["mean"] == pytest.approx(statistics.fmean(diffs))
    assert h["low"] == pytest.approx(statistics.fmean(diffs) - half) and h["minimum_detectable_drop"] > 0
    assert h["verdict"] == "rejected"  # EPIC breaks at half of those cells (s3 of s2, s3)
    # without s3: EPIC holds clearly above the warm start where GRPO and GSPO break (s2)
    keep = [r for r in results if r["setting"] != "s3"]
    cfg2 = load_study_config(_rewrite_without_s3(tmp_path))
    h2 = stress.stress_summary(cfg2, keep, metrics, warm_record)["hypothesis"]
    assert h2["cells"] == ["s2"] and h2["verdict"] == "supported" and h2["low"] > 0
    # nothing breaks at all: untested, and said so
    calm = [r for r in keep if r["setting"] == "s1"]
    cfg3 = load_study_config(_rewrite_without_s3(tmp_path))
    h3 = stress.stress_summary(cfg3, calm, metrics, warm_record)["hypothesis"]
    assert h3["verdict"] == "untested" and "broke nowhere" in h3["reason"]


def test_a_cell_whose_warm_start_is_at_chance_is_untestable_and_breaks_nowhere(tmp_path):
    cfg, results, metrics = _stress_study(tmp_path)
    # s3's task: its warm start 0.12 against chance 0.10, within the margin; the other settings' at 0.40
    warm = {
        "test_by_seed": {str(k): v for k, v in WARM.items()},
        "chance_test": {"chance": 0.10},
        "by_setting": {
            "s1": {"test_by_seed": {str(k): v for k, v in WARM.items()}, "chance": 0.10},
            "s2": {"test_by_seed": {str(k): v for k, v in WARM.items()}, "chance": 0.10},
            "s3": {"test_by_seed": {"1": 0.12, "2": 0.11, "3": 0.13}, "chance": 0.10},
        },
    }
    st = stress.stress_summary(cfg, results, metrics, warm)
    c = st["cells"]
    # grpo at s3 (0.05 against a warm start of 0.12, every seed collapsing) would break by either rule
    assert c["s3"]["grpo"]["collapse_frac"] == 1.0 and not c["s3"]["grpo"]["testable"]
    assert not any(c["s3"][m]["breaks"] for m in cfg.methods)
    assert c["s2"]["grpo"]["testable"] and c["s2"]["grpo"]["breaks"]
    assert st["untestable_settings"] == ["s3"] and st["chance_by_setting"]["s3"] == 0.10
    bp = st["breaking_points"]
    # epic broke only at s3: now nowhere, and provisional (its harshest level says nothing)
    assert bp["epic"]["lr"]["level"] is None and bp["epic"]["lr"]["untestable"] == ["s3"]
    assert bp["epic"]["lr"]["finished_levels"] == 2 and bp["epic"]["lr"]["provisional"]
    assert bp["grpo"]["lr"]["level"] == "s2" and not bp["grpo"]["lr"]["provisional"]
    assert st["hypothesis"]["cells"] == ["s2"]
    # the same cells with s3's warm start well above chance: epic breaks at s3 as before
    warm["by_setting"]["s3"]["chance"] = 0.02
    assert stress.stress_summary(cfg, results, metrics, warm)["breaking_points"]["epic"]["lr"]["level"] == "s3"


def _rewrite_without_s3(tmp_path):
    data = yaml.safe_load((tmp_path / "stress.yaml").read_text())
    data["settings"] = data["settings"][:2]
    data["stress"] = {"axes": {"lr": ["s1", "s2"]}}
    path = tmp_path / "stress2.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_diverged_run_counts_as_collapsed():
    assert stress.run_collapsed(_result("s", "grpo", 1, 0.4, UP, failed="FloatingPointError: loss is nan"))
    assert not stress.run_collapsed(_result("s", "grpo", 1, 0.4, UP))


def test_the_report_from_run_files(tmp_path):
    cfg, results, metrics = _stress_study(tmp_path)
    out = tmp_path / "out"
    for r in results:
        run = out / "runs" / r["setting"] / f"{r['method']}_s{r['seed']}"
        run.mkdir(parents=True)
        (run / RESULT).write_text(json.dumps(r))
        (run / "metrics.jsonl").write_text(
            "\n".join(json.dumps(x) for x in metrics[(r["setting"], r["method"], r["seed"])])
        )
    profile = {
        "responses": 8,
        "mean_length": 51.0,
        "min_length": 51,
        "truncated_frac": 0.0,
        "mean_entropy": 0.3,
        "entropy_result_tokens": 0.5,
        "entropy_other_tokens": 0.1,
        "entropy_by_relative_bin": [0.3] * 10,
        "relative_bin_cv": 0.1,
        "entropy_by_position": [0.3] * 51,
    }
    chance = {
        "chance": 0.1,
        "best_constant_answer": 3,
        "best_constant_on_test": 0.1,
        "problems": 8,
        "uniform_guess": 0.1,
        "distinct_answers": 10,
        "train_problems": 20000,
    }
    by_seed = {str(k): v for k, v in WARM.items()}
    warm = {
        "test_by_seed": by_seed,
        "test_mean": statistics.fmean(WARM.values()),
        "test_by_prompt": [0.4] * 8,
        "chance_test": chance,
        "chance_validation": chance,
        "entropy_profile": profile,
        "by_setting": {
            s: {"test_by_seed": by_seed, "test_mean": statistics.fmean(WARM.values()), "chance": 0.1}
            for s in ("s1", "s2", "s3")
        },
    }
    (out / WARM_START).write_text(json.dumps(warm))
    write_report(cfg, out, results, command="epic-slime study --stress", study_s=1.0, commit="abc")
    summary = json.loads((out / "summary.json").read_text())["stress"]
    assert summary["runs_finished"] == 36 and summary["runs_planned"] == 36
    cell = summary["cells"]["s2"]
    assert cell["stress"]["lr"] == 4e-4 and cell["stress"]["update_depth"] == 8
    for key in (
        "n_seeds",
        "test_last_mean",
        "test_last_sd",
        "collapse_frac",
        "mean_abs_log_ratio",
        "prefix_log_ratio_p90",
        "breaks",
    ):
        assert key in cell["methods"]["grpo"], key
    assert summary["breaking_point"]["grpo"] == {"lr": "s2", "depth": "s2"}
    assert summary["breaking_point"]["dppo_tv"] == {"lr": None, "depth": None}
    assert summary["hypothesis"]["verdict"] == "rejected"
    md = (out / "study.md").read_text()
    assert "## The stress ladder" in md and "**Verdict: rejected.**" in md and "Finished: 36 of 36" in md
    assert "EPIC is not ranked first: dppo_tv is" in md
    assert (out / "stress.png").stat().st_size > 10_000


def test_stress_flag_conflicts_are_clear_errors(capsys):
    from epic_slime.cli import main as cli_main

    assert cli_main(["study", "--ladder", "--stress"]) == 2
    assert "--ladder and --stress exclude each other" in capsys.readouterr().err
    assert cli_main(["study", "--stress", "--config", str(STRESS_CONFIG)]) == 2
    assert "exclude each other" in capsys.readouterr().err


@pytest.mark.parametrize("collapsed, seeds, expected", [(1, 2, True), (2, 4, True), (1, 3, False), (0, 2, False)])
def test_a_cell_breaks_when_half_or_more_of_its_seeds_collapse(collapsed, seeds, expected):
    """BREAK_COLLAPSE_FRAC = 0.5 is inclusive: exactly half the seeds collapsing breaks the cell
    (its mean stays above the warm start here, so only the collapse rule can say so)."""
    cell = {"testable": True, "collapse_frac": collapsed / seeds, "warm_start_mean": 0.40, "test_last_mean": 0.45}
    assert stress.breaks(cell) is expected


def _hypothesis_cells(breaking: dict[str, tuple[bool, bool, bool]], gain: float = 0.1):
    """cells[setting] = grpo / gspo / epic breaks; EPIC's last scores sit ``gain`` (+- 0.01) above
    a warm start of 0.40 on 2 seeds."""
    cells = {
        s: {"grpo": {"breaks": g}, "gspo": {"breaks": p}, "epic": {"breaks": e}} for s, (g, p, e) in breaking.items()
    }
    warm = {s: {1: 0.40, 2: 0.40} for s in breaking}
    runs = {
        (s, "epic", seed): {"test_at_final": 0.40 + gain + (0.01 if seed == 1 else -0.01)}
        for s in breaking
        for seed in (1, 2)
    }
    return cells, runs, warm


def test_the_hypothesis_pools_cells_where_either_baseline_breaks():
    cells, runs, warm = _hypothesis_cells(
        {"s1": (True, False, False), "s2": (False, True, False), "s3": (False, False, False)}
    )
    h = stress.hypothesis_test(cells, runs, warm)
    assert h["cells"] == ["s1", "s2"] and h["pairs"] == 4


def test_the_hypothesis_is_not_supported_while_epic_breaks_somewhere():
    """EPIC above the warm start on the pooled pairs but breaking at 1 of 3 cells (under half: not
    rejected either): neither verdict."""
    cells, runs, warm = _hypothesis_cells(
        {"s1": (True, True, False), "s2": (True, False, False), "s3": (False, True, True)}
    )
    h = stress.hypothesis_test(cells, runs, warm)
    assert h["low"] > 0 and h["epic_breaks_at"] == ["s3"]
    assert h["verdict"] == "not rejected"
    cells["s3"]["epic"]["breaks"] = False
    assert stress.hypothesis_test(cells, runs, warm)["verdict"] == "supported"
