"""The launcher's price list: simulated s/rollout and speedup over sync colocated for the settings
launch/qwen3_30b_epic.sh can run (nodes x 8 GPUs, train nodes, GPUs per engine, K, push mode,
oversampling), and the planner's pick per node count, precomputed (a few minutes) so that
``DRY_RUN=1`` prints its price in well under a second: ``python bench/schedule_sim.py predict ...``
reads ``bench/schedsim/launch_predictions.json`` (rebuilt by ``python bench/schedule_sim.py launch-table``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "launch_predictions.json"
NODES = (4,)
KS = ("0", "1", "2", "3", "4", "8")
PUSH_MODES = ("abort", "in_place")
OVERSAMPLE = ("0", "0.1")
PICK_K, PICK_PUSH = 2, "abort"   # the launcher's defaults (see docs/cluster.md, "Picking K and the push mode")


def key(nodes: int, gpus_per_node: int, actor_nodes: int, gpus_per_engine: int, k: str, push: str, oversample: str) -> str:
    return f"{nodes}x{gpus_per_node}|train {actor_nodes}|engine {gpus_per_engine}|K {k}|{push}|oversample {oversample}"


def build(rollouts: int = 10, gpus_per_node: int = 8, frontier_json: Path | None = None, log=print) -> dict:
    """The prices of the paper preset on 4 nodes: the frontier's rows (``frontier_paper.json``: K 1-8 x
    push mode x the 16 : 16 / 24 : 8 splits with 8- and 4-GPU engines, oversampling 0), plus, simulated
    here, the synchronous split (K = 0) and Table 2's oversampling 0.1 at K = 2 for each of those splits."""
    from .frontier import split_preset
    from .presets import paper_preset
    from .schedules import simulate

    nodes = 4
    frontier_json = frontier_json or Path(__file__).resolve().parent / "frontier_paper.json"
    front = json.loads(frontier_json.read_text())
    sync = front["sync_colocated_s"]
    table = {"source": f"python bench/schedule_sim.py launch-table: {frontier_json.name} + K = 0 and oversampling 0.1 rows",
             "rollouts": rollouts, "prices": {f"{nodes}x{gpus_per_node}|sync colocated": dict(s_per_rollout=sync, speedup=1.0)},
             "picks": {}}
    best = None
    for r in front["rows"]:
        train = int(r["split"].split(":")[1])
        if train % gpus_per_node:
            continue
        k = r["schedule"].split("=")[-1]
        row = dict(s_per_rollout=r["s"], speedup=r["ratio"], dropped=r["dropped"], requeued=r["requeued"],
                   staleness_hist={str(a): b for a, b in r["hist"].items()})
        table["prices"][key(nodes, gpus_per_node, train // gpus_per_node, r["gpe"], k, r["push"], "0")] = row
        if k == str(PICK_K) and r["push"] == PICK_PUSH and (best is None or row["s_per_rollout"] < best["s_per_rollout"]):
            best = dict(row, actor_nodes=train // gpus_per_node, gpus_per_engine=r["gpe"])
    base = paper_preset(total_gpus=nodes * gpus_per_node)
    splits = sorted({(int(r["split"].split(":")[1]), r["gpe"]) for r in front["rows"]
                     if int(r["split"].split(":")[1]) % gpus_per_node == 0})
    for train, gpe in splits:
        q = split_preset(base, train, gpe, "abort")
        extra = [("0", "0", q, "sync split"),
                 ("2", "0.1", dataclasses.replace(q, oversample_ratio=0.1), "async K=2")]
        for k, over, preset, schedule in extra:
            r = simulate(preset, schedule, max(rollouts, 12), warmup=4 if k == "2" else 2)
            row = dict(s_per_rollout=r["s_per_rollout"], speedup=sync / r["s_per_rollout"], dropped=r["dropped_groups"],
                       requeued=r["requeued_groups"], staleness_hist={str(a): b for a, b in r["staleness_hist"].items()})
            table["prices"][key(nodes, gpus_per_node, train // gpus_per_node, gpe, k, "abort", over)] = row
            log(f"{key(nodes, gpus_per_node, train // gpus_per_node, gpe, k, 'abort', over)}: "
                f"{row['s_per_rollout']:.1f} s ({row['speedup']:.2f}x)")
    table["picks"][f"{nodes}x{gpus_per_node}"] = best
    return table


def write(table: dict, path: Path = TABLE) -> None:
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


def load(path: Path = TABLE) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: build it with python bench/schedule_sim.py launch-table")
    return json.loads(path.read_text())


def pick(nodes: int, gpus_per_node: int, path: Path = TABLE) -> dict | None:
    return load(path)["picks"].get(f"{nodes}x{gpus_per_node}")


def predict(nodes: int, gpus_per_node: int, actor_nodes: int, gpus_per_engine: int, k: str, push: str,
            oversample: str, path: Path = TABLE) -> str:
    """One line for the launcher's dry run: the simulated price of its settings, or why there is none."""
    table = load(path)
    sync = table["prices"].get(f"{nodes}x{gpus_per_node}|sync colocated")
    over = oversample if oversample in OVERSAMPLE else str(float(oversample)).rstrip("0").rstrip(".")
    row = table["prices"].get(key(nodes, gpus_per_node, actor_nodes, gpus_per_engine, str(k), push, over))
    settings = (f"{nodes} x {gpus_per_node} GPUs, {actor_nodes} train node(s), {gpus_per_engine} GPUs per engine, "
                f"K={k}, push {push}, oversampling {oversample}")
    if sync is None or row is None:
        return (f"# simulator: no precomputed price for {settings} ({path.name} covers 4 x 8 GPUs, K 1-8 with "
                f"oversampling 0, K 0 and K 2 at 0.1); run python bench/schedule_sim.py plan --gpus {nodes * gpus_per_node} "
                f"--max-staleness {k} --push-mode {push}")
    hist = " ".join(f"{a}:{b}" for a, b in row["staleness_hist"].items())
    return (f"# simulator (paper preset, {path.name}): {settings}: {row['s_per_rollout']:.1f} s/rollout, "
            f"{row['speedup']:.2f}x sync colocated ({sync['s_per_rollout']:.1f} s/rollout); staleness {hist}; "
            f"dropped {row['dropped']}, requeued {row['requeued']}")
