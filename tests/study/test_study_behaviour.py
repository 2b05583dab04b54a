"""Issue 47: the rollout (behaviour) reward beside each cell's scores, its clean reference and 75% gate, and
the calibration statistics of a mismatch level (gap, per-token KL), against independent float64 references."""

from __future__ import annotations

import json
import math
import random
import statistics

import pytest

from epic_slime.study.behaviour import clean_setting, rollout_reward_cells
from epic_slime.study.calibration import gate, interpolate_sigma, level_statistics
from epic_slime.study.plan import load_study_config

CONFIG = """
seeds: [1, 2]
methods: [epic, grpo]
settings:
  - {name: a_none}
  - {name: a_mis, rollout_router_noise: 0.3}
  - {name: a_tis, rollout_router_noise: 0.3, use_tis: true}
  - {name: b_none, task_min_operands: 6, task_max_operands: 6}
  - {name: b_mis, task_min_operands: 6, task_max_operands: 6, rollout_router_noise: 0.3}
  - {name: c_mis, task_min_operands: 7, task_max_operands: 7, rollout_router_noise: 0.3}
test_prompts: 8
train: {task_name: fib, task_min_operands: 4, task_max_operands: 4, num_rollout: 2}
"""


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(CONFIG)
    return load_study_config(path)


def test_the_clean_setting_is_the_one_without_mismatch_keys_and_otherwise_equal(cfg):
    assert clean_setting(cfg, "a_mis") == "a_none" and clean_setting(cfg, "a_tis") == "a_none"
    assert clean_setting(cfg, "b_mis") == "b_none"  # not a_none: another length
    assert clean_setting(cfg, "a_none") == "a_none"
    assert clean_setting(cfg, "c_mis") is None  # no clean cell at that length


def _rows(rewards):
    return [{"step": i + 1, "rollout/raw_reward": r} for i, r in enumerate(rewards)]


def test_rollout_reward_per_cell_first_mean_last_and_the_gate_at_its_boundary(cfg):
    rewards = {
        ("a_none", "epic", 1): [0.40, 0.5, 0.6],
        ("a_none", "grpo", 1): [0.40, 0.45, 0.5],
        ("a_none", "epic", 2): [0.60, 0.6, 0.7],
        ("a_none", "grpo", 2): [0.60, 0.5, 0.5],
        ("a_mis", "epic", 1): [0.30, 0.2, 0.1],  # 0.375 pooled = 75% of 0.5 exactly: passes
        ("a_mis", "epic", 2): [0.45, 0.2, 0.1],
        ("b_none", "epic", 1): [0.40],
        ("b_mis", "epic", 1): [0.2999],  # just under 75% of 0.40: fails
        ("c_mis", "epic", 1): [0.2],
    }
    metrics = {k: _rows(v) for k, v in rewards.items()}
    results = [
        {"setting": s, "method": m, "seed": sd, "test_at_final": 0.1 * sd + len(s) / 100} for (s, m, sd) in rewards
    ]
    warm = {"by_setting": {"a_none": {"test_by_seed": {"1": 0.3, "2": 0.32}}}}
    cells = rollout_reward_cells(cfg, metrics, results, warm)
    epic = cells["a_none"]["methods"]["epic"]
    assert epic["first"] == pytest.approx(0.5) and epic["last"] == pytest.approx(0.65)
    assert epic["mean"] == pytest.approx(
        statistics.fmean([statistics.fmean([0.4, 0.5, 0.6]), statistics.fmean([0.6, 0.6, 0.7])])
    )
    assert cells["a_none"]["first"] == pytest.approx(0.5)  # pooled over methods and seeds
    assert "passes_gate" not in cells["a_none"]  # a clean cell is the reference, not gated
    assert cells["a_mis"]["of_clean"] == pytest.approx(0.75) and cells["a_mis"]["passes_gate"]
    assert cells["b_mis"]["clean"] == "b_none" and not cells["b_mis"]["passes_gate"]
    assert "of_clean" not in cells["c_mis"]
    # gain over the warm start, paired by seed, with a t interval (df 1)
    diffs = [0.1 + 0.06 - 0.3, 0.2 + 0.06 - 0.32]
    gain = epic["gain"]
    half = 12.706204736174707 * statistics.stdev(diffs) / math.sqrt(2)
    assert gain["mean"] == pytest.approx(statistics.fmean(diffs)) and gain["n"] == 2
    assert (gain["low"], gain["high"]) == pytest.approx((gain["mean"] - half, gain["mean"] + half))
    assert "gain" not in cells["b_mis"]["methods"]["epic"]  # no warm-start score for that setting


def test_level_statistics_against_a_float64_reference():
    torch = pytest.importorskip("torch")
    rng = random.Random(0)
    b, t = 3, 7
    pi = [[rng.uniform(-4, 0) for _ in range(t)] for _ in range(b)]
    mu = [[p + rng.gauss(0, 0.3) for p in row] for row in pi]
    mask = [[1.0 if j < t - i else 0.0 for j in range(t)] for i in range(b)]
    got = level_statistics(torch.tensor(pi), torch.tensor(mu), torch.tensor(mask))
    cells = [(pi[i][j] - mu[i][j]) for i in range(b) for j in range(t) if mask[i][j]]
    n = len(cells)
    assert got["tokens"] == n
    assert got["gap_abs_mean"] == pytest.approx(sum(abs(d) for d in cells) / n, rel=1e-5)
    assert got["kl_k1"] == pytest.approx(-sum(cells) / n, rel=1e-4)
    assert got["kl_k3"] == pytest.approx(sum(math.expm1(d) - d for d in cells) / n, rel=1e-4)
    with pytest.raises(ValueError, match="no response tokens"):
        level_statistics(torch.tensor(pi), torch.tensor(mu), torch.zeros(b, t))


def test_gate_needs_one_clean_level_and_passes_exactly_at_the_threshold():
    levels = [
        {"sigma": 0.0, "rollout_reward": 0.4},
        {"sigma": 0.1, "rollout_reward": 0.3},
        {"sigma": 0.2, "rollout_reward": 0.29},
    ]
    got = gate(levels)
    assert [g["passes"] for g in got] == [True, True, False] and got[1]["gate_threshold"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="exactly one clean level"):
        gate(levels[1:])


def test_interpolate_sigma_is_log_linear_between_the_bracketing_levels():
    levels = [{"sigma": 0.1, "g": 0.001}, {"sigma": 0.2, "g": 0.01}, {"sigma": 0.3, "g": 0.1}]
    assert interpolate_sigma(levels, "g", 0.01) == pytest.approx(0.2)
    assert interpolate_sigma(levels, "g", 10**-2.5) == pytest.approx(0.15)
    assert interpolate_sigma(levels, "g", 0.5) is None


def test_sign_flip_p_is_exact_against_an_independent_enumeration():
    import itertools
    from fractions import Fraction

    from epic_slime.study.analysis import sign_flip_p

    def reference(diffs):
        exact = [Fraction(d) for d in diffs]
        observed = abs(sum(exact))
        patterns = list(itertools.product((1, -1), repeat=len(exact)))
        return Fraction(sum(abs(sum(s * d for s, d in zip(p, exact))) >= observed for p in patterns), len(patterns))

    rng = random.Random(3)
    for n in (1, 2, 5, 10):
        diffs = [rng.gauss(0.02, 0.05) for _ in range(n)]
        assert sign_flip_p(diffs) == pytest.approx(float(reference(diffs)))
    assert sign_flip_p([0.1] * 10) == 2 / 1024  # all one sign: the observed pattern and its mirror
    assert sign_flip_p([0.0, 0.0, 0.0]) == 1.0  # every pattern ties
    assert sign_flip_p([0.1, -0.1]) == 1.0  # mean 0 exactly
    # rounding ties count: 0.1 + 0.2 - 0.3 is not 0 in floats
    assert sign_flip_p([0.1, 0.2, -0.3]) == float(reference([Fraction(1, 10), Fraction(2, 10), Fraction(-3, 10)]))
    with pytest.raises(ValueError, match="1 to 20"):
        sign_flip_p([0.1] * 21)
    with pytest.raises(ValueError, match="finite"):
        sign_flip_p([0.1, float("nan")])


def test_the_contrast_reports_its_sign_flip_p():
    from epic_slime.study.analysis import sign_flip_p
    from epic_slime.study.contrast import contrast_for

    results = [
        {"setting": st, "method": m, "seed": s, "test_at_final": v}
        for st, m, vals in (
            ("t", "epic", [0.5, 0.6, 0.55, 0.4]),
            ("t", "grpo", [0.3, 0.45, 0.35, 0.45]),
            ("r", "epic", [0.7, 0.72, 0.69, 0.6]),
            ("r", "grpo", [0.68, 0.7, 0.71, 0.6]),
        )
        for s, v in enumerate(vals, start=1)
    ]
    c = contrast_for(results, "epic", "grpo", "t", "r")
    assert c["sign_flip_p"] == sign_flip_p(c["per_seed"]) and c["n"] == 4


def _level(sigma, gap, kl, reward):
    return {"sigma": sigma, "gap_abs_mean": gap, "kl_k3": kl, "kl_k1": kl, "rollout_reward": reward, "responses": 8}


def test_choose_levels_matches_each_target_in_log_scale_and_stops_at_the_first_failure(tmp_path):
    from epic_slime.study.calibration import choose_levels, write_report

    levels = [
        _level(0.0, 0.0, 0.0, 0.40),
        _level(0.1, 0.0006, 1e-4, 0.41),
        _level(0.15, 0.001, 3e-4, 0.40),
        _level(0.2, 0.003, 1e-3, 0.31),
        _level(0.25, 0.006, 2.5e-3, 0.29),  # 72.5% of clean: fails
        _level(0.3, 0.01, 6e-3, 0.30),  # passes again by noise: not the strongest
    ]
    got = {c["level"]: c for c in choose_levels(levels)}
    assert got["engine"]["sigma"] == 0.15 and got["engine"]["matched_on"] == "gap_abs_mean"
    # 2e-4 is nearer 3e-4 than 1e-4 in log scale (1.5x against 2x)
    assert got["r3_low"]["sigma"] == 0.15 and got["r3_high"]["sigma"] == 0.15
    # 1.5e-3: 1e-3 (1.5x) and 2.5e-3 (1.67x): the nearer one
    assert got["no_r3"]["sigma"] == 0.2 and got["no_r3"]["passes"]
    assert got["strongest"]["sigma"] == 0.2
    levels[3]["rollout_reward"] = 0.299  # below 0.30: the strongest drops to 0.15, no_r3 is not run
    got = {c["level"]: c for c in choose_levels(levels)}
    assert got["strongest"]["sigma"] == 0.15 and not got["no_r3"]["passes"]
    (tmp_path / "calibration_603.jsonl").write_text("\n".join(json.dumps({"setting": "x", **lv}) for lv in levels))
    text = write_report(tmp_path).read_text()
    assert "| 0.25 | 6.00e-03 | 2.50e-03 | 2.50e-03 | 0.290 | 72% | **fails** | 8 |" in text
    assert "| no_r3 | kl_k3 | 0.0015 | 0.2 | 0.001 | 0.299 | **fails** (not run) |" in text
