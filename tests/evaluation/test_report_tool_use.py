"""`epic-slime report` with the agent's tool counts (issue 44 item 6): records carrying per-sample
``tool_calls``, ``tool_errors``, ``turns`` add a "Tool use" section to table1.md (per method, at Table 1's
selected checkpoints, over the responses mean@k counts, pooled over benchmarks) and three columns to
scores.csv; records without them change nothing. Also: the field rules (one-line errors naming file,
line, field and value), mixed files (means over the responses that carry counts, the rest counted in
the notes), and the writers: the runtime's eval (scripted calc policy -> EvalQueue -> RunLog ->
report) and slime's eval hook (``TrajectoryLog`` in ``sample.metadata``)."""

from __future__ import annotations

import csv
import json
import types

import pytest
from support.calc_script import VersionedEngine, scripted_sample

from epic_slime.evaluation.records import EvalRecord, RecordError, read_records, write_records
from epic_slime.evaluation.report import main

# run -> (method, seed, step -> benchmark -> prompt -> [(calls, errors, turns) or None per sample]);
# step 5 is all correct (selected), step 0 all wrong with counts (9, 9, 9) that must not show
SELECTED = {
    "a1": (
        "agent",
        1,
        {"x": {"p0": [(1, 0, 2), (3, 1, 4)]}, "y": {"p0": [(0, 0, 1)] * 2, "p1": [(2, 2, 3), (0, 0, 1)]}},
    ),
    "a2": ("agent", 2, {"x": {"p0": [(2, 0, 3)] * 2}, "y": {"p0": [(2, 1, 3)] * 2, "p1": [(2, 1, 3)] * 2}}),
    "s1": ("solo", 1, {"x": {"p0": [(1, 0, 1), (1, 1, 2)]}, "y": {"p0": [(0, 0, 1)] * 2, "p1": [(0, 0, 1)] * 2}}),
}


def _records(selected=SELECTED):
    out = []
    for run, (method, seed, by_benchmark) in selected.items():
        for benchmark, by_prompt in by_benchmark.items():
            for prompt, samples in by_prompt.items():
                for j, at_five in enumerate(samples):
                    for step, correct, counts in ((0, False, (9, 9, 9)), (5, True, at_five)):
                        tool = dict(zip(("tool_calls", "tool_errors", "turns"), counts)) if counts else {}
                        out.append(EvalRecord(run, method, seed, step, benchmark, prompt, j, correct, step, **tool))
    return out


def _report(tmp_path, records, *flags):
    path = tmp_path / "e.jsonl"
    write_records(str(path), records, append=False)
    out = tmp_path / "out"
    assert main(["--records", str(path), "--out", str(out), "--no-plots", "--bootstrap", "0", *flags]) == 0
    with open(out / "scores.csv") as handle:
        rows = list(csv.DictReader(handle))
    return (out / "table1.md").read_text(), rows


def _section(table: str) -> list[str]:
    return table.split("## Tool use\n")[1].split("## Notes")[0].strip().splitlines()[-3:]


def _row(rows, run, step, benchmark):
    (row,) = [r for r in rows if (r["run"], r["step"], r["benchmark"]) == (run, str(step), benchmark)]
    return [row[c] for c in ("tool_calls_per_response", "tool_errors_per_response", "turns_per_response")]


def test_table1_and_scores_show_the_tool_counts_at_the_selected_checkpoints(tmp_path):
    table, rows = _report(tmp_path, _records())
    # a1 pooled over its 6 responses at step 5: calls 6/6, errors 3/6, turns 12/6 (not the per-benchmark
    # average 1.25 calls); a2: 12/6, 4/6, 18/6; over seeds mean ± sd(ddof=1): sd(1, 2) = 0.71,
    # errors mean(1/2, 2/3) = 0.58, sd 0.12. solo (one seed): 2/6, 1/6, 7/6.
    assert _section(table) == [
        "|---|:---:|:---:|:---:|",
        "| agent | 1.50 ± 0.71 | 0.58 ± 0.12 | 2.50 ± 0.71 |",
        "| solo | 0.33 | 0.17 | 1.17 |",
    ]
    assert "| Method | Tool calls | Tool errors | Turns |" in table
    assert table.index("## Selected checkpoints") < table.index("## Tool use") < table.index("## Notes")
    assert "carry no tool counts" not in table
    assert _row(rows, "a1", 5, "x") == ["2.000000", "0.500000", "3.000000"]
    assert _row(rows, "a1", 5, "average") == ["1.000000", "0.500000", "2.000000"]
    assert _row(rows, "a2", 0, "y") == ["9.000000", "9.000000", "9.000000"]  # every step, as mean_at_k


def test_k_counts_the_same_responses_as_mean_at_k(tmp_path):
    table, rows = _report(tmp_path, _records(), "--k", "1")
    # sample 0 only: a1 calls 3/3, errors 2/3, turns 6/3; a2 6/3, 2/3, 9/3
    assert _section(table)[1] == "| agent | 1.50 ± 0.71 | 0.67 ± 0.00 | 2.50 ± 0.71 |"
    assert _row(rows, "a1", 5, "x") == ["1.000000", "0.000000", "2.000000"]


def test_a_mixed_file_averages_the_records_that_carry_counts_and_says_so(tmp_path):
    selected = dict(SELECTED)
    a1 = selected["a1"]
    selected["a1"] = (*a1[:2], {**a1[2], "x": {"p0": [(1, 0, 2), None]}})  # one response without counts
    selected["s1"] = (*SELECTED["s1"][:2], {b: {p: [None] * 2 for p in ps} for b, ps in SELECTED["s1"][2].items()})
    table, rows = _report(tmp_path, _records(selected))
    # a1 over its 5 responses with counts: calls 3/5, errors 2/5, turns 8/5; mean with a2 (2, 2/3, 3)
    assert _section(table)[1:] == ["| agent | 1.30 ± 0.99 | 0.53 ± 0.19 | 2.30 ± 0.99 |", "| solo | n/a | n/a | n/a |"]
    assert (
        "- 7 of 18 responses at the selected checkpoints (run(s) a1, s1) carry no tool counts: the tool-use "
        "figures are means over the responses that carry them; run(s) s1 have none and are left out of them"
    ) in table
    assert _row(rows, "s1", 5, "x") == ["", "", ""]
    assert _row(rows, "a1", 5, "x") == ["1.000000", "0.000000", "2.000000"]


def test_records_without_counts_give_the_report_as_before(tmp_path):
    plain = [EvalRecord(**{**r.to_dict(), "tool_calls": None, "tool_errors": None, "turns": None}) for r in _records()]
    table, rows = _report(tmp_path, plain)
    assert "Tool use" not in table and "tool counts" not in table
    header = "run,method,seed,step,benchmark,mean_at_k,num_prompts,samples_per_prompt"
    with open(tmp_path / "out" / "scores.csv") as handle:
        lines = list(csv.reader(handle))
    assert ",".join(lines[0]) == header and {len(line) for line in lines} == {8}
    assert '"tool_calls"' not in (tmp_path / "e.jsonl").read_text()  # absent, not null


@pytest.mark.parametrize(
    "change, message",
    [
        ({"tool_calls": -1}, "field 'tool_calls' must be an integer >= 0 or absent, got -1"),
        ({"turns": 1.5}, "field 'turns' must be an integer >= 0 or absent, got 1.5"),
        ({"tool_errors": "0"}, "field 'tool_errors' must be an integer >= 0 or absent, got '0'"),
        ({"turns": True}, "field 'turns' must be an integer >= 0 or absent, got True"),
        ({"turns": None}, "field(s) turns absent beside tool_calls, tool_errors: the tool counts come together"),
        ({"tool_errors": 3}, "field 'tool_errors' 3 exceeds 'tool_calls' 2"),
    ],
)
def test_a_bad_count_is_refused_in_one_line_naming_file_line_field_and_value(tmp_path, capsys, change, message):
    good = {**_records()[0].to_dict(), "tool_calls": 2, "tool_errors": 2, "turns": 0}  # boundaries: accepted
    path = tmp_path / "e.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, **change}) + "\n")
    with pytest.raises(RecordError) as error:
        read_records(str(path))
    assert str(error.value).startswith(f"{path}:2: {message}")
    assert "\n" not in str(error.value)
    assert main(["--records", str(path), "--out", str(tmp_path / "out"), "--no-plots"]) == 2
    assert capsys.readouterr().err.strip() == f"epic-slime report: error: {error.value}"


def test_the_runtimes_eval_writes_each_trajectorys_counts_and_the_report_shows_them(tmp_path, monkeypatch):
    """A scripted calc policy (counts known) through rollout_agent.evaluate, EvalQueue.collect and
    RunLog.evaluation into eval_records.jsonl, then the report from the run folder."""
    import ray

    from epic_slime.runtime import rollout_agent, task_calc
    from epic_slime.runtime.config import parse_config
    from epic_slime.runtime.eval_queue import EvalQueue
    from epic_slime.runtime.run_files import EVAL_RECORDS_FILE, RunLog

    script = {"47*83": ["47*83=", "Answer:3901<eos>"], "12*34": ["12*=", "12*34=", "Answer:408<eos>"]}
    monkeypatch.setattr(task_calc, "sample", scripted_sample(script))
    problems = [task_calc._problem(47, 83), task_calc._problem(12, 34)]
    sampling = dict(temperature=1.0, top_p=1.0, max_new_tokens=24, seed=0, max_turns=3)
    correct, stats, counts = rollout_agent.evaluate(VersionedEngine(4), problems, k=2, tool=True, **sampling)
    run = tmp_path / "run"
    run.mkdir()
    cfg = parse_config(["--task-name", "calc", "--output-dir", str(run), "--n-samples-per-eval-prompt", "2"])
    queue = EvalQueue(cfg, RunLog(cfg))
    monkeypatch.setattr(ray, "get", lambda fut: fut)
    queue.future, queue.future_version = (4, correct, stats, counts), 4  # what EvalWorker.evaluate returns
    queue.collect(step=4)
    records = read_records(str(run / EVAL_RECORDS_FILE))
    assert [(r.prompt_id, r.sample_idx, r.tool_calls, r.tool_errors, r.turns) for r in records] == [
        ("0", 0, 1, 0, 2),
        ("0", 1, 1, 0, 2),
        ("1", 0, 2, 1, 3),
        ("1", 1, 2, 1, 3),
    ]
    for name in ("metrics.jsonl", "batches.jsonl"):  # a run folder, as `epic-slime train` leaves it
        (run / name).touch()
    out = tmp_path / "out"
    assert main(["--records", str(run), "--out", str(out), "--no-plots", "--bootstrap", "0"]) == 0
    table = (out / "table1.md").read_text()
    assert f"| {cfg.policy_loss} | 1.50 | 0.50 | 2.50 |" in table  # = the eval line's per-response counts
    assert stats == pytest.approx(
        {"tool_calls_per_response": 1.5, "tool_errors_per_response": 0.5, "turns_per_response": 2.5}
    )


def test_slimes_eval_hook_takes_the_counts_from_the_agent_generates_trajectory_log():
    from epic_slime.slime.eval_hooks import eval_records_from_rollout
    from epic_slime.tools.agent import TrajectoryLog

    def sample(index, turns, calls, errors):
        metadata = {"problem_id": "p0"}
        TrajectoryLog(turns=turns, tool_calls=calls, tool_errors=errors).save(metadata)
        return types.SimpleNamespace(index=index, metadata=metadata)

    samples = [sample(0, 4, 3, {"timeout": 2, "bad_call": 1}), sample(1, 1, 0, {})]
    plain = types.SimpleNamespace(index=2, metadata={"problem_id": "p1"})  # a single-turn sample
    args = types.SimpleNamespace(n_samples_per_eval_prompt=2, policy_loss="epic")
    records = eval_records_from_rollout(7, args, {"calc": {"rewards": [1, 0, 1], "samples": [*samples, plain]}})
    assert [(r.prompt_id, r.tool_calls, r.tool_errors, r.turns) for r in records] == [
        ("p0", 3, 3, 4),  # errors of every kind summed
        ("p0", 0, 0, 1),
        ("p1", None, None, None),
    ]
    assert "tool_calls" not in records[2].to_dict()
