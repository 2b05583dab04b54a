"""docs/results.md's generated tables are what `python bench/make_results.py` writes from the committed output
files today: regenerated in memory and compared, so a re-run bench or simulator fails this until the doc follows."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_results_md_is_current():
    sys.path.insert(0, str(REPO / "bench"))
    import make_results

    current = make_results.RESULTS.read_text(encoding="utf-8")
    fresh = make_results.render(current)
    changed = [
        f"{i}: {old!r} -> {new!r}"
        for i, (old, new) in enumerate(zip(current.splitlines(), fresh.splitlines()), start=1)
        if old != new
    ]
    assert fresh == current, "docs/results.md is stale; run python bench/make_results.py\n" + "\n".join(changed[:10])
