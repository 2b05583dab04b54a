"""Issue 47: every figure of the mechanism study's reworded record (docs/results.md; the README only links to
it) and the budget section of docs/cluster.md is the committed summary's, formatted here from summary.json / budget.json, so
a regenerated report that changes a figure turns this red until the prose follows."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = json.loads((ROOT / "docs/study/mechanism/summary.json").read_text())
README = (ROOT / "README.md").read_text()
RESULTS = (ROOT / "docs/results.md").read_text()
CLUSTER = (ROOT / "docs/cluster.md").read_text()


def _flat(text: str) -> str:
    """Prose wraps at any space: compare with runs of whitespace collapsed."""
    return re.sub(r"\s+", " ", text)


def _ci(d: dict, sign: float = 1.0) -> str:
    lo, hi = sorted((sign * d["low"], sign * d["high"]))
    return f"{sign * d['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def _cells() -> dict:
    return SUMMARY["rollout_reward"]


def _gain(setting: str, method: str) -> dict:
    return _cells()[setting]["methods"][method]["gain"]


def _diff(setting: str, method: str) -> dict:
    """EPIC - method at the last checkpoint (the summary stores method - EPIC)."""
    row = next(r for r in SUMMARY["settings"][setting]["table1"] if r["method"] == method)
    return row["diff_test_final"]


def _span(values: list[float]) -> str:
    return f"{min(values):+.3f} to {max(values):+.3f}"


def figures() -> dict[str, list[str]]:
    """Each phrase the record in docs/results.md must contain."""
    c = _cells()
    long_mis, long_none = c["long_mis"], c["long_none"]
    short_mis, short_none = c["short_mis"], c["short_none"]
    contrast = {r["baseline"]: r for r in SUMMARY["contrast"]}
    gap = SUMMARY["gap_by_setting"]["long_mis"]
    engine = (0.00085, 0.00098)  # the real SGLang engine on this model (results.md, its own section)
    both = [
        f"{long_mis['of_clean']:.0%}",
        _ci(contrast["grpo"]),
        f"{contrast['ctpo']['mean']:+.3f} [{contrast['ctpo']['low']:+.3f}, {contrast['ctpo']['high']:+.3f}]",
        _span([_gain("short_none", m)["mean"] for m in ("epic", "grpo", "ctpo")]),
        f"{int(gap['first_step'] / engine[1])}-{round(gap['mean'] / engine[0])}x",
        f"EPIC +0.049 [{_gain('long_none', 'epic')['low']:+.3f}, {_gain('long_none', 'epic')['high']:+.3f}]",
        f"{_span([_gain('long_none', m)['mean'] for m in ('grpo', 'gspo', 'ctpo')])}",
    ]
    return {
        "headline": both,
        "results": [
            f"**{long_mis['first']:.3f}** against **{long_none['first']:.3f}**",
            f"(**{long_mis['of_clean']:.0%}**; chance 0.140)",
            f"keeps {short_mis['of_clean']:.0%} ({short_mis['first']:.3f} against {short_none['first']:.3f})",
            f"keeps {c['short_bf16']['of_clean']:.0%} (51) and {c['long_bf16']['of_clean']:.0%} (603)",
            f"GSPO {_ci(_gain('short_none', 'gspo'))}",
            "EPIC against each method " + _span([-_diff("long_none", m)["mean"] for m in ("gspo", "grpo", "ctpo")]),
            f"(gain {_ci(_gain('long_bf16', 'epic'))})",
            f"GRPO gains {_ci(_gain('long_bf16', 'grpo'))}",
            f"EPIC - GRPO {_ci(_diff('long_bf16', 'grpo'), -1.0)}",
            f"EPIC ends {_diff('short_mis', 'grpo')['mean']:.3f} below GRPO (paired interval below 0",
        ],
    }


def test_the_gains_the_record_quotes_are_the_summarys():
    c = _cells()
    three = [_gain("short_none", m)["mean"] for m in ("epic", "grpo", "ctpo")]
    assert _span(three) == "+0.145 to +0.148" and all(
        _gain("short_none", m)["low"] > 0 for m in ("epic", "grpo", "ctpo")
    )
    assert all(_gain("long_none", m)["low"] > 0 for m in ("grpo", "gspo", "ctpo"))  # "intervals above 0"
    assert _gain("long_none", "epic")["low"] < 0 < _gain("long_none", "epic")["high"]  # "not resolved"
    assert c["long_mis"]["passes_gate"] is False and c["long_mis_tis"]["passes_gate"] is False
    assert c["short_mis"]["passes_gate"] and c["short_bf16"]["passes_gate"] and c["long_bf16"]["passes_gate"]
    assert f"{c['long_mis']['first']:.3f}" == "0.130" and f"{c['long_none']['first']:.3f}" == "0.344"
    widths = [(_diff("long_none", m)["high"] - _diff("long_none", m)["low"]) / 2 for m in ("grpo", "gspo", "ctpo")]
    assert 0.125 <= min(widths) and max(widths) <= 0.175  # "intervals about +-0.13 to +-0.17" / "+-0.15"


@pytest.mark.parametrize("where", ["headline", "results"])
def test_every_figure_of_the_reworded_record_is_the_summarys(where):
    text = _flat(RESULTS)
    missing = [phrase for phrase in figures()[where] if phrase not in text]
    assert not missing, missing


def test_the_claims_the_review_refuted_are_gone():
    for name, text in (("README.md", _flat(README)), ("docs/results.md", _flat(RESULTS))):
        assert "clean negative" not in text, name
        assert "learns and they tie" not in text and "learns at both lengths and they tie" not in text, name
        assert "a bf16 rollout (gap 3e-4) breaks no cell." not in text, name
        assert "(the interval below 0), against GSPO" not in text, name


def test_the_rollout_reward_table_in_results_is_the_reports():
    study = (ROOT / "docs/study/mechanism/study.md").read_text().splitlines()
    start = study.index("## Rollout (behaviour) reward beside the scores")
    end = next(i for i in range(start + 1, len(study)) if study[i].startswith("## "))
    rows = [line for line in study[start + 1 : end] if line.startswith("|")]
    block = RESULTS.split("<!-- mechanism rollout reward")[1].split("<!-- end mechanism rollout reward -->")[0]
    assert [line for line in block.splitlines() if line.startswith("|")] == rows and len(rows) == 2 + 8


def test_the_cluster_sentence_is_the_budget_benchs_output():
    sys.path.insert(0, str(ROOT / "bench"))
    import epic_mismatch_budget as bench

    result = json.loads((ROOT / "docs/study/mismatch_budget/budget.json").read_text())
    no_r3 = ["gap 0.013, KL 1.5e-3 (no R3)"]
    r3 = ["gap 0.007, KL 2e-4 (R3)", "gap 0.007, KL 5e-4 (R3)"]
    sentence = _flat(CLUSTER.split("### Does EPIC need R3 at the paper's setting?")[1].split("\n### ")[0])
    assert f"uses {bench.level_ranges(result, no_r3, 'lower_used_mean')} of the lower budget" in sentence
    assert f"clips {bench.level_ranges(result, no_r3, 'clipfrac_adv_neg')} of the negative-advantage" in sentence
    r3_figures = f"R3 (KL 2-5e-4) the figures are {bench.level_ranges(result, r3, 'lower_used_mean')} and"
    assert r3_figures in sentence
    assert f"and {bench.level_ranges(result, r3, 'clipfrac_adv_neg')}." in sentence
    recompute = [r for r in result["rows"] if r["behaviour"] == "recompute"]
    assert recompute and all(r["lower_used_mean"] == r["clipfrac_adv_neg"] == 0 for r in recompute)  # "nothing"
