"""Writes the generated tables of docs/results.md from the committed output files.

    python bench/make_results.py            # rewrite the generated sections in place
    python bench/make_results.py --check    # exit 1 if docs/results.md is not what this writes

A generated section sits between two markers, and only its inside is rewritten:

    <!-- generated: NAME (python bench/make_results.py) -->
    ...
    <!-- end generated: NAME -->

Each table names its source file in a line under it, so every figure in it has a committed file behind it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = REPO / "docs" / "results.md"
SIM = HERE / "schedsim"
BEGIN = re.compile(r"^<!-- generated: (\w+) \(python bench/make_results\.py\) -->$", re.M)

sys.path.insert(0, str(HERE))
from async_pairs import read_pairs, summary  # noqa: E402
from results_agent import agent_runtime  # noqa: E402
from results_graded import graded  # noqa: E402
from runtime_cpu_pairs import read_summary  # noqa: E402


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _source(*paths: Path) -> str:
    return "Source: " + ", ".join(f"`{p.relative_to(REPO)}`" for p in paths) + "."


def runtime_timing() -> list[str]:
    path = HERE / "runtime_measurement.json"
    m = json.loads(_read(path))
    rate = m["trained_per_s"]
    return [
        "| quantity | value |",
        "|---|---|",
        f"| trainer step, {m['rollout_batch_size'] * m['n_samples_per_prompt']} samples, D = {m['update_depth']}, "
        f"one thread | {m['train_step_s']:.2f} s |",
        f"| rollout request, {m['rollout_batch_size'] * m['n_samples_per_prompt'] // m['num_rollout_workers']} "
        f"samples | {m['gen_request_s']:.2f} s |",
        f"| mean response | {m['mean_response_len']:.1f} tokens |",
        f"| trained samples/s, async (K = {m['max_staleness']}) / sync | {rate['async']:.0f} / {rate['sync']:.0f} |",
        f"| async / sync | {m['measured_async_over_sync']:.2f} |",
        "",
        f"{m['steps']} steps of `{m['config']}` on {m['cores']} cores. {_source(path)} Command: `{m['command']}`.",
    ]


PAIR_RUN = re.compile(r"^== pair (\d+) (old|new) \S+ load (\S+)$")
RATE = re.compile(r"^(async|sync)\s*:\s+(\d+\.\d) trained samples/s")


def async_pairs() -> list[str]:
    path = HERE / "async_pairs.log"
    text = _read(path)
    rates: dict[tuple[str, int], dict[str, float]] = {}
    current = None
    for line in text.splitlines():
        if m := PAIR_RUN.match(line):
            current = (m[2], int(m[1]))
            rates[current] = {"load": float(m[3])}
        elif (m := RATE.match(line)) and current:
            rates[current][m[1]] = float(m[2])
    pairs = read_pairs(text)
    s = summary(pairs)
    head = text.splitlines()[0].lstrip("# ")
    lines = [
        "| pair | tree | load at start | async samples/s | sync samples/s | async / sync |",
        "|---|---|---|---|---|---|",
    ]
    for i in range(s["pairs"]):
        for tree in ("old", "new"):
            r = rates[(tree, i + 1)]
            lines.append(
                f"| {i + 1} | {tree} | {r['load']:.2f} | {r['async']:.1f} | {r['sync']:.1f} | {pairs[tree][i]:.2f} |"
            )
    diffs = ", ".join(f"{d:+.2f}" for d in s["diffs"])
    lines += [
        "",
        f"Median async / sync: new {s['new_median']:.2f} ({s['new_range'][0]:.2f}-{s['new_range'][1]:.2f}), "
        f"old {s['old_median']:.2f} ({s['old_range'][0]:.2f}-{s['old_range'][1]:.2f}); new - old per pair {diffs}.",
        f"Trees: {head}. {_source(path)} Summary: `python bench/async_pairs.py bench/async_pairs.log`.",
    ]
    return lines


CPU_CALLS = {
    "train_step": "trainer step, one batch (512 samples, D = 8)",
    "generate": "rollout worker request (256 samples)",
    "loss": "loss, one minibatch",
    "loss_no_metrics": "loss without metrics, one minibatch",
    "metrics": "loss metrics, one minibatch",
    "select_batch": "batch selection",
}


def runtime_cpu() -> list[str]:
    path = HERE / "runtime_cpu_pairs.log"
    s = read_summary(_read(path))
    lines = ["| call | old ms | new ms | new / old per pair |", "|---|---|---|---|"]
    for call, label in CPU_CALLS.items():
        c = s["calls"][call]
        ratios = ", ".join(f"{r:.3f}" for r in c["ratios"])
        digits = 0 if c["old"] >= 10 else 2
        lines.append(f"| {label} | {c['old']:.{digits}f} | {c['new']:.{digits}f} | {ratios} |")
    m = s["calls"]["metrics"]
    per_step = (m["new"] - m["old"]) * 8
    lines += [
        "",
        f"CPU time per call, median over {s['pairs']} ABBA pairs, old `{s['old']}` against new `{s['new']}`, "
        f"same inputs: {s['same_inputs']}. The three new metrics take {s['metrics_new']:.2f} ms a minibatch; "
        f"8 minibatches make the metrics' increase {per_step:.1f} ms a step, "
        f"{100 * per_step / s['calls']['train_step']['old']:.2f}% of the step.",
        f"{_source(path)} Summary: `python bench/runtime_cpu_pairs.py --read bench/runtime_cpu_pairs.log`.",
    ]
    return lines


PROBE_RUN = re.compile(r"^== pair (\d+) (\S+) \S+ load (\S+)$")
PROBE_FIELDS = {
    "held": re.compile(r"worker_held_by_budget (\d+), request_cut_by_budget (\d+)"),
    "waits": re.compile(r"^start-order waits: (\d+) "),
    "idle": re.compile(r"^trainer idle between steps: median (\d+\.\d) ms"),
    "cpu": re.compile(r"^CPU per step, steps 2-\d+: trainer (\d+\.\d) ms, workers (\d+\.\d) ms, driver (\d+\.\d) ms"),
    "buffered": re.compile(r"batches buffered \[(\d+\.\d)\]"),
}


def stall_probe() -> list[str]:
    path = HERE / "runtime_stall_probe.log"
    runs: list[dict] = []
    for line in _read(path).splitlines():
        if m := PROBE_RUN.match(line):
            runs.append({"pair": m[1], "tree": "old" if "old" in m[2] else "new", "load": m[3]})
        elif runs:
            for name, pattern in PROBE_FIELDS.items():
                if m := pattern.search(line):
                    runs[-1][name] = m.groups()
    lines = [
        "| pair | tree | load | CPU per step: trainer / workers / driver, ms | trainer idle between steps, median ms "
        "| workers held by the budget | requests cut by the budget | start-order waits | batches buffered at step end |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['pair']} | {r['tree']} | {float(r['load']):.1f} | {' / '.join(r['cpu'])} | {r['idle'][0]} "
            f"| {r['held'][0]} | {r['held'][1]} | {r['waits'][0]} | {r['buffered'][0]} |"
        )
    lines += ["", f"Async runs of 20 steps, ABBA. {_source(path)} Command: `python bench/runtime_stall_probe.py`."]
    return lines


def _paper_run_lines() -> dict[str, str]:
    lines = _read(SIM / "paper_run.txt").splitlines()
    found = {}
    for key, prefix in (("headline", "headline: "), ("best", "best at the launcher's split: "), ("base", "baseline: ")):
        (found[key],) = [line[len(prefix) :] for line in lines if line.startswith(prefix)]
    return found


def _frontier_row(rows: list[dict], k: int, push: str, split: str, gpe: int) -> dict:
    (row,) = [r for r in rows if (r["schedule"], r["push"], r["split"], r["gpe"]) == (f"async K={k}", push, split, gpe)]
    return row


def schedules() -> list[str]:
    """The paper preset's prices: the frontier's rows (one steady-state rule, bench/schedsim/schedules.py's
    steady_window, so the default command, the frontier and the launcher agree) and the launcher's bands."""
    front_path, launch_path = SIM / "frontier_paper.json", SIM / "launch_predictions.json"
    front = json.loads(_read(front_path))
    prices = json.loads(_read(launch_path))["prices"]
    base = f"{front['sync_colocated_gpus_per_engine']}-GPU engines"
    lines = [
        "| setting | split, engine | s per rollout | x sync | band over the ranges | share of bound |",
        "|---|---|---|---|---|---|",
        f"| sync colocated (the baseline) | all 32, {base} | {front['sync_colocated_s']:.1f} | 1.00 | | |",
    ]
    sync8 = front["sync_colocated_by_engine"]["8"]
    lines.append(
        f"| sync colocated | all 32, 8-GPU engines | {sync8:.1f} | {front['sync_colocated_s'] / sync8:.2f} | | |"
    )
    t1 = prices["4x8|train 2|engine 8|K 0|abort|oversample 0"]
    lines.append(
        f"| sync split (Table 1 launchers) | 16 : 16, 8-GPU engines | {t1['s_per_rollout']:.1f} | {t1['speedup']:.2f} | | |"
    )
    for k, push, split, gpe, label in (
        (2, "abort", "24:8", 4, "async K = 2, abort (the launcher's default)"),
        (4, "in_place", "24:8", 4, "async K = 4, in place (best at the launcher's split)"),
        (2, "abort", "16:16", 8, "async K = 2, abort"),
    ):
        r = _frontier_row(front["rows"], k, push, split, gpe)
        name = f"4x8|train {int(split.split(':')[1]) // 8}|engine {gpe}|K {k}|{push}|oversample 0"
        band = prices.get(name, {}).get("band")
        band_text = f"{min(band[0], r['ratio']):.2f}-{max(band[1], r['ratio']):.2f}x" if band else ""
        lines.append(
            f"| {label} | {split.replace(':', ' : ')}, {gpe}-GPU engines | {r['s']:.1f} | {r['ratio']:.2f} "
            f"| {band_text} | {r['share'] * 100:.0f}% |"
        )
    run = _paper_run_lines()
    k2 = _frontier_row(front["rows"], 2, "abort", "24:8", 4)
    if not run["headline"].split(": ")[-1].startswith(f"{k2['ratio']:.2f}x"):
        # one setting, one price: the default command and the frontier / launcher share steady_window
        raise ValueError(
            f"paper_run.txt prices the launcher's K = 2 at {run['headline']!r}, the frontier at {k2['ratio']:.2f}x: "
            "rerun both (python bench/schedule_sim.py --text bench/schedsim/paper_run.txt; ... frontier; ... launch-table)"
        )
    lines += [
        "",
        f"The default command prints `headline: {run['headline']}` and `best at the launcher's split: {run['best']}`.",
        _source(front_path, launch_path, SIM / "paper_run.txt"),
    ]
    verl_path = SIM / "verl_preset.txt"
    verl = _read(verl_path)
    lines += ["", "| verl's setting | step | x sync |", "|---|---|---|"]
    for k in (1, 2, 4):
        m = re.search(rf"async K={k} abort\s*: step ([\d.]+) s, ([\d.]+)x \(verl ([\d.]+)x per step", verl)
        lines.append(f"| async K = {k}, abort | {m[1]} s | {m[2]}x (verl: {m[3]}x per step) |")
    lines += ["", _source(verl_path)]
    return lines


def _decile_cell(d: dict) -> str:
    lag = "-" if d["mean_lag"] != d["mean_lag"] else f"{d['mean_lag']:.2f}"
    return f"{lag} ({d['requeued']}, {d['dropped']})"


def agentic() -> list[str]:
    """The agentic preset's frontier (bench/schedsim/agentic_price.py): each K's fastest row against the
    best synchronous setup with its band, the per-decile lag / requeues / drops, the tool latency's effect."""
    path = SIM / "agentic_frontier.json"
    a = json.loads(_read(path))
    w, best = a["workload"], a["best_sync"]
    lines = [
        "| K | push, split | s per rollout | x best sync | band over the ranges | dropped | requeued | over K "
        "| trajectories over 2+ versions | tool calls, tool s per trajectory |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| 0 | {best['name']} (the best synchronous setup) | {best['s_per_rollout']:.1f} | 1.00 | | | | | | |",
    ]
    for e in a["frontier"]:
        r, band, ag = e["row"], e.get("band"), e["row"]["agent"]
        band_text = f"{band['lo']:.2f}-{band['hi']:.2f}x" if band else ""
        lines.append(
            f"| {e['k']} | {r['push']}, {r['split'].replace(':', ' : ')} with {r['gpe']}-GPU engines | {r['s']:.1f} "
            f"| {r['ratio']:.2f} | {band_text} | {r['dropped']} | {r['requeued']} | {r['over_k']} "
            f"| {ag['spanning_share'] * 100:.0f}% | {ag['tool_calls']:.1f}, {ag['tool_s']:.1f} s |"
        )
    others = ", ".join(f"{name} {s:.1f} s" for name, s in a["sync"].items() if name != best["name"])
    lines += [
        "",
        f"Other synchronous setups: {others}.",
        "",
        "Mean staleness per response-length decile (requeued, dropped) of the rows above:",
        "",
        "| decile | " + " | ".join(f"K = {e['k']}" for e in a["frontier"]) + " |",
        "|---|" + "---|" * len(a["frontier"]),
    ]
    for i in range(len(a["frontier"][0]["row"]["deciles"])):
        cells = [_decile_cell(e["row"]["deciles"][i]) for e in a["frontier"]]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    if a.get("tool_latency_sensitivity"):
        lines += ["", "| tool latency median | best synchronous setup | its s per rollout | K = 2 s per rollout | x |"]
        lines.append("|---|---|---|---|---|")
        lines.append(
            f"| {w['tool_latency_median_s']:g} s (the preset) | {best['name']} | {best['s_per_rollout']:.1f} "
            f"| {[e['row']['s'] for e in a['frontier'] if e['k'] == 2][0]:.1f} "
            f"| {[e['row']['ratio'] for e in a['frontier'] if e['k'] == 2][0]:.2f} |"
        )
        for t in a["tool_latency_sensitivity"]:
            lines.append(
                f"| {t['median_s']:g} s | {t['best_sync']} | {t['sync_s']:.1f} | {t['s']:.1f} | {t['ratio']:.2f} |"
            )
    lines += [
        "",
        f"Workload: {a['batch']} trajectories, {w['turns']} turns ({w['turns'] - 1} tool calls), "
        f"{w['tool_output_tokens']} tool tokens per call, tool latency lognormal with median "
        f"{w['tool_latency_median_s']:g} s and sigma {w['tool_latency_sigma']:g}, prefix cache {w['prefix_cache']}, "
        f"mean {a['mean_model_tokens']:.0f} model tokens per trajectory, cap {a['max_response_len']} counting tool tokens, "
        f"{a['total_gpus']} GPUs. Band: {a['band_ranges']}, at K = 2 and at the fastest K.",
        f"{_source(path)} Command: `{a['command']}`.",
    ]
    return lines


LADDER_CELLS = ("d8", "d16", "d32", "d64", "d8_k2", "d8_k8")


def _mark(diff: dict | None) -> str:
    return " *" if diff and (diff["low"] > 0 or diff["high"] < 0) else ""


def ladder() -> list[str]:
    path = REPO / "docs" / "study" / "ladder" / "summary.json"
    cells = json.loads(_read(path))["ladder"]["cells"]
    methods = list(cells[LADDER_CELLS[0]]["methods"])
    lines = [
        "| method | " + " | ".join(f"D = {cells[c]['D']}, K = {cells[c]['K']}" for c in LADDER_CELLS) + " |",
        "|---|" + "---|" * len(LADDER_CELLS),
    ]
    for method in methods:
        row = []
        for c in LADDER_CELLS:
            m = cells[c]["methods"][method]
            row.append(f"{m['test_last_mean']:.3f} ± {m['test_last_sd']:.3f}{_mark(m.get('diff_last_vs_epic'))}")
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    lines += ["", _source(path)]
    return lines


STRESS_CELLS = {
    "lr1": "lr1",
    "lr2": "lr2",
    "lr4": "lr4",
    "lr8": "lr8",
    "lr16": "lr16",
    "lr4_d32": "lr4, D 32",
    "lr4_d128": "lr4, D 128",
    "lr4_k8": "lr4, K 8",
    "lr4_k16": "lr4, K 16",
}


def stress() -> list[str]:
    """Test mean@8 at the last checkpoint, mean over seeds; **B** where the cell breaks by the rule fixed
    before the runs, `*` where the paired 95% interval to EPIC excludes 0."""
    path = REPO / "docs" / "study" / "stress" / "summary.json"
    cells = json.loads(_read(path))["stress"]["cells"]
    methods = list(cells["lr1"]["methods"])
    lines = ["| method | " + " | ".join(STRESS_CELLS.values()) + " |", "|---|" + "---|" * len(STRESS_CELLS)]
    for method in methods:
        row = []
        for c in STRESS_CELLS:
            m = cells[c]["methods"][method]
            broke = "**B** " if m["breaks"] else ""
            row.append(f"{broke}{m['test_last_mean']:.3f}{_mark(m.get('diff_vs_epic'))}")
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    lines += ["", _source(path)]
    return lines


SECTIONS = {
    "runtime_timing": runtime_timing,
    "async_pairs": async_pairs,
    "runtime_cpu": runtime_cpu,
    "stall_probe": stall_probe,
    "schedules": schedules,
    "agentic": agentic,
    "agent_runtime": agent_runtime,
    "graded": graded,
    "ladder": ladder,
    "stress": stress,
}


def render(text: str) -> str:
    """``text`` with every generated section's inside rewritten; an unknown or unclosed section is an error."""
    out, pos, seen = [], 0, []
    for begin in BEGIN.finditer(text):
        name = begin[1]
        if name not in SECTIONS:
            raise ValueError(f"docs/results.md: unknown generated section {name!r} (known: {sorted(SECTIONS)})")
        end_marker = f"<!-- end generated: {name} -->"
        end = text.find(end_marker, begin.end())
        if end < 0:
            raise ValueError(f"docs/results.md: generated section {name!r} has no {end_marker!r}")
        out += [text[pos : begin.end()], "\n", "\n".join(SECTIONS[name]()), "\n"]
        pos = end
        seen.append(name)
    missing = sorted(set(SECTIONS) - set(seen))
    if missing:
        raise ValueError(f"docs/results.md: no marker for the generated sections {missing}")
    return "".join(out) + text[pos:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/results.md is not current")
    a = ap.parse_args(argv)
    current = _read(RESULTS)
    fresh = render(current)
    if a.check:
        if fresh != current:
            print("docs/results.md is not current: run python bench/make_results.py", file=sys.stderr)
            return 1
        return 0
    RESULTS.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
