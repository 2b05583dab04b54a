"""`epic-slime sweep`: loss modes x update depths x seeds on the embedded runtime.

    epic-slime sweep --config configs/local/sweep.yaml --policy-losses epic,grpo,dapo \
        --update-depths 1,8 --seeds 1,2 --output-dir runs/sweep [any `epic-slime train` flag ...]

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
    tail = rows[-max(1, len(rows) // 5):]
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


def _plots(out: Path, results: list[dict], k: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for res in results:
        if res["status"] != "ok":
            continue
        rows = [json.loads(ln) for ln in (Path(res["run_dir"]) / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        ax.plot([r["step"] for r in rows], [r[names.REWARD_MEAN] for r in rows], lw=1,
                label=f"{res['policy_loss']} D={res['update_depth']} s={res['seed']}")
    ax.set_xlabel("step"); ax.set_ylabel(names.REWARD_MEAN); ax.legend(fontsize=6); ax.grid(alpha=0.3)
    fig.tight_layout(); fig.savefig(out / "sweep_reward.png", dpi=90); plt.close(fig)

    groups: dict[tuple, list[float]] = {}
    for res in results:
        if res["status"] == "ok" and res.get(f"eval_mean@{k}_end") is not None:
            groups.setdefault((res["policy_loss"], res["update_depth"]), []).append(res[f"eval_mean@{k}_end"])
    fig, ax = plt.subplots(figsize=(6, 3.6))
    labels = [f"{m}\nD={d}" for m, d in groups]
    ax.bar(range(len(groups)), [statistics.fmean(v) for v in groups.values()],
           yerr=[statistics.pstdev(v) if len(v) > 1 else 0 for v in groups.values()])
    ax.set_xticks(range(len(groups)), labels, fontsize=7); ax.set_ylabel(f"final held-out mean@{k}")
    fig.tight_layout(); fig.savefig(out / "sweep_eval.png", dpi=90); plt.close(fig)


def _write_table(out: Path, results: list[dict], k: int) -> None:
    cols = ["policy_loss", "update_depth", "seed", "status", "reward_first", "reward_last20pct",
            f"eval_mean@{k}_start", f"eval_mean@{k}_end", "clipfrac_mean", "staleness_mean", "dropped", "loop_s"]
    with open(out / "comparison.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols + ["error"], extrasaction="ignore")
        w.writeheader()
        for r in results:
            w.writerow(r)

    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else ("" if v is None else str(v))

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in results]
    lines += ["", f"Mean over seeds (ok runs): final held-out mean@{k}, training reward of the last 20% of steps", "",
              "| policy_loss | update_depth | runs | eval end | reward last20% |", "|---|---|---|---|---|"]
    agg: dict[tuple, list[dict]] = {}
    for r in results:
        if r["status"] == "ok":
            agg.setdefault((r["policy_loss"], r["update_depth"]), []).append(r)
    for (m, d), rs in agg.items():
        ev = [r[f"eval_mean@{k}_end"] for r in rs if r[f"eval_mean@{k}_end"] is not None]
        lines.append(f"| {m} | {d} | {len(rs)} | {fmt(statistics.fmean(ev)) if ev else ''} | "
                     f"{fmt(statistics.fmean(r['reward_last20pct'] for r in rs))} |")
    (out / "comparison.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="epic-slime sweep", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy-losses", type=_csv_list(str), default=["epic", "grpo"])
    ap.add_argument("--update-depths", type=_csv_list(int), default=[1, 8])
    ap.add_argument("--seeds", type=_csv_list(int), default=[1])
    ap.add_argument("--output-dir", default="runs/sweep")
    args, train_args = ap.parse_known_args(argv)
    for bad in ("--policy-loss", "--update-depth", "--seed", "--output-dir"):
        if bad in train_args:
            print(f"epic-slime sweep: error: {bad} is set per run by the sweep; use the plural sweep flag",
                  file=sys.stderr)
            return 2
    from epic_slime.losses import LOSS_MODES

    unknown = [m for m in args.policy_losses if m not in LOSS_MODES]
    if unknown:
        print(f"epic-slime sweep: error: --policy-losses: unknown mode(s) {unknown}; known: {sorted(LOSS_MODES)}",
              file=sys.stderr)
        return 2
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = []
    try:   # validate every combination before running any
        for mode in args.policy_losses:
            for depth in args.update_depths:
                for seed in args.seeds:
                    run_dir = out / f"{mode}_D{depth}_s{seed}"
                    cfg = parse_config([*train_args, "--policy-loss", mode, "--update-depth", str(depth),
                                        "--seed", str(seed), "--output-dir", str(run_dir)], prog="epic-slime sweep")
                    plan.append((mode, depth, seed, run_dir, cfg))
    except ConfigError as e:
        print(f"epic-slime sweep: error: {e}", file=sys.stderr)
        return 2
    import ray

    from .driver import init_local_ray, run_training

    own_ray = not ray.is_initialized()
    if own_ray:   # one local Ray for the whole sweep (its start-up costs seconds per run)
        init_local_ray(num_cpus=max(c.num_rollout_workers for *_, c in plan) + 2)
    results = []
    try:
        _run_plan(plan, results, out, run_training)
    finally:
        if own_ray:
            ray.shutdown()
    k = plan[0][4].n_samples_per_eval_prompt
    _plots(out, results, k)
    (out / "sweep.json").write_text(json.dumps(results, indent=1))
    print(f"sweep: {sum(r['status'] == 'ok' for r in results)}/{len(results)} runs ok; table {out / 'comparison.md'}")
    return 0 if all(r["status"] == "ok" for r in results) else 1


def _run_plan(plan, results, out, run_training) -> None:
    for i, (mode, depth, seed, run_dir, cfg) in enumerate(plan):
        print(f"[sweep {i + 1}/{len(plan)}] {mode} D={depth} seed={seed} -> {run_dir}", flush=True)
        res = {"policy_loss": mode, "update_depth": depth, "seed": seed, "run_dir": str(run_dir)}
        try:
            run_training(cfg, reuse_ray=True)
            res.update(status="ok", **_summarise(run_dir, cfg.n_samples_per_eval_prompt))
        except Exception as e:   # one failed run must not lose the others: record it
            res.update(status="failed", error=f"{type(e).__name__}: {e}")
            traceback.print_exc()
        results.append(res)
        _write_table(out, results, cfg.n_samples_per_eval_prompt)   # after every run: nothing lost on a crash
