"""Read an `async_pairs.sh` log: per pair the old and new tree's async/sync ratio, their medians and the paired
differences (new - old).  `python bench/async_pairs.py bench/async_pairs.log`"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

PAIR = re.compile(r"^== pair (\d+) (old|new) \S+ load (\S+)$")
RATIO = re.compile(r"^async / sync trained-samples/s ratio: (\d+\.\d+)$")


def read_pairs(text: str) -> dict:
    """{"old": [ratio per pair], "new": [...], "load": [load at each run's start]}; a pair missing a half is an error."""
    ratios: dict[str, dict[int, float]] = {"old": {}, "new": {}}
    loads, current = [], None
    for line in text.splitlines():
        if m := PAIR.match(line):
            current = (m[2], int(m[1]))
            loads.append(float(m[3]))
        elif (m := RATIO.match(line)) and current:
            ratios[current[0]][current[1]] = float(m[1])
    pairs = sorted(ratios["old"])
    if not pairs or pairs != sorted(ratios["new"]):
        raise ValueError(f"async_pairs log: unpaired runs (old pairs {pairs}, new pairs {sorted(ratios['new'])})")
    return {"old": [ratios["old"][i] for i in pairs], "new": [ratios["new"][i] for i in pairs], "load": loads}


def summary(pairs: dict) -> dict:
    diffs = [n - o for o, n in zip(pairs["old"], pairs["new"])]
    return {
        "pairs": len(diffs),
        "old_median": statistics.median(pairs["old"]),
        "new_median": statistics.median(pairs["new"]),
        "old_range": (min(pairs["old"]), max(pairs["old"])),
        "new_range": (min(pairs["new"]), max(pairs["new"])),
        "diffs": diffs,
        "load_range": (min(pairs["load"]), max(pairs["load"])),
    }


def main(argv: list[str]) -> int:
    s = summary(read_pairs(Path(argv[0] if argv else "bench/async_pairs.log").read_text()))
    print(f"{s['pairs']} pairs, load {s['load_range'][0]:.1f}-{s['load_range'][1]:.1f}")
    print(f"old: median {s['old_median']:.2f} ({s['old_range'][0]:.2f}-{s['old_range'][1]:.2f})")
    print(f"new: median {s['new_median']:.2f} ({s['new_range'][0]:.2f}-{s['new_range'][1]:.2f})")
    print("new - old per pair: " + ", ".join(f"{d:+.2f}" for d in s["diffs"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
