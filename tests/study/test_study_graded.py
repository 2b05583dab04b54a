"""Issue 47's graded-mismatch study, fixed before its runs: the config's levels are the calibration's choice
(every one passing the 75% rollout-reward gate), every run parses, the stages are exact cuts that cover the
config, the primary contrast targets the strongest gated level, and the committed warm start is a cache hit."""

from __future__ import annotations

import json

import yaml

from epic_slime.runtime.config import parse_config
from epic_slime.study.calibration import choose_levels
from epic_slime.study.plan import REPO, load_study_config, plan, run_argv

OUT = REPO / "docs" / "study" / "mismatch_graded"
CONFIG = REPO / "configs" / "study" / "mismatch_graded.yaml"


def _calibration(length: int) -> list[dict]:
    path = OUT / f"calibration_{length}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_the_levels_are_the_calibrations_choice_and_each_passes_the_gate():
    cfg = load_study_config(CONFIG)
    chosen = choose_levels(_calibration(603))
    assert all(c["passes"] for c in chosen)
    sigmas = {s["name"]: s.get("rollout_router_noise", 0.0) for s in cfg.settings}
    assert sorted(sigmas.values()) == sorted({0.0} | {c["sigma"] for c in chosen})
    strongest = next(c["sigma"] for c in chosen if c["level"] == "strongest")
    assert cfg.contrast == {
        "method": "epic",
        "baselines": ["grpo"],
        "target": next(n for n, s in sigmas.items() if s == strongest),
        "reference": "none",
    }
    assert cfg.seeds == list(range(1, 11)) and cfg.methods == ["epic", "grpo"]


def test_every_run_parses_at_603_tokens_and_the_warm_start_is_the_committed_one(tmp_path):
    from epic_slime.runtime.warmstart import read_init_weights, warm_start_key

    cfg = load_study_config(CONFIG)
    keys = set()
    for spec in plan(cfg):
        run = parse_config(run_argv(cfg, spec, tmp_path / spec.name, OUT / "warm_start"))
        assert (
            run.task.min_operands == run.task.max_operands == 100 and not run.use_tis
        )  # the ratio on the rollout log-probs
        sha = read_init_weights(run.warm_start_init)[1]
        keys.add(
            warm_start_key(
                run.model,
                run.task,
                run.warm_start_steps,
                run.warm_start_lr,
                run.warm_start_batch_size,
                run.warm_start_seed_or_seed,
                run.warm_start_answer_noise,
                run.warm_start_step_noise,
                sha,
            )
        )
    assert keys == {"28cf0aa004ed080c"}  # one warm start, the mechanism study's long one
    assert (OUT / "warm_start" / "28cf0aa004ed080c.pt").read_bytes() == (
        REPO / "docs/study/mechanism/warm_start/28cf0aa004ed080c.pt"
    ).read_bytes()


def test_the_stages_are_exact_cuts_that_cover_the_config_primary_first():
    full = yaml.safe_load(CONFIG.read_text())
    seen = []
    for stage in sorted((OUT / "stages").glob("*.yaml")):
        cut = yaml.safe_load(stage.read_text())
        assert cut["train"] == full["train"] and cut["seeds"] == full["seeds"] and cut["methods"] == full["methods"]
        assert cut["test_prompts"] == full["test_prompts"]
        assert all(s in full["settings"] for s in cut["settings"])
        seen += [s["name"] for s in cut["settings"]]
    assert sorted(seen) == sorted(s["name"] for s in full["settings"]) and len(seen) == len(set(seen))
    first = yaml.safe_load((OUT / "stages" / "1_primary.yaml").read_text())
    assert {s["name"] for s in first["settings"]} == {full["contrast"]["target"], full["contrast"]["reference"]}


def test_the_design_quotes_the_generated_calibration():
    readme = (OUT / "README.md").read_text()
    calibration = (OUT / "calibration.md").read_text()
    section = calibration.split("## 603 response tokens")[1].split("\n## ")[0]
    chosen = [
        line
        for line in section.splitlines()
        if line.startswith("| ")
        and "matched on" not in line
        and line.split("|")[1].strip() in {"engine", "r3_low", "r3_high", "no_r3", "strongest"}
    ]
    assert chosen and all(line in readme for line in chosen)
