"""`epic-slime report` on what local runs and uneven evaluations produce (no data files needed)."""

from __future__ import annotations

from epic_slime.evaluation.records import EvalRecord, write_records
from epic_slime.evaluation.report import main


def _write(path, benchmark="heldout", samples=(4, 4)):
    recs = [
        EvalRecord(
            run="r",
            method="epic",
            seed=1,
            step=step,
            benchmark=benchmark,
            prompt_id=str(p),
            sample_idx=j,
            correct=(j + p + step) % 3 == 0,
        )
        for step in (0, 5)
        for p, n in enumerate(samples)
        for j in range(n)
    ]
    write_records(str(path), recs)


def test_report_by_default_uses_the_benchmarks_the_records_hold(tmp_path, capsys):
    """Issue 28 s8: the README's own run holds only `heldout`; the default must not refuse it."""
    _write(tmp_path / "eval_records.jsonl")
    out = tmp_path / "out"
    assert main(["--records", str(tmp_path / "eval_records.jsonl"), "--out", str(out), "--no-plots"]) == 0
    table = (out / "table1.md").read_text()
    assert "heldout" in table.split("## Selected")[0] and "n/a" not in table.split("## Selected")[0]
    assert "Benchmarks: heldout (the ones the records hold" in table


def test_report_default_puts_the_papers_benchmarks_first(tmp_path):
    _write(tmp_path / "a.jsonl", benchmark="zeta")
    _write(tmp_path / "b.jsonl", benchmark="aime_2024")
    out = tmp_path / "out"
    assert (
        main(["--records", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--out", str(out), "--no-plots"]) == 0
    )
    header = next(line for line in (out / "table1.md").read_text().splitlines() if line.startswith("| Method"))
    assert header.index("AIME") < header.index("zeta")


def test_report_with_named_benchmarks_absent_names_what_the_records_hold(tmp_path, capsys):
    _write(tmp_path / "eval_records.jsonl")
    assert (
        main(
            [
                "--records",
                str(tmp_path / "eval_records.jsonl"),
                "--out",
                str(tmp_path / "out"),
                "--no-plots",
                "--benchmarks",
                "aime_2024",
            ]
        )
        != 0
    )
    err = capsys.readouterr().err
    assert "none of the benchmarks aime_2024" in err and "they hold heldout" in err and "--benchmarks heldout" in err


def test_table1_says_the_score_is_selected_on_the_records_it_is_scored_on(tmp_path):
    """Issue 28 s8: Table 1's number is the best of the evaluated checkpoints, scored on the split
    that chose it; the table says so where the number stands, with the count."""
    _write(tmp_path / "eval_records.jsonl")  # steps 0 and 5: 2 evaluations
    out = tmp_path / "out"
    assert main(["--records", str(tmp_path / "eval_records.jsonl"), "--out", str(out), "--no-plots"]) == 0
    head = (out / "table1.md").read_text().split("## Selected")[0]
    assert "best of 2 evaluated checkpoints" in head and "same records" in head


def test_pass_at_k_with_uneven_samples_per_prompt_prints_na(tmp_path, capsys):
    _write(tmp_path / "r.jsonl", samples=(4, 2))  # prompt 0: 4 samples, prompt 1: 2
    out = tmp_path / "out"
    argv = [
        "--records",
        str(tmp_path / "r.jsonl"),
        "--out",
        str(out),
        "--no-plots",
        "--benchmarks",
        "heldout",
        "--overwrite",
    ]  # the same folder, report after report
    assert main([*argv, "--pass-at-k", "3"]) == 0  # 3 > 2 samples of prompt 1: not computable
    runs_table = (out / "table1.md").read_text().split("## Selected checkpoints")[1].split("## Notes")[0]
    assert "pass@3" in runs_table and runs_table.strip().splitlines()[-1].rstrip(" |").endswith("n/a")
    assert main([*argv, "--pass-at-k", "2"]) == 0  # 2 <= every prompt's samples: a number
    runs_table = (out / "table1.md").read_text().split("## Selected checkpoints")[1].split("## Notes")[0]
    assert not runs_table.strip().splitlines()[-1].rstrip(" |").endswith("n/a")


def test_report_default_lists_each_benchmark_once(tmp_path):
    """Found by issue 28 item 7's mutation pass: a paper benchmark listed twice by the default would
    be two columns and weigh double in the average."""
    from epic_slime.evaluation.report import held_benchmarks

    _write(tmp_path / "a.jsonl", benchmark="zeta")
    _write(tmp_path / "b.jsonl", benchmark="aime_2024")
    out = tmp_path / "out"
    assert (
        main(["--records", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--out", str(out), "--no-plots"]) == 0
    )
    header = next(line for line in (out / "table1.md").read_text().splitlines() if line.startswith("| Method"))
    assert header.count("AIME") == 1 and header.count("zeta") == 1, header
    recs = [type("R", (), {"benchmark": b})() for b in ("zeta", "aime_2024", "math_500", "aime_2024")]
    assert held_benchmarks(recs) == ["aime_2024", "math_500", "zeta"]
