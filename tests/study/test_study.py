"""The study: its task, the runtime hooks it uses (task choice, entropy), and its pure analysis."""

import math
import random
import re
import statistics

import pytest
import torch

from epic_slime.runtime.config import ConfigError, parse_config
from epic_slime.runtime.task import TaskConfig, Tokenizer, answer_reward
from epic_slime.runtime.task_chain import make_chain_problem, split_of, split_problems, train_problem
from epic_slime.runtime.tasks import eval_problems
from epic_slime.runtime.tasks import train_problem as runtime_train_problem
from epic_slime.runtime.trainer import mean_token_entropy
from epic_slime.study import analysis
from epic_slime.study.entropy import position_entropy

CHAIN = TaskConfig(min_operands=12, max_operands=13, eval_num_prompts=32, name="chain")


def _mod10_reference(prompt: str) -> tuple[int, list[tuple[int, str, int, int]]]:
    """Independent evaluation of a chain prompt: digits and operators read off the text."""
    digits = [int(c) for c in prompt if c.isdigit()]
    ops = [c for c in prompt if c in "+-"]
    acc, steps = digits[0], []
    for op, b in zip(ops, digits[1:]):
        new = (acc + b if op == "+" else acc - b) % 10
        steps.append((acc, op, b, new))
        acc = new
    return acc, steps


def test_chain_problems_are_exact_and_long():
    tok = Tokenizer()
    lengths = []
    for i in range(400):
        p = train_problem(i, seed=5, cfg=CHAIN)
        answer, steps = _mod10_reference(p.prompt)
        assert p.answer == answer
        got = [(int(a), op, int(b), int(c)) for a, op, b, c in re.findall(r"(\d)([+-])(\d)=(\d);", p.solution)]
        assert got == steps and 12 <= len(steps) + 1 <= 13
        ids = tok.encode(p.solution) + [tok.eos_id]
        assert answer_reward(ids, p.answer, tok) == 1.0
        assert answer_reward(ids[:-3] + [tok.eos_id], p.answer, tok) == 0.0
        lengths.append(len(ids))
    assert statistics.fmean(lengths) >= 64  # the "at least 64 generated tokens"
    with pytest.raises(ValueError, match="operands must be digits"):
        make_chain_problem([3, 12], ["+"])


def test_chain_splits_are_disjoint_fixed_and_the_runtime_uses_them():
    val, test = split_problems("validation", CHAIN), split_problems("test", CHAIN)
    assert len(val) == len({p.prompt for p in val}) == 32
    assert all(split_of(p.prompt) == "validation" for p in val)
    assert all(split_of(p.prompt) == "test" for p in test)
    assert not {p.prompt for p in val} & {p.prompt for p in test}
    train = {train_problem(i, s, CHAIN).prompt for s in (1, 2) for i in range(2000)}
    assert not train & ({p.prompt for p in val} | {p.prompt for p in test})
    # the runtime's held-out split is the validation split, its train stream the chain stream
    assert eval_problems(CHAIN) == val
    assert runtime_train_problem(7, 3, CHAIN) == train_problem(7, 3, CHAIN)
    assert split_problems("test", CHAIN) == test  # seed-independent, fixed
    with pytest.raises(ValueError, match="split must be"):
        split_problems("train", CHAIN)


def test_chain_task_config_fields_and_errors():
    cfg = parse_config(
        [
            "--task-name",
            "chain",
            "--task-min-operands",
            "12",
            "--task-max-operands",
            "13",
            "--model-max-positions",
            "144",
            "--rollout-max-response-len",
            "96",
            "--warm-start-seed",
            "0",
        ]
    )
    assert cfg.task.name == "chain" and cfg.model.max_positions == 144 and cfg.warm_start_seed_or_seed == 0
    assert parse_config(["--seed", "4"]).warm_start_seed_or_seed == 4
    with pytest.raises(ConfigError, match="model_max_positions"):
        parse_config(
            [
                "--task-name",
                "chain",
                "--task-min-operands",
                "12",
                "--task-max-operands",
                "13",
                "--rollout-max-response-len",
                "96",
            ]
        )
    with pytest.raises(ConfigError, match="<= 6"):
        parse_config(["--task-max-operands", "8"])  # the default task keeps its limit
    with pytest.raises(SystemExit):
        parse_config(["--task-name", "poetry"])


def test_mean_token_entropy_matches_float64_reference():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 19, generator=g) * 3
    logits[0, 0, 4] = -float("inf")  # a zero-probability token contributes 0
    lp = torch.log_softmax(logits, -1)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    ref, n = 0.0, 0
    for b in range(3):
        for t in range(5):
            if mask[b, t]:
                p = torch.softmax(logits[b, t].double(), -1)
                ref += float(-sum(pi * math.log(pi) for pi in p.tolist() if pi > 0))
                n += 1
    assert float(mean_token_entropy(lp, mask)) == pytest.approx(ref / n, rel=1e-5)


def test_position_entropy_bins_like_the_loss_core():
    entropy = torch.arange(1.0, 21.0).reshape(2, 10)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 5:] = False  # a 5-token response: tokens at bins 0, 2, 4, 6, 8
    bins = position_entropy(entropy, mask)
    expect = [
        statistics.fmean([entropy[0, b].item()] + ([entropy[1, b // 2].item()] if b % 2 == 0 else []))
        for b in range(10)
    ]
    assert bins == pytest.approx(expect)


@pytest.mark.parametrize("df", [1, 2, 3, 5, 9, 29])
def test_t_quantiles_against_mpmath(df):
    mpmath = pytest.importorskip("mpmath")
    q = analysis.t_quantile_975(df)
    # Student-t CDF: 1 - I_{df/(df+t^2)}(df/2, 1/2) / 2
    cdf = 1 - mpmath.betainc(df / 2, 0.5, 0, df / (df + q * q), regularized=True) / 2
    assert float(cdf) == pytest.approx(0.975, abs=2e-6)


def test_paired_difference_against_a_direct_computation():
    method = {1: 0.30, 2: 0.42, 3: 0.35, 4: 0.50}
    base = {1: 0.25, 2: 0.40, 3: 0.37, 4: 0.41, 9: 0.9}  # seed 9 has no partner: ignored
    d = [0.05, 0.02, -0.02, 0.09]
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    half = 3.18245 * sd / 2
    out = analysis.paired_difference(method, base)
    assert out["n"] == 4 and out["seeds"] == [1, 2, 3, 4]
    assert out["mean"] == pytest.approx(mean) and out["low"] == pytest.approx(mean - half, rel=1e-4)
    assert out["high"] == pytest.approx(mean + half, rel=1e-4)
    assert not analysis.interval_excludes_zero(out)
    one = analysis.paired_difference({1: 0.3}, {1: 0.2})
    assert one["low"] is None and not analysis.interval_excludes_zero(one)
    assert analysis.interval_excludes_zero(analysis.paired_difference({1: 0.5, 2: 0.6}, {1: 0.1, 2: 0.21}))
    with pytest.raises(ValueError, match="no seed in common"):
        analysis.paired_difference({1: 0.1}, {2: 0.1})


def test_position_profile_uses_the_late_quarter_and_population_cv():
    rng = random.Random(0)
    rows = []
    for step in range(1, 9):
        bins = [rng.random() for _ in range(10)]
        rows.append(
            {
                "step": step,
                "train/policy/clipfrac": step / 100,
                "train/policy/finite_lower_frac": 0.5,
                **{f"train/policy/clipfrac_position_bin_{i}": b for i, b in enumerate(bins)},
            }
        )
    prof = analysis.position_profile(rows)
    tail = rows[6:]  # last 25% of 8 steps
    means = [statistics.fmean(r[f"train/policy/clipfrac_position_bin_{i}"] for r in tail) for i in range(10)]
    assert prof["bins"] == pytest.approx(means) and prof["steps"] == 2
    assert prof["cv"] == pytest.approx(statistics.pstdev(means) / statistics.fmean(means))
    assert prof["clipfrac"] == pytest.approx(0.075)
    assert analysis.coefficient_of_variation([0.0] * 10) == 0.0
    with pytest.raises(ValueError, match="fraction"):
        analysis.late_stage(rows, 0.0)


def test_checkpoint_selection_prefers_the_earliest_best():
    assert analysis.select_checkpoint([(0, 0.1), (4, 0.3), (8, 0.3), (12, 0.2)]) == (4, 0.3)
    with pytest.raises(ValueError, match="no evaluations"):
        analysis.select_checkpoint([])


def test_trainer_logs_the_policy_entropy_of_its_batch():
    """train/entropy with update depth 1 is the starting policy's entropy on the batch (float64 reference)."""
    from epic_slime.runtime.model import ModelConfig, build_policy
    from epic_slime.runtime.rollout import PolicyEngine
    from epic_slime.runtime.trainer import PolicyTrainer, group_advantages

    tok = Tokenizer()
    torch.set_num_threads(1)
    model = build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    groups = PolicyEngine(ModelConfig(), state, 0).generate(
        [(i, runtime_train_problem(i, 0, TaskConfig())) for i in range(2)],
        n_samples=4,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=10,
        seed=0,
    )
    samples = [
        {**s, "advantage": a}
        for g in groups
        for s, a in zip(g.samples, group_advantages([float(j % 2) for j in range(len(g))]))
    ]
    trainer = PolicyTrainer(
        model_cfg=ModelConfig(),
        init_state=state,
        policy_loss="epic",
        policy_loss_params={},
        policy_loss_aggregation=None,
        update_depth=1,
        lr=1e-3,
        weight_decay=0.0,
        clip_grad=1.0,
        kl_loss_coef=0.0,
        temperature=1.0,
        seed=0,
    )
    m = trainer.train_step(samples)
    ref, n = 0.0, 0
    model.eval()
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s["prompt_ids"] + s["response_ids"]])
            logits = model(input_ids=ids).logits[0].double()
            for t in range(len(s["response_ids"])):
                p = torch.softmax(logits[len(s["prompt_ids"]) - 1 + t], -1)
                ref += float(-(p * p.log()).sum())
                n += 1
    assert m["train/entropy"] == pytest.approx(ref / n, rel=1e-4)


def test_report_pairs_the_last_checkpoint_too_so_selection_cannot_hide_a_collapse():
    from epic_slime.study import report

    def result(method, seed, selected, final):
        return {
            "setting": "d8",
            "method": method,
            "seed": seed,
            "k": 8,
            "selected_version": 0,
            "validation_at_selected": selected + 0.01,
            "test_at_selected": selected,
            "test_at_final": final,
        }

    # grpo collapses by the end (finals near 0) but selection picks the warm start, as EPIC's does
    results = [result("epic", s, 0.09, f) for s, f in ((1, 0.10), (2, 0.08), (3, 0.12))]
    results += [result("grpo", s, 0.09 + 0.001 * s, f) for s, f in ((1, 0.00), (2, 0.03), (3, 0.03))]
    rows = report.method_rows(results, ["epic", "grpo"])
    grpo = rows[1]
    diffs = [0.00 - 0.10, 0.03 - 0.08, 0.03 - 0.12]
    assert grpo["diff_test_final"]["mean"] == pytest.approx(sum(diffs) / 3)
    assert grpo["diff_test_final"]["high"] < 0  # apart at the end ...
    assert not analysis.interval_excludes_zero(grpo["diff_test"])  # ... not at the selected checkpoint
    table = report.table1_markdown(rows)
    assert table[0].count("|") == table[1].count("|") == table[2].count("|") == 9  # 8 columns
    assert table[3].endswith(
        f"{sum(diffs) / 3:+.3f} [{grpo['diff_test_final']['low']:.3f}, {grpo['diff_test_final']['high']:.3f}] |"
    )
    text = " ".join(report.findings(rows, {}, results))
    assert "At the last checkpoint (no selection), apart from EPIC" in text and "grpo -0.080" in text
    # no collapse: the finding says every interval overlaps zero
    flat = [dict(r, test_at_final=r["test_at_selected"] + 0.001 * r["seed"] * (r["method"] == "grpo")) for r in results]
    text = " ".join(report.findings(report.method_rows(flat, ["epic", "grpo"]), {}, flat))
    assert "every paired interval against EPIC overlaps zero too" in text


def test_provenance_records_the_numeric_stack(tmp_path):
    """Two trainings of one warm-start recipe agree bit for bit on one stack (below), yet the ladder's warm
    start scored 0.385 trained in 2026-12-03's venv and 0.450 rerun in 2026-12-06's, whose versions nobody
    recorded. So each line names the versions of the packages whose numerics decide the weights."""
    from importlib import metadata

    from epic_slime.study.files import read_provenance, record_provenance

    record_provenance(tmp_path, "epic-slime study --config a.yaml", "abc1234", 3)
    record_provenance(tmp_path, "epic-slime study --config a.yaml", "abc1234-dirty", 0)
    first, second = read_provenance(tmp_path)
    assert first["versions"] == {"torch": metadata.version("torch"), "transformers": metadata.version("transformers")}
    assert (first["commit"], first["runs_executed"], second["commit"]) == ("abc1234", 3, "abc1234-dirty")


def test_one_warm_start_recipe_trains_the_same_weights_twice():
    from epic_slime.runtime.model import ModelConfig
    from epic_slime.runtime.threads import torch_threads
    from epic_slime.runtime.warmstart import supervised_warm_start

    model = ModelConfig(
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        num_experts=4,
        top_k=2,
        moe_intermediate_size=32,
        max_positions=96,
    )
    task = TaskConfig(min_operands=9, max_operands=9, name="chain")
    with torch_threads(1):
        a, b = (
            supervised_warm_start(model, task, steps=4, lr=3e-3, batch_size=8, seed=0, step_noise=0.1) for _ in range(2)
        )
        c = supervised_warm_start(model, task, steps=4, lr=3e-3, batch_size=8, seed=1, step_noise=0.1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)  # the seed does reach the weights


def test_each_study_option_picks_its_config_and_folder_and_the_help_names_them(monkeypatch):
    from epic_slime.study import plan
    from epic_slime.study.cli import _build_parser, study_of

    assert study_of(False, False, False) == (plan.DEFAULT_CONFIG, "runs/study")
    assert study_of(True, False, False) == (plan.QUICK_CONFIG, "runs/study-quick")
    assert study_of(False, True, False) == (plan.LADDER_CONFIG, "runs/ladder")
    assert study_of(True, True, False) == (plan.LADDER_QUICK_CONFIG, "runs/ladder-quick")
    assert study_of(False, False, True) == (plan.STRESS_CONFIG, "runs/stress")
    assert study_of(True, False, True) == (plan.STRESS_QUICK_CONFIG, "runs/stress-quick")
    monkeypatch.setenv("COLUMNS", "10000")  # one line per option
    (line,) = [ln for ln in _build_parser().format_help().splitlines() if "study directory" in ln]
    for folder in ("runs/study,", "runs/study-quick", "runs/ladder,", "runs/ladder-quick", "runs/stress,"):
        assert folder in line, folder
    assert line.rstrip().endswith("runs/stress-quick)")
