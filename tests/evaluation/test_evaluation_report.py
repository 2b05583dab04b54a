"""`epic-slime report` on a small synthetic record file: the numbers in Table 1 are checked
against values computed by hand (see the comments)."""

from __future__ import annotations

import json

from epic_slime.cli import main as cli_main
from epic_slime.evaluation import EvalRecord, write_records

BENCH = ("aime_2024", "aime_2025", "amc_2023", "hmmt_feb_2025")

# Correct samples out of 4 (2 prompts x 2 samples) per benchmark, so mean@2 = count / 4.
PLAN = {
    ("epic", 1): {0: (0, 0, 0, 0), 5: (2, 1, 3, 0), 10: (1, 1, 2, 2)},  # avg 0, .375, .375 -> step 5 (tie: earliest)
    ("epic", 2): {0: (1, 0, 0, 0), 5: (2, 2, 2, 2), 10: (4, 3, 2, 0)},  # avg .0625, .5, .5625 -> step 10
    ("epic", 3): {0: (0, 0, 0, 1), 5: (1, 1, 1, 1), 10: (3, 1, 3, 1)},  # avg .0625, .25, .5 -> step 10
    ("grpo", 1): {0: (0, 0, 0, 0), 5: (4, 4, 4, 4), 10: (4, 4, 4, None)},  # step 10 lacks HMMT -> step 5
    ("grpo", 2): {0: (3, 0, 0, 0), 5: (0, 0, 0, 0), 10: (0, 1, 0, 0)},  # avg .1875, 0, .0625 -> step 0
}
# Hand computation at the selected checkpoints (percent, mean ± sample std over seeds):
# epic AIME24 (.5, 1, .75) -> 75.0 ± 25.0; AIME25 (.25, .75, .25) -> 41.7 ± 28.9;
#      AMC (.75, .5, .75) -> 66.7 ± 14.4; HMMT (0, 0, .25) -> 8.3 ± 14.4;
#      average (.375, .5625, .5) -> 47.9 ± 9.5
# grpo AIME24 (1, .75) -> 87.5 ± 17.7; AIME25, AMC, HMMT (1, 0) -> 50.0 ± 70.7;
#      average (1, .1875) -> 59.4 ± 57.5
EXPECTED_ROWS = [
    "| epic | 75.0 ± 25.0 | 41.7 ± 28.9 | 66.7 ± 14.4 | 8.3 ± 14.4 | 47.9 ± 9.5 |",
    "| grpo | 87.5 ± 17.7 | 50.0 ± 70.7 | 50.0 ± 70.7 | 50.0 ± 70.7 | 59.4 ± 57.5 |",
]


def _synthetic_records():
    records = []
    for (method, seed), steps in PLAN.items():
        for step, counts in steps.items():
            for benchmark, count in zip(BENCH, counts):
                if count is None:
                    continue
                outcomes = [i < count for i in range(4)]
                for i, correct in enumerate(outcomes):
                    records.append(
                        EvalRecord(
                            f"{method}-seed{seed}",
                            method,
                            seed,
                            step,
                            benchmark,
                            f"{benchmark}/p{i // 2}",
                            i % 2,
                            correct,
                        )
                    )
    return records


def test_report_table_numbers(tmp_path):
    records_path = tmp_path / "records.jsonl"
    write_records(str(records_path), _synthetic_records())
    out = tmp_path / "report"
    assert (
        cli_main(
            [
                "report",
                "--records",
                str(records_path),
                "--out",
                str(out),
                "--samples-per-prompt",
                "2",
                "--pass-at-k",
                "2",
                "--bootstrap",
                "0",
            ]
        )
        == 0
    )
    text = (out / "table1.md").read_text()
    lines = text.splitlines()
    header = "| Method | AIME 24 | AIME 25 | AMC 23 | HMMT 25 | Average |"
    start = lines.index(header)
    assert lines[start + 2 : start + 4] == EXPECTED_ROWS
    assert json.loads((out / "selection.json").read_text()) == {
        "epic": {
            "epic-seed1": {"seed": 1, "step": 5},
            "epic-seed2": {"seed": 2, "step": 10},
            "epic-seed3": {"seed": 3, "step": 10},
        },
        "grpo": {"grpo-seed1": {"seed": 1, "step": 5}, "grpo-seed2": {"seed": 2, "step": 0}},
    }
    # per-run row of epic seed 1 at step 5: mean@2 50.0 25.0 75.0 0.0, average 37.5;
    # pass@2: AIME24 prompts (2/2, 0/2) -> 50.0; AIME25 (1/2, 0/2) -> 50.0; AMC (2/2, 1/2) -> 100.0; HMMT 0.0
    assert "| epic-seed1 | epic | 1 | 5 | 50.0 | 25.0 | 75.0 | 0.0 | 37.5 | 50.0 | 50.0 | 100.0 | 0.0 |" in lines
    assert "Samples per prompt: 2 (protocol: 2)" in text and "WARNING" not in text
    scores = (out / "scores.csv").read_text().splitlines()
    assert "grpo-seed1,grpo,1,10,aime_2024,1.000000,2,2" in scores
    assert not any(line.startswith("grpo-seed1,grpo,1,10,average") for line in scores)  # incomplete checkpoint
    for name in ("average", *BENCH):
        png = (out / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_report_flags_protocol_mismatch_and_bad_input(tmp_path, capsys):
    records_path = tmp_path / "records.jsonl"
    write_records(str(records_path), _synthetic_records())
    out = tmp_path / "report"
    assert cli_main(["report", "--records", str(tmp_path), "--out", str(out), "--no-plots"]) == 0  # folder input
    text = (out / "table1.md").read_text()
    assert "WARNING: samples per prompt differ from the protocol's 8" in text
    assert not (out / "average.png").exists()
    # a folder holding a report is refused as `train` refuses a run folder: exit 2, nothing replaced
    (out / "table1.md").write_text("mine")
    assert cli_main(["report", "--records", str(tmp_path), "--out", str(out), "--no-plots"]) == 2
    assert (
        f"--out {out} already holds a report (table1.md, scores.csv, intervals.json, selection.json): pass --overwrite"
        in capsys.readouterr().err
    )
    assert (out / "table1.md").read_text() == "mine"
    assert cli_main(["report", "--records", str(tmp_path), "--out", str(out), "--no-plots", "--overwrite"]) == 0
    assert (out / "table1.md").read_text() != "mine"
    records_path.write_text(records_path.read_text() + '{"run": "x"}\n')
    assert cli_main(["report", "--records", str(records_path), "--out", str(out), "--overwrite"]) == 2
    assert "missing field(s)" in capsys.readouterr().err


def _thirty_two_sample_records(prompts=4):
    """Per benchmark, prompt p: samples 0..15 have p + 1 correct (the first ones), samples 16..31 are
    all correct for AIME and all wrong for AMC / HMMT; so the first 16 and all 32 give other numbers."""
    records = []
    for seed in (1, 2):
        for b in BENCH:
            for p in range(prompts):
                for s in range(32):
                    correct = s < p + 1 if s < 16 else b.startswith("aime")
                    records.append(EvalRecord(f"epic-s{seed}", "epic", seed, 50, b, f"{b}/p{p}", s, correct))
    return records


def _table_row(out, method="epic"):
    return next(line for line in (out / "table1.md").read_text().splitlines() if line.startswith(f"| {method} |"))


def test_report_k_uses_the_first_k_samples(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    write_records(str(path), _thirty_two_sample_records())
    # mean@16: prompt p has (p + 1) / 16 -> mean over p = 0..3 of (p + 1) / 16 = 10 / 64 = 15.625%
    assert (
        cli_main(
            [
                "report",
                "--records",
                str(path),
                "--out",
                str(tmp_path / "k16"),
                "--k",
                "16",
                "--no-plots",
                "--bootstrap",
                "0",
            ]
        )
        == 0
    )
    assert _table_row(tmp_path / "k16") == "| epic | 15.6 ± 0.0 | 15.6 ± 0.0 | 15.6 ± 0.0 | 15.6 ± 0.0 | 15.6 ± 0.0 |"
    text = (tmp_path / "k16" / "table1.md").read_text()
    assert "Samples per prompt: 16 (protocol: 16)" in text and "WARNING" not in text
    # all 32: AIME (p + 1 + 16) / 32 -> (10 + 64) / 128 = 57.8125%; AMC / HMMT (p + 1) / 32 -> 7.8125%
    # the authors' protocol: AIME over 32, AMC and HMMT over the first 16 -> average (57.8125 * 2 + 15.625 * 2) / 4
    assert (
        cli_main(
            [
                "report",
                "--records",
                str(path),
                "--out",
                str(tmp_path / "re"),
                "--reeval-protocol",
                "--no-plots",
                "--bootstrap",
                "0",
            ]
        )
        == 0
    )
    assert _table_row(tmp_path / "re") == "| epic | 57.8 ± 0.0 | 57.8 ± 0.0 | 15.6 ± 0.0 | 15.6 ± 0.0 | 36.7 ± 0.0 |"
    # --benchmark-k on top of --k
    assert (
        cli_main(
            [
                "report",
                "--records",
                str(path),
                "--out",
                str(tmp_path / "mix"),
                "--k",
                "32",
                "--benchmark-k",
                "amc_2023=16",
                "--no-plots",
                "--bootstrap",
                "0",
            ]
        )
        == 0
    )
    assert _table_row(tmp_path / "mix") == "| epic | 57.8 ± 0.0 | 57.8 ± 0.0 | 15.6 ± 0.0 | 7.8 ± 0.0 | 34.8 ± 0.0 |"
    # a prompt with fewer than k samples is an error naming it
    short = [
        r
        for r in _thirty_two_sample_records()
        if not (r.prompt_id == "amc_2023/p2" and r.sample_idx >= 12 and r.seed == 2)
    ]
    write_records(str(path), short, append=False)
    capsys.readouterr()
    assert cli_main(["report", "--records", str(path), "--out", str(tmp_path / "bad"), "--k", "16", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "'epic-s2'" in err and "'amc_2023/p2'" in err and "12 samples, fewer than k=16" in err
    assert cli_main(["report", "--records", str(path), "--out", str(tmp_path / "bad"), "--benchmark-k", "amc=0"]) == 2
    assert "--benchmark-k: expected NAME=K" in capsys.readouterr().err


def test_report_prints_bootstrap_intervals_next_to_each_cell(tmp_path):
    path = tmp_path / "r.jsonl"
    write_records(str(path), _thirty_two_sample_records(prompts=8))
    out = tmp_path / "ci"
    assert (
        cli_main(["report", "--records", str(path), "--out", str(out), "--k", "16", "--no-plots", "--bootstrap", "500"])
        == 0
    )
    row = _table_row(out)
    cells = [c.strip() for c in row.strip("|").split("|")][1:]
    intervals = json.loads((out / "intervals.json").read_text())["epic"]
    for column, cell in zip([*BENCH, "average"], cells):
        low, high = intervals[column]
        # prompt p has (p + 1) / 16 correct: mean 4.5 / 16 = 28.125%; the prompts differ, so the interval is wide
        assert cell == f"28.1 ± 0.0 [{100 * low:.1f}, {100 * high:.1f}]"
        # (about +-0.1 for one benchmark, half that for the average of four independent prompt draws)
        assert low < 0.28125 < high and high - low > (0.05 if column == "average" else 0.1)
