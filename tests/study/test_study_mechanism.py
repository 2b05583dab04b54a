"""The mechanism study's design files: the config loads, every planned run's train settings are valid and
record the paper's optimizer, the stages are exact cuts of the config, and the contrast is checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from epic_slime.runtime.config import parse_config
from epic_slime.study.plan import REPO, StudyConfigError, load_study_config, plan, run_argv

MECHANISM = REPO / "configs" / "study" / "mechanism.yaml"
LAG = REPO / "configs" / "study" / "mechanism_lag.yaml"
STAGES = REPO / "docs" / "study" / "mechanism" / "stages"


@pytest.mark.parametrize("path", [MECHANISM, LAG])
def test_every_planned_run_parses_with_the_papers_optimizer(path, tmp_path):
    cfg = load_study_config(path)
    seen = set()
    for spec in plan(cfg):
        if spec.setting in seen:
            continue
        seen.add(spec.setting)
        run = parse_config(run_argv(cfg, spec, tmp_path / spec.name, tmp_path / "ws"))
        assert (run.lr_warmup_steps, run.kl_loss_type, run.adam_beta2, run.weight_decay) == (
            10,
            "low_var_kl",
            0.98,
            0.1,
        )
        assert run.task_name == "fib" and run.samples_per_step // run.update_depth == 16  # 16 per Adam step
    assert len(seen) == len(cfg.settings)


def test_the_factorial_core_and_its_contrast():
    cfg = load_study_config(MECHANISM)
    assert cfg.seeds == [1, 2, 3] and cfg.methods == ["epic", "grpo", "gspo", "ctpo"]
    assert cfg.contrast == {
        "method": "epic",
        "baselines": ["grpo", "gspo", "ctpo"],
        "target": "long_mis",
        "reference": "short_none",
    }
    steps = {s["name"]: s.get("task_max_operands", cfg.train["task_max_operands"]) for s in cfg.settings}
    assert steps["short_none"] == 8 and steps["long_mis"] == 100  # 51 and 603 tokens
    noise = {s["name"]: s.get("rollout_router_noise", 0.0) for s in cfg.settings}
    assert noise["short_none"] == noise["long_none"] == 0 < noise["short_mis"] and noise["long_mis"] > 0


def test_stages_are_exact_cuts_of_the_config_and_cover_it():
    """Stages 1-4 (and 2a) cut configs/study/mechanism.yaml and cover it; stages 5-7 cut configs/study/mechanism_lag.yaml
    (the same runs in another order: same base, seeds and settings, methods a subset, in the same directory)."""
    full = yaml.safe_load(MECHANISM.read_text())
    lag = yaml.safe_load((MECHANISM.parent / "mechanism_lag.yaml").read_text())
    by_name = {s["name"]: s for s in full["settings"]}
    lag_by_name = {s["name"]: s for s in lag["settings"]}
    covered = []
    for stage in sorted(STAGES.glob("*.yaml")):
        cut = yaml.safe_load(stage.read_text())
        if stage.name[0] in "567":
            assert cut["train"] == lag["train"] and cut["seeds"] == lag["seeds"], stage
            assert set(cut["methods"]) <= set(lag["methods"]), stage
            assert all(lag_by_name[s["name"]] == s for s in cut["settings"]), stage
            load_study_config(stage)
            continue
        assert cut["train"] == full["train"] and cut["seeds"] == full["seeds"], stage
        assert set(cut["methods"]) <= set(full["methods"]), stage  # 2a: the primary contrast's two methods first
        assert all(by_name[s["name"]] == s for s in cut["settings"]), stage
        covered += [s["name"] for s in cut["settings"]]
        load_study_config(stage)
    assert set(covered) == set(by_name)
    core = [
        s["name"]
        for f in ("1_core_short.yaml", "2_core_long.yaml")
        for s in yaml.safe_load((STAGES / f).read_text())["settings"]
    ]
    assert core == ["short_none", "short_mis", "long_none", "long_mis"]


def test_contrast_errors_name_the_field(tmp_path):
    data = yaml.safe_load(MECHANISM.read_text())
    for bad, match in [
        ({"method": "epic", "baselines": ["grpo"], "target": "nowhere", "reference": "short_none"}, "contrast.target"),
        (
            {"method": "epic", "baselines": ["epic"], "target": "long_mis", "reference": "short_none"},
            "contrast.method and contrast.baselines",
        ),
        ({"method": "epic"}, "contrast must be a mapping"),
    ]:
        path = Path(tmp_path) / "c.yaml"
        path.write_text(yaml.safe_dump({**data, "contrast": bad}))
        with pytest.raises(StudyConfigError, match=match):
            load_study_config(path)


def test_contrast_is_the_per_seed_difference_in_differences():
    from epic_slime.study.contrast import contrast_for, gap_by_setting

    scores = {
        ("long_mis", "epic"): [0.50, 0.60, 0.55],
        ("long_mis", "grpo"): [0.30, 0.45, 0.35],
        ("short_none", "epic"): [0.70, 0.72, 0.69],
        ("short_none", "grpo"): [0.68, 0.70, 0.71],
    }
    results = [
        {"setting": st, "method": m, "seed": s + 1, "test_at_final": v}
        for (st, m), vals in scores.items()
        for s, v in enumerate(vals)
    ]
    c = contrast_for(results, "epic", "grpo", "long_mis", "short_none")
    per_seed = [(0.50 - 0.30) - (0.70 - 0.68), (0.60 - 0.45) - (0.72 - 0.70), (0.55 - 0.35) - (0.69 - 0.71)]
    assert c["per_seed"] == pytest.approx(per_seed) and c["mean"] == pytest.approx(sum(per_seed) / 3)
    import statistics
    from scipy import stats

    half = stats.t.ppf(0.975, 2) * statistics.stdev(per_seed) / 3**0.5
    assert (c["low"], c["high"]) == pytest.approx((c["mean"] - half, c["mean"] + half))
    assert c["verdict"].startswith("supported") and c["n"] == 3
    # a seed missing one of its four runs drops out; none left: pending
    assert contrast_for(results[:-1], "epic", "grpo", "long_mis", "short_none")["n"] == 2
    assert contrast_for([], "epic", "grpo", "long_mis", "short_none")["verdict"].startswith("pending")
    gaps = gap_by_setting(
        {("a", "epic", 1): [{"train/logprob_abs_diff_step_start": 0.01}, {"train/logprob_abs_diff_step_start": 0.03}]}
    )
    assert gaps["a"] == {"mean": pytest.approx(0.02), "first_step": 0.01, "max": 0.03, "runs": 1}


def test_the_gate_passes_a_warm_start_above_chance_by_the_margin_only():
    from epic_slime.study.gate import decide

    assert decide({"test_mean": 0.16, "chance": 0.10}) and not decide({"test_mean": 0.15, "chance": 0.10})
    assert not decide({"test_mean": 0.078, "chance": 0.10})


def test_the_on_policy_control_matches_the_stress_cell_but_for_depth_and_batch(tmp_path):
    stress = load_study_config(REPO / "configs" / "study" / "stress.yaml")
    control = load_study_config(REPO / "configs" / "study" / "stress_onpolicy.yaml")
    lr8 = parse_config(run_argv(stress, next(s for s in plan(stress) if s.setting == "lr8"), tmp_path / "a", tmp_path))
    onp = parse_config(
        run_argv(control, next(s for s in plan(control) if s.setting == "onp_lr8"), tmp_path / "b", tmp_path)
    )
    same = (
        "lr",
        "task_name",
        "task_max_operands",
        "kl_loss_coef",
        "kl_loss_type",
        "adam_beta2",
        "lr_warmup_steps",
        "weight_decay",
        "warm_start_steps",
        "warm_start_step_noise",
        "warm_start_seed",
        "n_samples_per_prompt",
    )
    assert all(getattr(lr8, k) == getattr(onp, k) for k in same)
    adam_steps = lambda c: c.num_rollout * c.update_depth  # noqa: E731
    per_step = lambda c: c.samples_per_step // c.update_depth  # noqa: E731
    assert adam_steps(lr8) == adam_steps(onp) == 80 and per_step(lr8) == per_step(onp) == 16
    assert onp.update_depth == 1 and onp.max_staleness == 0 and onp.rollout_mode == "sync"


STUDY_CONFIGS = sorted((REPO / "configs" / "study").glob("*.yaml")) + sorted(STAGES.glob("*.yaml"))


@pytest.mark.parametrize("path", STUDY_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_study_config_loads_and_each_setting_parses(path, tmp_path):
    """The queue runs these unattended: one that the study refuses (stress_anchor.yaml did, a stress axis
    of one level) is a stage silently skipped, found a session later."""
    cfg = load_study_config(path)
    specs = plan(cfg)
    assert specs
    for spec in {s.setting: s for s in specs}.values():
        parse_config(run_argv(cfg, spec, tmp_path / spec.name, tmp_path / "ws"))


def test_the_anchor_reruns_the_ladders_lr1_cell_under_the_papers_optimizer(tmp_path):
    cfg = load_study_config(REPO / "configs" / "study" / "stress_anchor.yaml")
    ladder = load_study_config(REPO / "configs" / "study" / "stress.yaml")
    assert cfg.seeds == [1, 2, 3] and cfg.methods == ladder.methods and len(plan(cfg)) == 24
    spec = plan(cfg)[0]
    run = parse_config(run_argv(cfg, spec, tmp_path / "r", tmp_path / "ws"))
    assert (run.lr_warmup_steps, run.kl_loss_type, run.adam_beta2, run.weight_decay) == (10, "low_var_kl", 0.98, 0.1)
    assert (run.lr, run.update_depth, run.task_name) == (1.0e-4, 8, "chain")


def test_a_setting_whose_warm_start_recipe_changed_is_measured_again(tmp_path):
    """warm_start.json keeps each setting's warm-start score; the long settings' recipe was revised after
    their first warm start was measured, and the gate must not read the old policy's score (it did: it
    skipped any setting with an entry for every seed)."""
    from epic_slime.study.run import _identity_of, is_current

    cfg = load_study_config(STAGES / "2_core_long.yaml")
    key = lambda c, seed: _identity_of(c, tmp_path, "long_none", seed)[1]  # noqa: E731
    record = {
        "test_by_seed": {"1": 0.4, "2": 0.4, "3": 0.4},
        "warm_start_scores": {key(cfg, s): v for s, v in ((1, 0.21), (2, 0.22), (3, 0.23))},
        "by_setting": {"long_none": {"test_by_seed": {"1": 0.21, "2": 0.22, "3": 0.23}, "test_mean": 0.22}},
    }
    assert is_current(cfg, tmp_path, record, "long_none")
    assert not is_current(cfg, tmp_path, record, "long_mis")  # no entry yet
    old = yaml.safe_load((STAGES / "2_core_long.yaml").read_text())
    for s in old["settings"]:  # the first recipe: 1,600 steps from a fresh model
        s.update(warm_start_steps=1600, warm_start_lr=3e-3)
        s.pop("warm_start_init")
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    assert not is_current(load_study_config(tmp_path / "old.yaml"), tmp_path, record, "long_none")
    record["by_setting"]["long_none"]["test_by_seed"]["3"] = 0.5  # a score of another policy
    assert not is_current(cfg, tmp_path, record, "long_none")
    del record["by_setting"]["long_none"]["test_by_seed"]["3"]  # a seed missing
    assert not is_current(cfg, tmp_path, record, "long_none")


def test_another_init_file_at_the_same_path_is_another_warm_start(tmp_path):
    """warm_start_init is named by its content, not only its path: a file rewritten in place (another
    curriculum's weights) makes the recorded scores stale, as the training cache's key already does."""
    import os
    import shutil

    from epic_slime.study.run import _identity_of, is_current

    stage = yaml.safe_load((STAGES / "2_core_long.yaml").read_text())
    init = tmp_path / "init.pt"
    shutil.copyfile(REPO / stage["settings"][0]["warm_start_init"], init)
    for s in stage["settings"]:
        s["warm_start_init"] = str(init)
    (tmp_path / "stage.yaml").write_text(yaml.safe_dump(stage))
    cfg = load_study_config(tmp_path / "stage.yaml")
    keys = {s: _identity_of(cfg, tmp_path, "long_none", s)[1] for s in (1, 2, 3)}
    assert all(str(init) in k for k in keys.values())
    record = {
        "test_by_seed": {"1": 0.4, "2": 0.4, "3": 0.4},
        "warm_start_scores": {k: 0.3 for k in keys.values()},
        "by_setting": {"long_none": {"test_by_seed": {"1": 0.3, "2": 0.3, "3": 0.3}, "test_mean": 0.3}},
    }
    assert is_current(cfg, tmp_path, record, "long_none")
    stat = init.stat()
    os.utime(init, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched, same bytes
    assert is_current(cfg, tmp_path, record, "long_none")
    init.write_bytes(init.read_bytes()[:-1] + bytes([init.read_bytes()[-1] ^ 1]))  # same path and size
    assert not is_current(cfg, tmp_path, record, "long_none")


def test_the_contrast_across_two_study_directories_pairs_seeds_by_setting(tmp_path, capsys):
    """The 1,803-token extension's target cell lives in its own directory; its contrast against the main
    study's reference cell is computed from both directories' result.json files."""
    import json

    from epic_slime.study.contrast import main

    scores = {
        ("x", "epic", 1): 0.5,
        ("x", "grpo", 1): 0.3,
        ("x", "epic", 2): 0.6,
        ("x", "grpo", 2): 0.3,
        ("s", "epic", 1): 0.5,
        ("s", "grpo", 1): 0.5,
        ("s", "epic", 2): 0.4,
        ("s", "grpo", 2): 0.5,
        ("s", "epic", 3): 0.9,
        ("s", "grpo", 3): 0.1,
    }  # seed 3 has no target pair
    for (setting, method, seed), v in scores.items():
        d = tmp_path / ("ext" if setting == "x" else "main") / "runs" / setting / f"{method}_s{seed}"
        d.mkdir(parents=True)
        (d / "result.json").write_text(
            json.dumps({"setting": setting, "method": method, "seed": seed, "test_at_final": v})
        )
    main(["--target", str(tmp_path / "ext"), "x", "--reference", str(tmp_path / "main"), "s"])
    out = json.loads(capsys.readouterr().out)
    # per seed: (0.2 - 0.0, 0.3 - (-0.1)) = (0.2, 0.4)
    assert out["seeds"] == [1, 2] and out["per_seed"] == pytest.approx([0.2, 0.4]) and out["mean"] == pytest.approx(0.3)
    with pytest.raises(SystemExit):
        main(["--target", str(tmp_path / "ext"), "s", "--reference", str(tmp_path / "main"), "s"])


def test_a_contrast_interval_of_exactly_zero_is_not_resolved():
    """Boundary of the verdict: the same per-seed difference in both settings on every seed (c_s = 0
    exactly, sd 0: the interval is [0, 0]) supports nothing; a positive lower bound is needed."""
    from epic_slime.study.contrast import contrast_for

    results = [
        {"setting": st, "method": m, "seed": s, "test_at_final": v}
        for st in ("long_mis", "short_none")
        for m, v in (("epic", 0.5), ("grpo", 0.25))
        for s in (1, 2, 3)
    ]
    c = contrast_for(results, "epic", "grpo", "long_mis", "short_none")
    assert (c["mean"], c["low"], c["high"]) == (0.0, 0.0, 0.0)
    assert c["verdict"] == "not resolved (interval spans 0)"


def test_a_contrast_over_two_seeds_has_its_interval_and_verdict():
    """Two seeds with all four runs are enough for an interval (df 1): not 'pending'."""
    from epic_slime.study.contrast import contrast_for

    results = [
        {"setting": st, "method": m, "seed": s, "test_at_final": v + (0.01 * s if st == "long_mis" else 0)}
        for st in ("long_mis", "short_none")
        for m, v in (("epic", 0.5), ("grpo", 0.25))
        for s in (1, 2)
    ]
    c = contrast_for(results, "epic", "grpo", "long_mis", "short_none")
    assert c["n"] == 2 and "sd" in c and not c["verdict"].startswith("pending")


_GATE_STUDY = """
seeds: [1, 2]
methods: [epic]
settings:
  - {name: a}
test_prompts: 8
train: {task_name: fib, task_min_operands: 4, task_max_operands: 4, num_rollout: 2}
"""


@pytest.mark.parametrize("test_mean, code", [(0.05, 3), (0.5, 0)], ids=["at_chance", "testable"])
def test_the_gate_command_exits_by_the_verdict_and_measures_missing_seeds(tmp_path, monkeypatch, test_mean, code):
    """`python -m epic_slime.study.gate`: exit 3 for a warm start within the margin of chance, 0 above it;
    a warm_start.json lacking one of the config's seeds is measured again before the verdict."""
    from epic_slime.study import files, gate, run

    config = tmp_path / "study.yaml"
    config.write_text(_GATE_STUDY)
    measured = []

    def measure(cfg, out, previous=None):
        measured.append(sorted(previous["test_by_seed"]))
        return {"test_by_seed": {"1": 0.3, "2": 0.3}, "by_setting": {}}

    def by_setting(cfg, out, record, settings, train):
        for s in settings:
            record["by_setting"][s] = {"test_mean": test_mean, "chance": 0.1, "test_by_seed": {"1": test_mean}}

    monkeypatch.setattr(files, "read_warm_start", lambda out: {"test_by_seed": {"1": 0.3}, "by_setting": {}})
    monkeypatch.setattr(run, "measure_warm_start", measure)
    monkeypatch.setattr(run, "warm_starts_by_setting", by_setting)
    argv = ["--config", str(config), "--output-dir", str(tmp_path / "out"), "--setting", "a"]
    assert gate.main(argv) == code
    assert measured == [["1"]]  # seed 2 was missing: measured again
    assert gate.main([*argv[:-1], "nope"]) == 2
