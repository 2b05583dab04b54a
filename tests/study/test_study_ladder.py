"""The lag ladder's pure parts: the warm start's slips, token roles, chance, collapse, power, cells."""

import math
import random
import re
import statistics

import numpy as np
import pytest

from epic_slime.runtime.task import Tokenizer
from epic_slime.runtime.task_chain import make_chain_problem
from epic_slime.runtime.warmstart import slipped_solution, warm_start_key
from epic_slime.study import analysis, ladder
from epic_slime.study.entropy import step_token_kinds
from epic_slime.study.plan import load_study_config
from epic_slime.study.run import chance_level


def test_slipped_solution_slips_results_only_and_carries_them_on():
    p = make_chain_problem([3, 5, 2, 7, 9, 4, 1, 6, 8], list("+-+-++-+"))
    assert slipped_solution(p, random.Random(0), 0.0, 10) == p.solution
    rng, slips, steps = random.Random(1), 0, 0
    for _ in range(400):
        text = slipped_solution(p, rng, 0.1, 10)
        parsed = re.findall(r"(\d)([+-])(\d)=(\d);", text)
        assert [(op, int(b)) for _, op, b, _ in parsed] == [
            (op, int(b)) for _, op, b, _ in re.findall(r"(\d)([+-])(\d)=(\d);", p.solution)
        ]
        acc = 3
        for a, op, b, c in parsed:
            assert int(a) == acc  # the previous (maybe wrong) result, carried
            right = (acc + int(b) if op == "+" else acc - int(b)) % 10
            slips += int(c) != right
            steps += 1
            acc = int(c)
        assert text.endswith(f"Answer:{acc}")
    assert abs(slips / steps - 0.1) < 0.02  # 3200 steps: sd of the rate 0.005


def test_step_noise_changes_the_cache_key_only_when_used():
    from epic_slime.runtime.model import ModelConfig
    from epic_slime.runtime.task import TaskConfig

    m, t = ModelConfig(), TaskConfig()
    assert warm_start_key(m, t, 10, 1e-3, 8, 0, 0.0) == warm_start_key(m, t, 10, 1e-3, 8, 0, 0.0, 0.0)
    assert warm_start_key(m, t, 10, 1e-3, 8, 0, 0.0) != warm_start_key(m, t, 10, 1e-3, 8, 0, 0.0, 0.1)


def test_step_token_kinds_name_prompt_copies_carries_and_results():
    tok = Tokenizer()
    r = tok.encode("3+5=8;8-2=6;Answer:6") + [tok.eos_id]
    kinds = step_token_kinds([r], tok)[0]
    assert kinds == [
        "copy:a0",
        "copy:op0",
        "copy:b0",
        "format",
        "result:0",
        "format",
        "carry:a1",
        "copy:op1",
        "copy:b1",
        "format",
        "result:1",
        "format",
        "format",
        "format",
        "format",
    ]
    broken = step_token_kinds([tok.encode("3+5=8;8=2")], tok)[0]
    assert broken[:7] == ["copy:a0", "copy:op0", "copy:b0", "format", "result:0", "format", "carry:a1"]
    assert broken[7:] == ["format", "format"]  # out of format from the misplaced '='


def test_chance_level_is_the_training_distributions_best_constant_answer():
    class P:
        def __init__(self, answer):
            self.answer = answer

    train = [P(a) for a in [3, 3, 3, 1, 2, 7, 7, 0]]
    test = [P(a) for a in [7, 7, 7, 3]]  # the test split's own mode (7) is not what is guessed
    got = chance_level(train, test)
    assert got["chance"] == 3 / 8 and got["best_constant_answer"] == 3 and got["best_constant_on_test"] == 1 / 4
    assert got["distinct_answers"] == 5 and got["uniform_guess"] == pytest.approx(0.2)


def test_the_chain_tasks_chance_is_one_in_ten():
    from epic_slime.runtime.task import TaskConfig
    from epic_slime.runtime.tasks import train_problem

    cfg = TaskConfig(name="chain", min_operands=9, max_operands=9)
    got = chance_level([train_problem(i, 0, cfg) for i in range(20_000)], [train_problem(-1, 0, cfg)])
    # the answer of a chain of uniform digits modulo 10 is uniform: chance 0.1 (sampling sd 0.002)
    assert got["distinct_answers"] == 10 and 0.1 <= got["chance"] < 0.11


@pytest.mark.parametrize(
    "curve, expect",
    [
        ([(0, 0.40), (5, 0.30), (10, 0.20), (15, 0.10)], True),  # falls and stays below
        ([(0, 0.40), (5, 0.20), (10, 0.10), (15, 0.39)], False),  # recovers by the end
        ([(0, 0.40), (5, 0.36), (10, 0.37)], False),  # below, but within the margin
        ([(0, 0.40), (5, 0.10)], False),  # one evaluation cannot "stay"
    ],
)
def test_collapse_definition(curve, expect):
    assert ladder.collapsed(curve, curve[0][1]) is expect


def test_power_matches_a_simulated_paired_t_test():
    from scipy import stats

    sd, n = 0.04, 3
    mdd = analysis.minimum_detectable_difference(sd, n)
    rng = np.random.default_rng(0)
    diffs = rng.normal(mdd, sd, size=(40_000, n))
    t = diffs.mean(1) / (diffs.std(1, ddof=1) / math.sqrt(n))
    simulated = float(np.mean(np.abs(t) > stats.t.ppf(0.975, n - 1)))
    assert simulated == pytest.approx(0.80, abs=0.01)
    assert analysis.paired_t_power(0.0, sd, n) == pytest.approx(0.05, abs=1e-9)
    need = analysis.pairs_needed(0.05, sd)
    assert analysis.paired_t_power(0.05, sd, need) >= 0.8 > analysis.paired_t_power(0.05, sd, need - 1)


def _result(setting, method, seed, last, sel, curve):
    return {
        "setting": setting,
        "method": method,
        "seed": seed,
        "k": 8,
        "test_at_final": last,
        "test_at_selected": sel,
        "validation_curve": curve,
        "selected_version": 0,
    }


def _rows(staleness=0):
    return [
        {
            "step": i,
            "train/policy/clipfrac": 0.1,
            "train/policy/abs_L_mean": 0.5,
            "train/entropy": 0.4,
            "rollout/staleness/max": staleness,
            "rollout/staleness/mean": staleness / 2,
        }
        for i in range(1, 9)
    ]


def test_ladder_cells_pair_seeds_with_epic_and_the_warm_start(tmp_path):
    cfg_path = tmp_path / "ladder.yaml"
    cfg_path.write_text("""
seeds: [1, 2, 3]
methods: [epic, grpo]
ladder: true
settings:
  - {name: d8, update_depth: 8, rollout_mode: sync, max_staleness: 0}
  - {name: d32, update_depth: 32, rollout_mode: sync, max_staleness: 0}
  - {name: d8_k4, update_depth: 8, rollout_mode: async, max_staleness: 4}
test_prompts: 8
train: {lr: 1.0e-4}
""")
    cfg = load_study_config(cfg_path)
    assert cfg.ladder
    assert [(x["D"], x["K"]) for x in ladder.axes(cfg)["D"]] == [(8, 0), (32, 0)]
    assert [(x["D"], x["K"]) for x in ladder.axes(cfg)["K"]] == [(8, 0), (8, 4)]
    warm = {"test_by_seed": {"1": 0.40, "2": 0.42, "3": 0.38}}
    up = [(0, 0.4), (5, 0.45), (10, 0.5)]
    down = [(0, 0.4), (5, 0.2), (10, 0.1)]
    results, metrics = [], {}
    for setting in ("d8", "d32", "d8_k4"):
        for seed, (e, g) in zip((1, 2, 3), ((0.50, 0.45), (0.55, 0.47), (0.49, 0.46))):
            results.append(_result(setting, "epic", seed, e, e, up))
            grpo_last = 0.05 if setting == "d32" else g
            results.append(_result(setting, "grpo", seed, grpo_last, g, down if setting == "d32" else up))
            for m in ("epic", "grpo"):
                metrics[(setting, m, seed)] = _rows(4 if setting == "d8_k4" else 0)
    summary = ladder.ladder_summary(cfg, results, metrics, warm)
    epic8 = summary["cells"]["d8"]["methods"]["epic"]
    assert epic8["test_last_mean"] == pytest.approx(statistics.fmean([0.50, 0.55, 0.49]))
    assert epic8["test_last_sd"] == pytest.approx(statistics.stdev([0.50, 0.55, 0.49]))
    gain = epic8["gain_last_over_warm_start"]
    assert gain["mean"] == pytest.approx(statistics.fmean([0.10, 0.13, 0.11])) and gain["low"] > 0
    g32 = summary["cells"]["d32"]["methods"]["grpo"]
    assert g32["collapse_frac"] == 1.0 and summary["cells"]["d8"]["methods"]["grpo"]["collapse_frac"] == 0.0
    assert g32["diff_last_vs_epic"]["mean"] == pytest.approx(statistics.fmean([0.05 - 0.50, 0.05 - 0.55, 0.05 - 0.49]))
    assert summary["cells"]["d8_k4"]["methods"]["epic"]["staleness_max"] == 4
    assert "diff_last_vs_epic" not in epic8
    p = summary["power"]
    assert p["n_seeds"] == 3 and p["minimum_detectable_difference"] > 0
    table = ladder.ladder_markdown(summary, cfg.methods, 8)
    cells = [len(re.findall(r"(?<!\\)\|", row)) for row in table]  # column separators, not escaped pipes
    assert len(table) == 2 + 6 and len(set(cells)) == 1
    pivot = ladder.ladder_pivot_markdown(summary, cfg.methods, 8)
    assert pivot[0] == "| method | D = 8, K = 0 | D = 32, K = 0 | D = 8, K = 4 |"
    assert pivot[3].startswith("| grpo | 0.460 ± 0.010 |") and "0.050 ± 0.000 * (collapse 1.00)" in pivot[3]
    text = " ".join(ladder.ladder_findings(summary, cfg.methods, warm))
    assert "D = 32, K = 0" in text and "below grpo" in text and "Collapse rate > 0: grpo 1.00" in text
