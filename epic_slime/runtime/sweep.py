"""`epic-slime sweep`: loss modes x update depths x seeds on the embedded runtime.

    epic-slime sweep --config configs/local/sweep.yaml --policy-losses epic,grpo,dapo
        --update-depths 1,8 --seeds 1,2 --output-dir runs/sweep [any `epic-slime train` flag ...]

Every `epic-slime train` flag (see `epic-slime train --help`) is passed to each run, except
--policy-loss, --update-depth, --seed and --output-dir, which the sweep sets per run.

Each combination is an ordinary `train` run in <output-dir>/<mode>_D<depth>_s<seed>; then
`comparison.md` / `comparison.csv` (one row per run, plus the mean over seeds) and
`sweep_reward.png` / `sweep_eval.png` are written. A run that fails is recorded as failed in the
table (with its error) and the sweep goes on.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import traceback
from pathlib import Path

from epic_slime import metric_names as names

from .config import ConfigError, parse_config


def _csv_list(kind):
    def parse(text: str):
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"empty list: {text!r}")
        return [kind(x) for x in items]

    return parse


def _summarise(run_dir: Path, k: int) -> dict:
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    key = f"eval/heldout/mean@{k}"
    evals = sorted(((r["eval/version"], r[key]) for r in rows if key in r))
    tail = rows[-max(1, len(rows) // 5) :]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "reward_first": rows[0][names.REWARD_MEAN],
        "reward_last20pct": statistics.fmean(r[names.REWARD_MEAN] for r in tail),
        f"eval_mean@{k}_start": evals[0][1] if evals else None,
        f"eval_mean@{k}_end": evals[-1][1] if evals else None,
        "clipfrac_mean": statistics.fmean(r[names.CLIPFRAC] for r in rows),
        "staleness_mean": statistics.fmean(r[names.STALENESS_MEAN] for r in rows),
        "dropped": summary["accounting/dropped"],
        "loop_s": summary["loop_s"],
    }


def mean_band(curves: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    """Per step (over the common length): mean, min and max across seeds."""
    n = min(len(c) for c in curves)
    cols = [[c[i] for c in curves] for i in range(n)]
    return [statistics.fmean(x) for x in cols], [min(x) for x in cols], [max(x) for x in cols]


def _plots(out: Path, results: list[dict], k: int, smoke: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plots import DPI, FIGSIZE, ema, ema_span

    ok = [r for r in results if r["status"] == "ok"]
    combos: dict[tuple, list[dict]] = {}
    for res in ok:
        combos.setdefault((res["policy_loss"], res["update_depth"]), []).append(res)
    note = " (smoke test: too short to compare modes)" if smoke else ""
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    fig, ax = plt.subplots(figsize=FIGSIZE)
    for i, ((mode, depth), runs) in enumerate(combos.items()):
        color = colors[i % len(colors)]
        curves = []
        for res in runs:
            rows = [
                json.loads(ln) for ln in (Path(res["run_dir"]) / "metrics.jsonl").read_text().splitlines() if ln.strip()
            ]
            curves.append([r[names.REWARD_MEAN] for r in rows])
        mean, lo, hi = mean_band(curves)
        steps = list(range(1, len(mean) + 1))
        ax.fill_between(steps, ema(lo, ema_span(len(lo))), ema(hi, ema_span(len(hi))), color=color, alpha=0.15)
        ax.plot(steps, mean, color=color, alpha=0.25, lw=1)
        ax.plot(
            steps,
            ema(mean, ema_span(len(mean))),
            color=color,
            lw=2.2,
            label=f"{mode}, D={depth} (mean of {len(runs)} seed{'s' * (len(runs) > 1)}, EMA; band: min-max)",
        )
    if combos:
        ax.legend(fontsize=10)
    ax.set_title(f"Training reward by loss mode and update depth{note}\n{out.name}", fontsize=13)
    ax.set_xlabel("rollout step", fontsize=11)
    ax.set_ylabel("mean reward of the step's samples (0..1)", fontsize=11)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "sweep_reward.png", dpi=DPI)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=FIGSIZE)
    key = f"eval_mean@{k}_end"
    scored = {c: [r[key] for r in runs if r.get(key) is not None] for c, runs in combos.items()}
    scored = {c: v for c, v in scored.items() if v}
    for i, ((mode, depth), values) in enumerate(scored.items()):
        ax.bar(
            i,
            statistics.fmean(values),
            color=colors[i % len(colors)],
            alpha=0.7,
            yerr=statistics.stdev(values) if len(values) > 1 else 0,
            capsize=6,
        )
        ax.scatter([i] * len(values), values, color="black", zorder=3, s=18)
        ax.annotate(
            f"{statistics.fmean(values):.3f}",
            (i, statistics.fmean(values)),
            xytext=(8, 4),
            textcoords="offset points",
            fontsize=10,
        )
    ax.set_xticks(range(len(scored)), [f"{m}\nD={d}" for m, d in scored], fontsize=10)
    ax.set_title(
        f"Final held-out mean@{k} (bar: mean over seeds, error bar: std, dots: seeds){note}\n{out.name}", fontsize=13
    )
    ax.set_ylabel(f"held-out mean@{k} at the last step", fontsize=11)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out / "sweep_eval.png", dpi=DPI)
    plt.close(fig)


SMOKE_STEPS = 20  # shorter runs cannot separate loss modes: the output says so


def smoke_note(cfg) -> str | None:
    if cfg.num_rollout >= SMOKE_STEPS:
        return None
    return (
        f"Smoke test: {cfg.num_rollout} steps per run (< {SMOKE_STEPS}) checks that every combination runs; "
        "the numbers cannot tell the modes apart. Compare with configs/local/sweep.yaml (80 steps)."
    )


def _write_table(out: Path, results: list[dict], k: int, note: str | None = None) -> None:
    cols = [
        "policy_loss",
        "update_depth",
        "seed",
        "status",
        "reward_first",
        "reward_last20pct",
        f"eval_mean@{k}_start",
        f"eval_mean@{k}_end",
        "clipfrac_mean",
        "staleness_mean",
        "dropped",
        "loop_s",
    ]
    with open(out / "comparison.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols + ["error"], extrasaction="ignore")
        w.writeheader()
        for r in results:
            w.writerow(r)

    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else ("" if v is None else str(v))

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in results]
    lines += [
        "",
        f"Mean over seeds (ok runs): final held-out mean@{k}, training reward of the last 20% of steps",
        "",
        "| policy_loss | update_depth | runs | eval end | reward last20% |",
        "|---|---|---|---|---|",
    ]
    agg: dict[tuple, list[dict]] = {}
    for r in results:
        if r["status"] == "ok":
            agg.setdefault((r["policy_loss"], r["update_depth"]), []).append(r)
    for (m, d), rs in agg.items():
        ev = [r[f"eval_mean@{k}_end"] for r in rs if r[f"eval_mean@{k}_end"] is not None]
        lines.append(
            f"| {m} | {d} | {len(rs)} | {fmt(statistics.fmean(ev)) if ev else ''} | "
            f"{fmt(statistics.fmean(r['reward_last20pct'] for r in rs))} |"
        )
    if note:
        lines = [f"> {note}", ""] + lines
    (out / "comparison.md").write_text("\n".join(lines) + "\n")


def build_sweep_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="epic-slime sweep",
        description=__doc__,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--policy-losses",
        type=_csv_list(str),
        default=["epic", "grpo"],
        metavar="MODE,...",
        help="comma-separated loss modes, one run each (default: epic,grpo)",
    )
    ap.add_argument(
        "--update-depths",
        type=_csv_list(int),
        default=None,
        metavar="D,...",
        help="comma-separated update depths (default: the config's update_depth)",
    )
    ap.add_argument(
        "--seeds",
        type=_csv_list(int),
        default=[1],
        metavar="S,...",
        help="comma-separated seeds; plots show their mean and spread (default: 1)",
    )
    ap.add_argument(
        "--output-dir",
        default="runs/sweep",
        help="sweep folder: one run directory per combination, comparison.md / .csv, plots (default: runs/sweep)",
    )
    return ap


def main(argv: list[str]) -> int:
    args, train_args = build_sweep_parser().parse_known_args(argv)
    for bad in ("--policy-loss", "--update-depth", "--seed", "--output-dir"):
        if bad in train_args:
            print(
                f"epic-slime sweep: error: {bad} is set per run by the sweep; use the plural sweep flag",
                file=sys.stderr,
            )
            return 2
    from .loss_flags import stored_table  # the registry's names without torch (a refusal answers at once)

    modes = stored_table()["modes"]
    unknown = [m for m in args.policy_losses if m not in modes]
    if unknown:
        print(f"epic-slime sweep: error: --policy-losses: unknown mode(s) {unknown}; known: {modes}", file=sys.stderr)
        return 2
    out = Path(args.output_dir)
    plan = []
    try:  # validate every combination before running any
        parse_config(list(train_args), prog="epic-slime sweep", quick=True)
        base = parse_config(list(train_args), prog="epic-slime sweep")
        depths = args.update_depths or [base.update_depth]
        for mode in args.policy_losses:
            for depth in depths:
                for seed in args.seeds:
                    run_dir = out / f"{mode}_D{depth}_s{seed}"
                    cfg = parse_config(
                        [
                            *train_args,
                            "--policy-loss",
                            mode,
                            "--update-depth",
                            str(depth),
                            "--seed",
                            str(seed),
                            "--output-dir",
                            str(run_dir),
                        ],
                        prog="epic-slime sweep",
                    )
                    plan.append((mode, depth, seed, run_dir, cfg))
        from .run_files import existing_run

        taken = [str(c.output_dir) for *_, c in plan if existing_run(c) and not (c.overwrite or c.load)]
        if taken:
            raise ConfigError(
                f"run directories already hold runs: {', '.join(taken)}; pass --overwrite to "
                "replace them, or choose another --output-dir"
            )
    except ConfigError as e:
        print(f"epic-slime sweep: error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    note = smoke_note(base)
    print(
        f"sweep: {len(plan)} runs: modes {','.join(args.policy_losses)} x update depths "
        f"{','.join(map(str, depths))} x seeds {','.join(map(str, args.seeds))}, {base.num_rollout} steps each"
        + (f"\nsweep: note: {note}" if note else ""),
        flush=True,
    )
    import ray

    from .driver import run_training
    from .local_ray import init_local_ray

    own_ray = not ray.is_initialized()
    if own_ray:  # one local Ray for the whole sweep (its start-up costs seconds per run)
        init_local_ray(num_cpus=max(c.num_rollout_workers for *_, c in plan) + 2)
    results = []
    try:
        _run_plan(plan, results, out, run_training, note)
    finally:
        if own_ray:
            ray.shutdown()
    k = plan[0][4].n_samples_per_eval_prompt
    _plots(out, results, k, smoke=note is not None)
    (out / "sweep.json").write_text(json.dumps(results, indent=1))
    print(
        f"sweep: {sum(r['status'] == 'ok' for r in results)}/{len(results)} runs ok; table {out / 'comparison.md'}"
        + (" (smoke test: see its note)" if note else "")
    )
    return 0 if all(r["status"] == "ok" for r in results) else 1


def _run_plan(plan, results, out, run_training, note=None) -> None:
    for i, (mode, depth, seed, run_dir, cfg) in enumerate(plan):
        print(f"[sweep {i + 1}/{len(plan)}] {mode} D={depth} seed={seed} -> {run_dir}", flush=True)
        res = {"policy_loss": mode, "update_depth": depth, "seed": seed, "run_dir": str(run_dir)}
        try:
            run_training(cfg, reuse_ray=True)
            res.update(status="ok", **_summarise(run_dir, cfg.n_samples_per_eval_prompt))
        except Exception as e:  # one failed run must not lose the others: record it
            res.update(status="failed", error=f"{type(e).__name__}: {e}")
            traceback.print_exc()
        results.append(res)
        _write_table(out, results, cfg.n_samples_per_eval_prompt, note)  # after every run: nothing lost on a crash
