"""Asynchronous vs synchronous rollout on the embedded runtime, same config, same machine.

    python bench/async_bench.py [--steps 40] [--memory-steps 400] [--config configs/local/default.yaml]

Runs the config twice (--rollout-mode async, then sync) for --steps steps and prints trained and
generated samples/s of each and their ratio (async / sync). Throughput is measured over the
training loop only (from the first step's start to the last step's end, read from metrics.jsonl:
Ray start-up, warm start and the final evaluation are excluded). With --memory-steps N > 0 it
then runs one long asynchronous run with a small batch and prints the driver's RSS at the first,
middle and last step (memory must stay flat). Extra arguments go to `epic-slime train`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from epic_slime.runtime.config import parse_config  # noqa: E402
from epic_slime.runtime.driver import run_training  # noqa: E402


def _rows(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def _throughput(rows: list[dict]) -> dict:
    # skip the first step (pipeline fill) so both modes are compared in steady state
    first, last = rows[0], rows[-1]
    seconds = last["time/elapsed_s"] - first["time/elapsed_s"]
    trained = last["accounting/trained"] - first["accounting/trained"]
    generated = last["accounting/generated"] - first["accounting/generated"]
    return {
        "seconds": seconds,
        "trained_per_s": trained / seconds,
        "generated_per_s": generated / seconds,
        "staleness_mean": sum(r["rollout/staleness/mean"] for r in rows[1:]) / max(1, len(rows) - 1),
        "dropped": last["accounting/dropped"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "configs/local/default.yaml"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--memory-steps", type=int, default=0)
    ap.add_argument("--output-dir", default=None, help="where the bench runs go (default: a temporary directory)")
    args, extra = ap.parse_known_args(argv)
    root = Path(args.output_dir or tempfile.mkdtemp(prefix="epic_slime_bench_"))
    common = [
        "--config",
        args.config,
        "--num-rollout",
        str(args.steps),
        "--eval-interval",
        "0",
        "--no-plots",
        "--no-progress",
        "--save-interval",
        "0",
        *extra,
    ]
    results = {}
    for mode in ("async", "sync"):
        cfg = parse_config([*common, "--rollout-mode", mode, "--output-dir", str(root / mode)])
        run_training(cfg)
        results[mode] = _throughput(_rows(root / mode))
        r = results[mode]
        print(
            f"{mode:5s}: {r['trained_per_s']:8.1f} trained samples/s, {r['generated_per_s']:8.1f} generated/s, "
            f"mean lag {r['staleness_mean']:.2f}, dropped {r['dropped']} ({r['seconds']:.1f}s for {args.steps - 1} steps)",
            flush=True,
        )
    ratio = results["async"]["trained_per_s"] / results["sync"]["trained_per_s"]
    print(f"async / sync trained-samples/s ratio: {ratio:.2f}")
    report = {"throughput": results, "async_over_sync": ratio}
    if args.memory_steps > 0:
        cfg = parse_config(
            [
                *common,
                "--num-rollout",
                str(args.memory_steps),
                "--rollout-mode",
                "async",
                "--rollout-batch-size",
                "8",
                "--output-dir",
                str(root / "memory"),
            ]
        )
        summary = run_training(cfg)
        rows = _rows(root / "memory")
        rss = [rows[0]["driver/rss_mb"], rows[len(rows) // 2]["driver/rss_mb"], rows[-1]["driver/rss_mb"]]
        print(
            f"driver RSS over {len(rows)} async steps: start {rss[0]:.1f} MiB, middle {rss[1]:.1f} MiB, "
            f"end {rss[2]:.1f} MiB (growth {rss[2] - rss[0]:+.1f} MiB); before the loop {summary['rss_mb_start']:.1f} MiB"
        )
        report["memory"] = {"steps": len(rows), "rss_mb": rss, "rss_mb_before_loop": summary["rss_mb_start"]}
    (root / "bench.json").write_text(json.dumps(report, indent=1))
    print(f"bench results: {root / 'bench.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
