"""The driver's own schedule loops on a simulated clock: what asynchronous training saves at cluster scale.

Every speedup is against synchronous colocated on all GPUs at its own best engine size (4- or 8-GPU
engines, the sizes the asynchronous rows may use, under the same assumptions), and the headline and the
launcher's prices carry a band (bench/schedsim/band.py: tp_alpha over what the calibration allows, push
5-40 s, batch-1 step 5-20 ms, train MFU 0.12-0.25). None of the commands needs slime: without it the
simulator uses a stand-in for slime's Sample record (bench/schedsim/sample_standin.py) and says so;
the committed outputs are made with slime's own (PYTHONPATH=.:$SLIME_PATH).

commands:
  simulate (default)  the launcher's setting: schedule table, baseline, headline K=2 with its band,
                      sensitivity table at that setting, best line at the launcher's split
                          python bench/schedule_sim.py [--preset paper|verl|smoke|all] [--rollouts N]
                              [--no-sensitivity] [--json out.json] [--text bench/schedsim/paper_run.txt]
  frontier            the K x push mode x split table     python bench/schedule_sim.py frontier [--preset paper]
  plan                split and engine size for a model, GPUs, batch and lengths (the fastest steady row)
                          python bench/schedule_sim.py plan --model qwen3-30b-a3b --gpus 32 --gpu H100 --batch 64x8
                              --lengths 9000,0.6,16384 [--max-staleness 2] [--push-mode abort]
  calibrate           the engine model against published decode measurements, and the tp_alpha range
  launch-table        rebuild bench/schedsim/launch_predictions.json (after frontier) for the dry run
  predict / pick      the launcher's dry-run price / its split and engine size (read the table)
  verl                verl's 30B setting: phases vs verl's, this schedule at K = 1, 2, 4 vs its 1.72x
  verl-fit            refit the verl preset's unstated inputs to verl's phases
  measure-runtime     time the embedded runtime (needs the project's torch install, not slime)
  agentic             an agentic workload (multi-turn, tool calls with a latency per call): the frontier of K
                      against s/rollout with its band, against the best synchronous setup
                          python bench/schedule_sim.py agentic [--turns 4] [--tool-tokens 300]
                              [--tool-latency-median 5] [--tool-latency-sigma 1] [--prefix-cache hit|miss|SHARE]
                              [--mean-model-tokens 6000] [--no-band] [--agentic-out bench/schedsim/agentic_frontier.json]

The simulator is the package bench/schedsim/ (presets with their sources, engine model, stand-ins,
schedules, bound, report, frontier, planner, calibration, band); this file is its command line.

What runs for real (imported, called, not copied):
- ``epic_slime.slime.train.async_training_loop`` / ``sync_training_loop`` / ``push_initial_weights``
  with their real signature ``loop(args, rollout_manager, actor_model, num_rollout_per_epoch, get)``;
- the asynchronous rollout: ``epic_slime.slime.rollout.GroupStream`` (top-up to
  ``--async-groups-in-flight``, replacement of what the batch lacks, abort -> resubmission as
  prompt + partial response, stale requeue with its cap, empty-call version removal) and
  ``epic_slime.slime.rollout._collect`` (``collect_admitted_groups``, ``StalenessGate``,
  ``GroupLedger`` with its accounting check), ``trainer_version_for_rollout``,
  ``oversampling.groups_in_flight``; the synchronous rollout passes its batch through the real
  ``select_groups`` with a K = 0 gate as ``generate_on_policy_rollout`` does;
- slime's ``Sample`` class.

What is simulated: every coroutine runs on an asyncio event loop whose clock is virtual (its
selector advances the clock by the wait instead of sleeping), so ``await asyncio.sleep`` in the
real code costs simulated seconds. ``get`` (the loops' ``ray.get``) runs that loop until the
future is done. The RolloutManager is an actor serving one call at a time (an asyncio lock, FIFO,
as a Ray actor's default max_concurrency 1); the train group's ``update_weights`` first asks the
manager for the engines (``get_updatable_engines_and_lock``, queued behind e.g. generate(r+1)),
then pauses the engines in the preset's push mode (``abort``: every in-flight request returns with its
partial response, which re-prefills when resubmitted; ``in_place``: requests keep their KV and decode
on after the push), pushes for ``push_s`` and continues. slime's ``generate_and_rm_group`` is replaced by
a stand-in that sends each sample to a simulated SGLang engine; an engine advances its running
sequences every tick ``dt``: decode step time = t_base + c_tok x batch + c_kv x (sum of contexts),
admission while the KV cache holds the contexts and SGLang's reservation for their growth, retraction
of contexts that outgrow it during decode (re-queued, re-prefilled), prefill (prompt, or prompt +
partial response after an abort or a retraction) before decoding.
With an agentic workload (``Preset.agent``, bench/schedsim/agentic.py) the stand-in runs each sample as
several engine calls with a tool call between two: a latency drawn per call on the simulated clock, its
tokens appended (trained over, never decoded) and prefilled with the next turn as far as the radix cache
misses; the engine serves other requests meanwhile.
Evaluation and checkpoints are left out of both schedules (the same cost for both).

The collection poll of ``collect_admitted_groups`` is 0.05 s in slime; here it is ``poll_s``
(default 0.5 simulated s: at most that much latency per rollout, to keep the simulation fast).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from schedsim.sample_standin import use_standin_if_needed  # noqa: E402

from schedsim.bound import bound_for, throughput_bound  # noqa: E402,F401
from schedsim.calibration import calibrate, format_calibration, format_tp_fits  # noqa: E402,F401
from schedsim.frontier import KS, PUSH_MODES, best_sync, frontier, split_preset, write_frontier  # noqa: E402,F401
from schedsim.paper_run import default_run, sensitivity  # noqa: E402,F401
from schedsim.planner import format_plan, plan, preset_for  # noqa: E402,F401
from schedsim.presets import PRESETS, Preset, paper_preset, runtime_preset, smoke_preset, verl_preset  # noqa: E402,F401
from schedsim.report import best_line, format_table, length_deciles  # noqa: E402,F401
from schedsim.runtime import measure_runtime, runtime_validation  # noqa: E402,F401
from schedsim.schedules import SCHEDULES, driver_groups_in_flight, run_preset, simulate, split_heading  # noqa: E402,F401

_SKIP = (
    "trace",
    "pushes",
    "trains",
    "batches",
    "per_rollout_hist",
    "groups",
    "trained_keys",
    "trained_unfinished",
    "agent_stats",
)


class _GroupErrors(logging.Filter):
    """Counts the stream's per-group error lines (e.g. a group at its abort limit) instead of printing
    each: a sweep of many simulated runs would print hundreds; ``summary`` is one line."""

    def __init__(self):
        super().__init__()
        self.count, self.first = 0, None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            self.count += 1
            self.first = self.first or record.getMessage()
            return False
        return True

    def summary(self) -> str | None:
        if not self.count:
            return None
        return (
            f"note: {self.count} rollout-group error line(s) in the simulated runs were counted, not printed "
            f"(first: {self.first})"
        )


def main(argv=None) -> int:
    logging.getLogger("epic_slime").setLevel(logging.WARNING)
    errors = _GroupErrors()
    logging.getLogger("epic_slime.slime.stream.group_stream").addFilter(errors)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "command",
        nargs="?",
        default="simulate",
        choices=[
            "simulate",
            "frontier",
            "plan",
            "calibrate",
            "measure-runtime",
            "launch-table",
            "predict",
            "pick",
            "verl",
            "verl-fit",
            "agentic",
        ],
        help="see 'commands' above",
    )
    ap.add_argument("--preset", default="all", choices=[*PRESETS, "all"])
    ap.add_argument("--rollouts", type=int, default=12)
    ap.add_argument("--no-sensitivity", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--text", default=None, help="simulate: also write the printed report to this file")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default=str(ROOT / "bench" / "runtime_measurement.json"))
    ap.add_argument("--config", default=str(ROOT / "configs" / "local" / "default.yaml"))
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--gpus", type=int, default=32)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--batch", default="64x8", help="PROMPTSxSAMPLES")
    ap.add_argument("--lengths", default="9000,0.6,16384", help="MEAN,SIGMA,CAP of the response lengths")
    ap.add_argument("--max-staleness", type=int, default=2)
    ap.add_argument("--push-mode", default="abort", choices=PUSH_MODES)  # the launcher's default
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--actor-nodes", type=int, default=1)
    ap.add_argument("--gpus-per-engine", type=int, default=8)
    ap.add_argument("--k", default="2", help="predict / pick: the launcher's MAX_STALENESS (pick at 0: colocated)")
    ap.add_argument(
        "--oversample-ratio",
        default="0",
        help="plan / frontier / simulate: 0 (the launcher's default at K >= 2), Table 2's 0.1 caps groups in flight",
    )
    ap.add_argument(
        "--tp-alpha",
        type=float,
        default=None,
        help="calibrate / plan / frontier: engine speed-up gpus ** alpha (default: the fitted "
        "TP_ALPHA_FITTED; 1: the old linear scaling, for the sensitivity comparison)",
    )
    ag = ap.add_argument_group("agentic (bench/schedsim/agentic.py; defaults: the agentic preset's assumptions)")
    ag.add_argument("--turns", type=int, default=None, help="engine calls per trajectory (a tool call between two)")
    ag.add_argument("--tool-tokens", type=int, default=None, help="tokens each tool call appends (loss mask 0)")
    ag.add_argument("--tool-latency-median", type=float, default=None, help="seconds, median of the lognormal")
    ag.add_argument("--tool-latency-sigma", type=float, default=None, help="sigma of the lognormal (0: fixed)")
    ag.add_argument("--prefix-cache", default=None, help="hit | miss | the share of the prefix cached at the next turn")
    ag.add_argument("--mean-model-tokens", type=float, default=None, help="model tokens per trajectory (mean)")
    ag.add_argument("--no-band", action="store_true", help="agentic: skip the band (8 x more simulations)")
    ag.add_argument("--procs", type=int, default=1, help="agentic: simulations run in parallel (same results)")
    ag.add_argument("--agentic-out", default=None, help="agentic: the JSON written (default: the committed file)")
    a = ap.parse_args(argv)
    tp = {} if a.tp_alpha is None else {"tp_alpha": a.tp_alpha}
    if a.command in ("predict", "pick"):
        from schedsim import launch_table

        if not launch_table.TABLE.exists():
            print(
                ""
                if a.command == "pick"
                else f"# simulator: no price ({launch_table.TABLE.name} is missing: "
                "python bench/schedule_sim.py launch-table builds it)"
            )
            return 0
        if a.command == "pick":
            best = launch_table.pick(a.nodes, a.gpus_per_node, k=a.k)
            print("" if best is None else f"{best['actor_nodes']} {best['gpus_per_engine']}")
        else:
            print(
                launch_table.predict(
                    a.nodes, a.gpus_per_node, a.actor_nodes, a.gpus_per_engine, a.k, a.push_mode, a.oversample_ratio
                )
            )
        return 0
    note = use_standin_if_needed() if a.command != "calibrate" else None
    if note:
        print(note, file=sys.stderr)
    try:
        return _run(a, tp)
    finally:
        if errors.summary():
            print(errors.summary(), file=sys.stderr)


def _run(a, tp: dict) -> int:
    if a.command == "launch-table":
        from schedsim import launch_table

        launch_table.write(launch_table.build(a.rollouts))
        return 0
    if a.command == "agentic":
        return _agentic(a)
    if a.command == "verl-fit":
        from schedsim.verl import fit

        print(fit(log=print))
        return 0
    if a.command == "verl":
        from schedsim.verl import verl_comparison

        text = verl_comparison(min(a.rollouts, 8), log=lambda line: print(line, flush=True))
        print(text)
        (ROOT / "bench" / "schedsim" / "verl_preset.txt").write_text(text + "\n")
        return 0
    if a.command == "calibrate":
        p = paper_preset(**tp)
        print(format_calibration(calibrate(p)))
        print(format_tp_fits(p))
        return 0
    if a.command == "plan":
        base = PRESETS["paper"](oversample_ratio=float(a.oversample_ratio), **tp)
        p = preset_for(a.model, a.gpus, a.gpu, a.batch, a.lengths, base)
        result = plan(p, a.max_staleness, a.push_mode, a.gpus_per_node, a.rollouts, log=lambda s: print(s, flush=True))
        print(format_plan(result))
        if a.json:
            Path(a.json).write_text(json.dumps(result, indent=1))
        return 0
    if a.command == "frontier":
        p = PRESETS["paper" if a.preset == "all" else a.preset](oversample_ratio=float(a.oversample_ratio), **tp)
        out = (
            Path(a.out)
            if a.out != str(ROOT / "bench" / "runtime_measurement.json")
            else ROOT / "bench" / "schedsim" / f"frontier_{p.name.split(':')[0]}"
        )
        sync, rows = frontier(p, a.rollouts, log=lambda line: print(line, flush=True))
        print(write_frontier(p, sync, rows, out))
        return 0
    if a.command == "measure-runtime":
        r = measure_runtime(a.steps, Path(a.out), a.config)
        print(json.dumps({k: v for k, v in r.items() if not k.endswith("_samples")}, indent=1))
        return 0
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    report = {}
    if a.preset in ("paper", "all"):
        paper = default_run(a.rollouts, float(a.oversample_ratio), not a.no_sensitivity, say)
        report.update(
            paper=[{k: v for k, v in r.items() if k not in _SKIP} for r in paper["paper"]],
            sync=paper["sync"],
            headline=paper["headline"],
            best=paper["best"],
            sensitivity=paper.get("sensitivity"),
        )
    for name in ["smoke"] if a.preset == "all" else [a.preset] if a.preset != "paper" else []:
        p = PRESETS[name]()
        rows = run_preset(p, a.rollouts)
        say(
            f"== {p.name}: {p.rollout_batch_size} prompts x {p.n_samples}, D = {p.update_depth}, oversampling "
            f"{p.oversample_ratio}, mean response {rows[0]['mean_response']:.0f} tokens (cap {p.max_response_len}), "
            f"{split_heading(p)}, push {p.push_mode} =="
        )
        say(f"   source: {p.source}")
        say(format_table(p, rows))
        report[name] = [{k: v for k, v in r.items() if k not in _SKIP} for r in rows]
    measurement = ROOT / "bench" / "runtime_measurement.json"
    if measurement.exists() and a.preset == "all":
        m = json.loads(measurement.read_text())
        v = runtime_validation(m)
        say(
            f"== validation against the embedded runtime ({measurement.name}): measured async/sync "
            f"{v['measured']:.2f}, simulated {v['simulated']:.2f} ({v['simulated'] / v['measured'] - 1:+.0%}) =="
        )
        report["validation"] = v
    if a.text:
        Path(a.text).write_text("\n".join(lines) + "\n")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1, default=str))
    return 0


def _agentic(a) -> int:
    import dataclasses

    from schedsim import agentic_price

    changes = dict(
        turns=a.turns,
        tool_output_tokens=a.tool_tokens,
        tool_latency_median_s=a.tool_latency_median,
        tool_latency_sigma=a.tool_latency_sigma,
        prefix_cache=None if a.prefix_cache is None else _share_or_name(a.prefix_cache),
    )
    workload = dataclasses.replace(
        agentic_price.AGENTIC_WORKLOAD, **{k: v for k, v in changes.items() if v is not None}
    )
    kw = {} if a.mean_model_tokens is None else {"mean_response_len": a.mean_model_tokens}
    p = agentic_price.agentic_preset(workload, **kw)
    result = agentic_price.price(
        p, a.rollouts, band=not a.no_band, procs=a.procs, log=lambda line: print(line, flush=True)
    )
    out = Path(a.agentic_out) if a.agentic_out else agentic_price.OUT
    agentic_price.write(result, out)
    print(agentic_price.format_price(result))
    print(f"wrote {out}")
    return 0


def _share_or_name(text: str):
    try:
        return float(text)
    except ValueError:
        return text


if __name__ == "__main__":
    raise SystemExit(main())
