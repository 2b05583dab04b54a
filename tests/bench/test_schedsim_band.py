"""bench/schedsim: the calibration's tp_alpha range, the bands of the predicted speedups, the planner's
steady pick against the best synchronous baseline, the launcher's price line, and ``plan`` without slime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from schedsim import band, calibration, launch_table, planner  # noqa: E402
from schedsim.presets import paper_preset  # noqa: E402
from schedsim.report import STEADY_SHARE_MAX  # noqa: E402


def test_the_tp_alpha_range_fits_every_published_tp4_row_both_ways():
    """Each #5839 TP4 row is met by its point fit (through the TP1-calibrated model) and by its ratio fit
    (modelled TP4 / TP1 = measured); the range runs from the lowest tuned fit to linear scaling."""
    p = paper_preset()
    fits = calibration.tp_alpha_fits(p)
    assert len(fits) == len(calibration.TP_POINTS) == 3
    for f in fits:
        at_point = dataclass_alpha(p, f["point"])
        tp4 = calibration.modelled_tok_s(at_point, "H20", 4, None, f["isl"], f["osl"])[0]
        assert tp4 == pytest.approx(f["tp4"], rel=1e-4)
        tp1 = calibration.modelled_tok_s(p, "H20", 1, None, f["isl"], f["osl"])[0]
        at_ratio = dataclass_alpha(p, f["ratio"])
        ratio = calibration.modelled_tok_s(at_ratio, "H20", 4, None, f["isl"], f["osl"])[0] / tp1
        assert ratio == pytest.approx(f["tp4"] / f["tp1"], rel=1e-4)
    tuned = [v for f in fits if f["tuned"] for v in (f["point"], f["ratio"])]
    assert calibration.tp_alpha_range(p) == (round(min(tuned), 2), 1.0) == (0.43, 1.0)
    # the untuned 5000-1000 row alone already asks for about 0.86: the top cannot be the tuned 1000-2000 fit
    assert min(f["point"] for f in fits if f["isl"] == 5000) > 0.8
    assert "tp_alpha 0.43-1.0" in calibration.format_tp_fits(p)
    with pytest.raises(ValueError, match="outside the model's range"):
        calibration.fit_tp_alpha_ratio(p, 1000, 2000, 50.0)


def dataclass_alpha(p, alpha):
    import dataclasses

    return dataclasses.replace(p, tp_alpha=alpha)


def test_a_variation_moves_one_input_and_derives_the_engine_again():
    p = paper_preset(gpus_per_engine=4)
    assert band.varied(p, "tp_alpha", 1.0).c_tok == pytest.approx(paper_preset(gpus_per_engine=4, tp_alpha=1.0).c_tok)
    assert band.varied(p, "push_s_split", 40.0).push_s_split == 40.0
    low = band.varied(paper_preset(train_mfu_at={32: 0.3}), "train_mfu", 0.12)
    assert low.train_mfu == 0.12 and low.train_mfu_at is None  # the per-GPU-count MFU would override it
    labels = [label for label, _, _ in band.variations(p)]
    assert labels == [
        "tp_alpha 0.43",
        "tp_alpha 1",
        "push 5 s",
        "push 40 s",
        "batch-1 step 5 ms",
        "batch-1 step 20 ms",
        "train MFU 0.12",
        "train MFU 0.25",
    ]
    assert band.ranges_text(p) == "tp_alpha 0.43-1, push 5-40 s, batch-1 step 5-20 ms, train MFU 0.12-0.25"


def test_the_band_text_always_holds_the_nominal_value():
    assert band.band_text(1.42, {"lo": 1.3, "hi": 1.6}) == "1.42x (1.30-1.60x over the ranges)"
    assert band.band_text(1.7, {"lo": 1.3, "hi": 1.6}) == "1.70x (1.30-1.70x over the ranges)"


def test_the_plan_picks_the_fastest_steady_row_against_the_best_sync(monkeypatch):
    """A row faster than its bound (share above STEADY_SHARE_MAX) or with a requeue is not picked, however
    fast; the speedups divide by the best synchronous engine size."""
    p = planner.preset_for("qwen3-30b-a3b", 24, "H100", "8x4", "1000,0.6,2000", paper_preset())
    times = {(8, 4): 50.0, (8, 8): 80.0, (16, 4): 90.0, (16, 8): 60.0}
    bounds = {(8, 4): 50.0 * (STEADY_SHARE_MAX + 0.01), (8, 8): 70.0, (16, 4): 80.0, (16, 8): 55.0}
    monkeypatch.setattr(
        planner, "best_sync", lambda q, n: dict(s_per_rollout=120.0, gpus_per_engine=4, by_engine={4: 120.0, 8: 130.0})
    )

    def fake_simulate(q, schedule, rollouts, warmup=2):
        key = (q.train_gpus_split, q.gpus_per_engine)
        return dict(s_per_rollout=times[key], dropped_groups=0, requeued_groups=1 if key == (16, 8) else 0)

    monkeypatch.setattr(planner, "simulate", fake_simulate)
    monkeypatch.setattr(
        planner, "throughput_bound", lambda q, r, t, push: dict(bound_s=bounds[(q.train_gpus_split, q.gpus_per_engine)])
    )
    result = planner.plan(p, 2, "abort")
    pick = result["pick"]
    assert (pick["train_gpus"], pick["gpus_per_engine"]) == (8, 8) and pick["speedup"] == pytest.approx(1.5)
    text = planner.format_plan(result)
    assert "not steady" in text and "(4 GPUs) 120.0 s/rollout (4: 120.0 s, 8: 130.0 s)" in text
    bounds[(8, 8)] = 80.0 * STEADY_SHARE_MAX  # at the rule's edge: still steady
    assert planner.plan(p, 2, "abort")["pick"]["gpus_per_engine"] == 8
    bounds[(8, 8)], bounds[(16, 4)] = 80.0 * 1.021, 90.0 * 1.03  # all past their bound or requeued: no pick
    assert planner.plan(p, 2, "abort")["pick"] is None
    assert "pick: none" in planner.format_plan(planner.plan(p, 2, "abort"))


def test_the_plan_says_each_simulation_as_it_ends(monkeypatch):
    """plan takes minutes: a line per simulation, each printed before the next one starts, after a line
    with their count; without ``log`` it prints nothing and picks the same."""
    p = planner.preset_for("qwen3-30b-a3b", 24, "H100", "8x4", "1000,0.6,2000", paper_preset())
    events = []

    def fake_sync(q, n):
        events.append("simulate sync")
        return dict(s_per_rollout=120.0, gpus_per_engine=4, by_engine={4: 120.0, 8: 130.0})

    def fake_simulate(q, schedule, rollouts, warmup=2):
        events.append(f"simulate {q.train_gpus_split}x{q.gpus_per_engine}")
        return dict(s_per_rollout=100.0, dropped_groups=0, requeued_groups=0)

    monkeypatch.setattr(planner, "best_sync", fake_sync)
    monkeypatch.setattr(planner, "simulate", fake_simulate)
    monkeypatch.setattr(planner, "throughput_bound", lambda q, r, t, push: dict(bound_s=60.0))
    result = planner.plan(p, 2, "abort", log=events.append)
    assert events[0] == "[plan] 5 simulations of 10+ rollouts: the sync colocated baseline, then 4 splits"
    assert events[1] == "simulate sync" and events[2].startswith("[plan] 1/5 sync colocated: 120.0 s/rollout")
    splits = [(8, 4), (8, 8), (16, 4), (16, 8)]
    for i, (train, gpe) in enumerate(splits):  # each split's line comes right after its own simulation
        assert events[3 + 2 * i] == f"simulate {train}x{gpe}"
        assert events[4 + 2 * i].startswith(f"[plan] {i + 2}/5 train {train} GPUs, {gpe}-GPU engines: 100.0 s/rollout")
    assert len(events) == 3 + 2 * len(splits)
    events.clear()
    assert planner.plan(p, 2, "abort") == result and not [e for e in events if e.startswith("[plan]")]


def test_the_price_line_names_the_baseline_and_the_band(tmp_path):
    table = {
        "band_ranges": "tp_alpha 0.43-1, push 5-40 s",
        "picks": {},
        "prices": {
            "4x8|sync colocated": dict(s_per_rollout=315.9, speedup=1.0, gpus_per_engine=4),
            launch_table.key(4, 8, 1, 4, "2", "abort", "0"): dict(
                s_per_rollout=229.6,
                speedup=315.9 / 229.6,
                dropped=0,
                requeued=0,
                staleness_hist={"2": 640},
                band=[1.3, 1.5],
            ),
            launch_table.key(4, 8, 1, 4, "1", "abort", "0.1"): dict(
                s_per_rollout=313.9, speedup=315.9 / 313.9, dropped=0, requeued=0, staleness_hist={"1": 640}
            ),
        },
    }
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    line = launch_table.predict(4, 8, 1, 4, "2", "abort", "0", path)
    assert (
        "229.6 s/rollout, 1.38x sync colocated (1.30-1.50x over tp_alpha 0.43-1, push 5-40 s) at its best engine "
        "size (4 GPUs, 315.9 s/rollout)" in line
    )
    assert "oversampling 0.1" in launch_table.predict(4, 8, 1, 4, "1", "abort", "0.1", path)
    assert "no band precomputed" in launch_table.predict(4, 8, 1, 4, "1", "abort", "0.1", path)
    assert "no precomputed price" in launch_table.predict(4, 8, 1, 4, "1", "abort", "0", path)


def test_plan_runs_without_slime_and_summarises_group_errors():
    """The README's venv has no slime: plan (arithmetic on a model) runs, says in one line that it uses the
    stand-in for slime's Sample, and prints no per-group error lines."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SLIME_PATH")}
    env["PYTHONPATH"] = str(ROOT)
    probe = subprocess.run([sys.executable, "-c", "import slime"], env=env, capture_output=True, text=True)
    if probe.returncode == 0:
        pytest.skip("slime is installed in this interpreter itself: cannot take it off the path")
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "schedule_sim.py"),
            "plan",
            "--gpus",
            "16",
            "--batch",
            "4x4",
            "--lengths",
            "1000,0.6,2000",
            "--rollouts",
            "3",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert result.returncode == 0, result.stderr
    assert "pick: " in result.stdout and "sync colocated at its best engine size" in result.stdout
    notes = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(notes) == 1 and "stand-in for slime's Sample" in notes[0], result.stderr
    assert "in a row" not in result.stdout + result.stderr


def test_every_table_prices_a_setting_over_one_steady_window(monkeypatch):
    """The default command once averaged async K=2 from rollout 2 (222.1 s, 1.42x) where the frontier and the
    launcher averaged from rollout K + 2 = 4 (229.6 s, 1.38x). Now the default command's table and the frontier
    both take their window from schedules.steady_window: K + 2 warm-up rollouts (at least 2), then at least 10."""
    from schedsim import frontier, schedules

    assert schedules.steady_window("sync colocated", 12) == (12, 2)  # K = 0: the floor of 2 warm-up rollouts
    assert schedules.steady_window("async K=1", 12) == (13, 3)
    assert schedules.steady_window("async K=2", 12) == (14, 4)
    assert schedules.steady_window("async K=2", 20) == (20, 4)  # a longer run keeps its length
    calls = []

    def fake_simulate(q, schedule, rollouts=12, warmup=2, **kwargs):
        calls.append((schedule, rollouts, warmup))
        return dict(s_per_rollout=100.0)

    monkeypatch.setattr(schedules, "simulate", fake_simulate)
    monkeypatch.setattr(frontier, "simulate", fake_simulate)
    monkeypatch.setattr(frontier, "summary", lambda q, r, sync_s, warmup: dict(r))
    p = paper_preset()
    schedules.run_preset(p, 12)
    default_command = {schedule: (n, w) for schedule, n, w in calls}
    assert default_command == {s: schedules.steady_window(s, 12) for s in schedules.SCHEDULES}
    calls.clear()
    frontier.frontier(p, 12, ks=(1, 2, 4), pushes=("abort",), splits=((8, 4),), sync=dict(s_per_rollout=300.0))
    assert {schedule: (n, w) for schedule, n, w in calls} == {
        s: default_command[s] for s in ("async K=1", "async K=2", "async K=4")
    }
