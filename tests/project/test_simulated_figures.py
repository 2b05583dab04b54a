"""The simulator's figures in docs/cluster.md are the committed simulator outputs' (frontier_paper.json,
launch_predictions.json, verl_preset.txt): rerun the simulator and these fail until the prose follows.
docs/results.md's are generated (bench/make_results.py, tests/project/test_results_doc.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIM = REPO / "bench" / "schedsim"


def _collapse(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_cluster_tables_rows_are_the_frontiers():
    """Every row of docs/cluster.md's frontier table: its s/rollout, x sync and share of bound are the
    frontier_paper.json row of that K, push mode, split and engine size."""
    front = json.loads((SIM / "frontier_paper.json").read_text())
    rows = {(r["schedule"].split("=")[-1], r["push"], r["split"], r["gpe"]): r for r in front["rows"]}
    text = (REPO / "docs" / "cluster.md").read_text()
    pattern = re.compile(
        r"^\| \**(\d)\** \| \**(abort|in_place)\** \| \**(\d+) : (\d+), (\d)[^|]*\| \**([\d.]+)\** \| "
        r"\**([\d.]+)\** \| \**(\d+)%",
        re.M,
    )
    found = pattern.findall(text)
    assert len(found) >= 6, "the frontier table in docs/cluster.md was not found"
    for k, push, rollout, train, gpe, s, ratio, share in found:
        r = rows[(k, push, f"{rollout}:{train}", int(gpe))]
        assert (s, ratio, share) == (f"{r['s']:.1f}", f"{r['ratio']:.2f}", f"{r['share'] * 100:.0f}"), (
            k,
            push,
            rollout,
            gpe,
        )
    baseline = f"{front['sync_colocated_s']:.1f} s per rollout"
    assert baseline in _collapse(text) and f"{front['sync_colocated_gpus_per_engine']}-GPU engines" in text


def test_the_cluster_docs_quote_the_launchers_price_and_verls_rows():
    table = json.loads((SIM / "launch_predictions.json").read_text())
    pick = table["picks"]["4x8"]
    name = f"4x8|train {pick['actor_nodes']}|engine {pick['gpus_per_engine']}|K 2|abort|oversample 0"
    row = table["prices"][name]
    text = _collapse((REPO / "docs" / "cluster.md").read_text())
    lo, hi = min(row["band"][0], row["speedup"]), max(row["band"][1], row["speedup"])
    assert f"{row['s_per_rollout']:.1f} s, {row['speedup']:.2f}x ({lo:.2f}-{hi:.2f}x)" in text
    verl = (SIM / "verl_preset.txt").read_text()
    for k in (1, 2, 4):
        m = re.search(rf"async K={k} abort\s*: step ([\d.]+) s, ([\d.]+)x", verl)
        assert m, k
        assert f"K = {k} {m.group(1)} s" in text and f"{m.group(2)}x" in text, k
        if k == 1:  # the like-staleness comparison (verl lets at most half a batch run ahead)
            assert f"K = 1 {m.group(2)}x against verl's" in text
    sync8 = re.search(r"sync colocated by GPUs per engine: 4: [\d.]+ s, 8: ([\d.]+) s", verl)
    assert sync8 is None or f"would take {sync8.group(1)} s" in text
