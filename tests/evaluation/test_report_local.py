"""`epic-slime report` on what local runs and uneven evaluations produce (no data files needed)."""

from __future__ import annotations

from epic_slime.evaluation.records import EvalRecord, write_records
from epic_slime.evaluation.report import main


def _write(path, benchmark="heldout", samples=(4, 4)):
    recs = [EvalRecord(run="r", method="epic", seed=1, step=step, benchmark=benchmark, prompt_id=str(p),
                       sample_idx=j, correct=(j + p + step) % 3 == 0)
            for step in (0, 5) for p, n in enumerate(samples) for j in range(n)]
    write_records(str(path), recs)


def test_report_without_benchmarks_names_what_the_records_hold(tmp_path, capsys):
    _write(tmp_path / "eval_records.jsonl")
    assert main(["--records", str(tmp_path / "eval_records.jsonl"), "--out", str(tmp_path / "out"), "--no-plots"]) != 0
    err = capsys.readouterr().err
    assert "none of the benchmarks aime_2024" in err and "they hold heldout" in err and "--benchmarks heldout" in err
    assert main(["--records", str(tmp_path / "eval_records.jsonl"), "--out", str(tmp_path / "out"), "--no-plots",
                 "--benchmarks", "heldout"]) == 0
    assert "n/a" not in (tmp_path / "out" / "table1.md").read_text().split("## Selected")[0]


def test_pass_at_k_with_uneven_samples_per_prompt_prints_na(tmp_path, capsys):
    _write(tmp_path / "r.jsonl", samples=(4, 2))          # prompt 0: 4 samples, prompt 1: 2
    out = tmp_path / "out"
    argv = ["--records", str(tmp_path / "r.jsonl"), "--out", str(out), "--no-plots", "--benchmarks", "heldout"]
    assert main([*argv, "--pass-at-k", "3"]) == 0          # 3 > 2 samples of prompt 1: not computable
    runs_table = (out / "table1.md").read_text().split("## Selected checkpoints")[1].split("## Notes")[0]
    assert "pass@3" in runs_table and runs_table.strip().splitlines()[-1].rstrip(" |").endswith("n/a")
    assert main([*argv, "--pass-at-k", "2"]) == 0          # 2 <= every prompt's samples: a number
    runs_table = (out / "table1.md").read_text().split("## Selected checkpoints")[1].split("## Notes")[0]
    assert not runs_table.strip().splitlines()[-1].rstrip(" |").endswith("n/a")
