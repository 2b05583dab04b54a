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
NODES = (2, 4, 8)
KS = ("0", "1", "2", "3", "4", "8")
PUSH_MODES = ("abort", "in_place")
OVERSAMPLE = ("0", "0.1")
PICK_K, PICK_PUSH = 2, "abort"   # the launcher's defaults (see docs/cluster.md, "Picking K and the push mode")


def key(nodes: int, gpus_per_node: int, actor_nodes: int, gpus_per_engine: int, k: str, push: str, oversample: str) -> str:
    return f"{nodes}x{gpus_per_node}|train {actor_nodes}|engine {gpus_per_engine}|K {k}|{push}|oversample {oversample}"


def build(rollouts: int = 10, nodes=NODES, gpus_per_node: int = 8, log=print) -> dict:
    from .frontier import split_preset
    from .planner import candidates
    from .presets import paper_preset
    from .schedules import simulate

    table = {"source": "python bench/schedule_sim.py launch-table (paper preset: configs/paper/table2.yaml)",
             "rollouts": rollouts, "prices": {}, "picks": {}}
    for n in nodes:
        base = paper_preset(total_gpus=n * gpus_per_node)
        sync = simulate(base, "sync colocated", rollouts)["s_per_rollout"]
        table["prices"][f"{n}x{gpus_per_node}|sync colocated"] = dict(s_per_rollout=sync, speedup=1.0)
        best = None
        for train, gpe in candidates(base, gpus_per_node):
            for push in PUSH_MODES:
                for over in OVERSAMPLE:
                    q = dataclasses.replace(split_preset(base, train, gpe, push), oversample_ratio=float(over))
                    for k in KS:
                        if k == "0" and (push != "abort" or over != "0"):
                            continue
                        warmup = max(2, int(k) + 2)   # past the budget's start-up (up to K batches ahead)
                        r = simulate(q, "sync split" if k == "0" else f"async K={k}", max(rollouts, warmup + 8),
                                     warmup=warmup)
                        row = dict(s_per_rollout=r["s_per_rollout"], speedup=sync / r["s_per_rollout"],
                                   dropped=r["dropped_groups"], requeued=r["requeued_groups"],
                                   staleness_hist={str(a): b for a, b in r["staleness_hist"].items()})
                        table["prices"][key(n, gpus_per_node, train // gpus_per_node, gpe, k, push, over)] = row
                        if k == str(PICK_K) and push == PICK_PUSH and over == "0" and (
                                best is None or row["s_per_rollout"] < best["s_per_rollout"]):
                            best = dict(row, actor_nodes=train // gpus_per_node, gpus_per_engine=gpe)
                        log(f"{key(n, gpus_per_node, train // gpus_per_node, gpe, k, push, over)}: "
                            f"{row['s_per_rollout']:.1f} s ({row['speedup']:.2f}x)")
        table["picks"][f"{n}x{gpus_per_node}"] = best
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
        return (f"# simulator: no precomputed price for {settings} ({path.name} covers nodes {NODES}, K {KS}, "
                f"oversampling {OVERSAMPLE}); run python bench/schedule_sim.py plan --gpus {nodes * gpus_per_node} "
                f"--max-staleness {k} --push-mode {push}")
    hist = " ".join(f"{a}:{b}" for a, b in row["staleness_hist"].items())
    return (f"# simulator (paper preset, {path.name}): {settings}: {row['s_per_rollout']:.1f} s/rollout, "
            f"{row['speedup']:.2f}x sync colocated ({sync['s_per_rollout']:.1f} s/rollout); staleness {hist}; "
            f"dropped {row['dropped']}, requeued {row['requeued']}")
