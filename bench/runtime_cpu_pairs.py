"""`bench/runtime_cpu_bench.py` in an older tree and in this one, interleaved (old, new, new, old, ...: ABBA), and the
new / old ratio of each call's CPU time per pair (issue 34: why is today's async half 4-6% slower?).

    python bench/runtime_cpu_pairs.py [--old-commit 69105eb | --old-tree DIR] [--pairs 4] [-- BENCH ARGS]
    python bench/runtime_cpu_pairs.py --read bench/runtime_cpu_pairs.log    # the summary of a saved log

Each run is a fresh process of this tree's bench script with PYTHONPATH set to the tree it measures. With
--old-commit a temporary detached worktree is made and removed again. Prints every run's lines, then per
call the median over runs of each tree and the per-pair ratios new / old.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
NEW = HERE.parent


ROW = re.compile(r"^(\w+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+((?:\d+\.\d+, )*\d+\.\d+)$")
NEW_PARTS = re.compile(r"^metrics_new\s+(\d+\.\d+)\s+\(")
HEAD = re.compile(r"^(\d+) pairs, old (\w+), new (\w+), same inputs in every run: (True|False)$")


def read_summary(text: str) -> dict:
    """The summary table of a saved log: {"pairs", "old", "new", "same_inputs", "calls": {call: {"old", "new",
    "old_min", "new_min", "ratios"}}, "metrics_new"}; a log without the table is an error."""
    out: dict = {"calls": {}}
    for line in text.splitlines():
        if m := HEAD.match(line):
            out.update(pairs=int(m[1]), old=m[2], new=m[3], same_inputs=m[4] == "True")
        elif m := ROW.match(line):
            out["calls"][m[1]] = {
                "old": float(m[2]),
                "new": float(m[3]),
                "old_min": float(m[4]),
                "new_min": float(m[5]),
                "ratios": [float(r) for r in m[6].split(", ")],
            }
        elif m := NEW_PARTS.match(line):
            out["metrics_new"] = float(m[1])
    if "pairs" not in out or not out["calls"]:
        raise ValueError("runtime_cpu_pairs log: no summary table (did the run finish?)")
    return out


def _run(tree: Path, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        env = {**os.environ, "PYTHONPATH": str(tree), "EPIC_SLIME_TORCH_THREADS": "1"}
        proc = subprocess.run(
            [sys.executable, str(HERE / "runtime_cpu_bench.py"), "--json", str(out), *extra],
            env=env,
            cwd=tree,
            capture_output=True,
            text=True,
        )
        print(proc.stdout, end="", flush=True)
        if proc.returncode:
            raise SystemExit(f"bench failed in {tree}:\n{proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old-commit", default="69105eb")
    ap.add_argument("--old-tree", default=None, help="an existing checkout of the old code (instead of a worktree)")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--read", default=None, help="print the summary of a saved log instead of measuring")
    args, extra = ap.parse_known_args(argv)
    if args.read:
        print(json.dumps(read_summary(Path(args.read).read_text()), indent=1))
        return 0
    extra = [a for a in extra if a != "--"]
    made = None
    old = Path(args.old_tree) if args.old_tree else None
    if old is None:
        made = Path(tempfile.mkdtemp(prefix="epic_slime_old_"))
        subprocess.run(
            ["git", "-C", str(NEW), "worktree", "add", "--detach", str(made), args.old_commit],
            check=True,
            capture_output=True,
        )
        old = made
    try:
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        for i in range(args.pairs):
            order = (("old", old), ("new", NEW))
            for name, tree in order if i % 2 == 0 else order[::-1]:  # ABBA: a drift in load hits both alike
                print(f"== pair {i + 1} {name} load {os.getloadavg()[0]:.1f}", flush=True)
                runs[name].append(_run(tree, extra))
    finally:
        if made is not None:
            subprocess.run(["git", "-C", str(NEW), "worktree", "remove", "--force", str(made)], check=False)
    hashes = {r["inputs_sha256"] for rs in runs.values() for r in rs}
    print(
        f"\n{args.pairs} pairs, old {runs['old'][0]['commit']}, new {runs['new'][0]['commit']}, "
        f"same inputs in every run: {len(hashes) == 1}"
    )
    print(
        "per call: the median over runs of each run's median CPU ms, the smallest call of any run (the least"
        " disturbed by the load), and new / old of the runs' medians per pair"
    )
    print(f"{'call':16s} {'old ms':>9s} {'new ms':>9s} {'old min':>9s} {'new min':>9s}  new/old per pair")

    def fig(r: dict, call: str, key: str = "median_ms") -> float:
        return r["metrics"]["all"][key] if call == "metrics" else r[call][key]

    for call in ("generate", "train_step", "loss", "loss_no_metrics", "metrics", "select_batch"):
        o = [fig(r, call) for r in runs["old"]]
        n = [fig(r, call) for r in runs["new"]]
        ratios = ", ".join(f"{b / a:.3f}" for a, b in zip(o, n))
        lo_o = min(fig(r, call, "min_ms") for r in runs["old"])
        lo_n = min(fig(r, call, "min_ms") for r in runs["new"])
        print(f"{call:16s} {statistics.median(o):9.2f} {statistics.median(n):9.2f} {lo_o:9.2f} {lo_n:9.2f}  {ratios}")
    parts = [r["metrics"]["new_parts"]["median_ms"] for r in runs["new"] if "new_parts" in r["metrics"]]
    if parts:
        print(
            f"{'metrics_new':16s} {'':9s} {statistics.median(parts):9.2f}  (abs_L_p50/p90_position + "
            f"grad_removed_frac, new tree only)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
