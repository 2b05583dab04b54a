"""Sum a durations file (tests/conftest.py, EPIC_SLIME_TEST_DURATIONS) by tier: how much of the suite's
time each tier takes, and the fast tier (`-m "not slow"`) on its own; then the slowest files, last in
CI's log, where a cut of the suite's time starts.

    python .ci/durations.py .ci-out/durations.tsv
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path


def rows(path: Path) -> list[tuple[float, list[str], str]]:
    """(seconds, tier names, node id) per test line, after the header."""
    out = []
    for line in path.read_text().splitlines()[1:]:
        seconds, _outcome, tiers, nodeid = line.split("\t", 3)
        out.append((float(seconds), [t for t in tiers.split(",") if t != "-"], nodeid))
    return out


def summarize(path: Path) -> dict[str, tuple[int, float]]:
    """tier -> (tests, seconds); "all" and "fast" (no `slow` marker) beside the markers' own tiers."""
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for seconds, names, _nodeid in rows(path):
        for name in ["all", *names, *([] if "slow" in names else ["fast"])]:
            out[name][0] += 1
            out[name][1] += seconds
    return {k: (int(n), s) for k, (n, s) in out.items()}


def slowest_files(path: Path, n: int = 12) -> list[tuple[str, int, float]]:
    """(file, tests, seconds) of the ``n`` files that take the most time, slowest first."""
    by_file: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for seconds, _names, nodeid in rows(path):
        counts = by_file[nodeid.split("::", 1)[0]]
        counts[0] += 1
        counts[1] += seconds
    ranked = sorted(by_file.items(), key=lambda kv: -kv[1][1])[:n]
    return [(name, int(count), seconds) for name, (count, seconds) in ranked]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    totals = summarize(Path(argv[0]))
    whole = totals.get("all", (0, 0.0))[1] or 1.0
    for name in ("all", "fast", "slow", "real_sglang", "needs_slime", "megatron", "launch"):
        n, s = totals.get(name, (0, 0.0))
        print(f"durations: {name:<12} {n:5d} tests {s:8.1f} s ({100 * s / whole:5.1f}% of the suite's test time)")
    for name, n, s in slowest_files(Path(argv[0])):
        print(f"durations: file {s:8.1f} s {n:4d} tests  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
