"""The launcher's price list: simulated s/rollout and speedup over sync colocated (at its own best engine
size, ``frontier.best_sync``) for the settings
launch/qwen3_30b_epic.sh can run (nodes x 8 GPUs, train nodes, GPUs per engine, K, push mode,
oversampling), and the planner's pick per node count, precomputed (a few minutes) so that
``DRY_RUN=1`` prints its price in well under a second: ``python bench/schedule_sim.py predict ...``
reads ``bench/schedsim/launch_predictions.json`` (rebuilt by ``python bench/schedule_sim.py launch-table``).
The launcher's own command at each K (push abort, the oversampling it submits) at the pick's split and
engine size carries its band (``band``: each uncertain input at each
end of its range, the baseline re-simulated under it), so the default dry run prints a range."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "launch_predictions.json"
NODES = (4,)
KS = ("0", "1", "2", "3", "4", "8")
PUSH_MODES = ("abort", "in_place")
OVERSAMPLE = ("0", "0.1")
BAND_KS = ("0", "1", "2", "3", "4")  # the bands' rows (K = 8 needs windows too long to sweep)
PICK_K, PICK_PUSH = 2, "abort"  # the launcher's defaults (see docs/cluster.md, "Picking K and the push mode")


def key(
    nodes: int, gpus_per_node: int, actor_nodes: int, gpus_per_engine: int, k: str, push: str, oversample: str
) -> str:
    return f"{nodes}x{gpus_per_node}|train {actor_nodes}|engine {gpus_per_engine}|K {k}|{push}|oversample {oversample}"


def _row(r: dict, sync_s: float) -> dict:
    return dict(
        s_per_rollout=r["s_per_rollout"],
        speedup=sync_s / r["s_per_rollout"],
        dropped=r["dropped_groups"],
        requeued=r["requeued_groups"],
        staleness_hist={str(a): b for a, b in r["staleness_hist"].items()},
    )


def build(rollouts: int = 10, gpus_per_node: int = 8, frontier_json: Path | None = None, log=print) -> dict:
    """The prices of the paper preset on 4 nodes: the frontier's rows (``frontier_paper.json``: K 1-8 x
    push mode x the 16 : 16 / 24 : 8 splits with 8- and 4-GPU engines, oversampling 0, against its best
    sync colocated), plus, simulated here, the synchronous split (K = 0) and Table 2's oversampling 0.1 at
    K = 0, 1 (what the launcher submits there) and 2 for each of those splits; then the bands of the pick's rows."""
    from .band import Band, ranges_text
    from .frontier import split_preset
    from .presets import paper_preset
    from .report import STEADY_SHARE_MAX
    from .schedules import simulate

    nodes = 4
    frontier_json = frontier_json or Path(__file__).resolve().parent / "frontier_paper.json"
    front = json.loads(frontier_json.read_text())
    sync = front["sync_colocated_s"]
    sync_gpe = front["sync_colocated_gpus_per_engine"]
    table = {
        "source": f"python bench/schedule_sim.py launch-table: {frontier_json.name} + K = 0 and oversampling 0.1 rows",
        "rollouts": rollouts,
        "band_ranges": "",
        "picks": {},
        "prices": {
            f"{nodes}x{gpus_per_node}|sync colocated": dict(s_per_rollout=sync, speedup=1.0, gpus_per_engine=sync_gpe)
        },
    }
    best = None
    for r in front["rows"]:
        train = int(r["split"].split(":")[1])
        if train % gpus_per_node:
            continue
        k = r["schedule"].split("=")[-1]
        row = dict(
            s_per_rollout=r["s"],
            speedup=r["ratio"],
            dropped=r["dropped"],
            requeued=r["requeued"],
            staleness_hist={str(a): b for a, b in r["hist"].items()},
        )
        table["prices"][key(nodes, gpus_per_node, train // gpus_per_node, r["gpe"], k, r["push"], "0")] = row
        steady = r["share"] <= STEADY_SHARE_MAX and r["dropped"] == 0 and r["requeued"] == 0
        if (
            k == str(PICK_K)
            and r["push"] == PICK_PUSH
            and steady
            and (best is None or row["s_per_rollout"] < best["s_per_rollout"])
        ):
            best = dict(row, actor_nodes=train // gpus_per_node, gpus_per_engine=r["gpe"])
    base = paper_preset(total_gpus=nodes * gpus_per_node, oversample_ratio=0.0)
    splits = sorted(
        {
            (int(r["split"].split(":")[1]), r["gpe"])
            for r in front["rows"]
            if int(r["split"].split(":")[1]) % gpus_per_node == 0
        }
    )
    for train, gpe in splits:
        q = split_preset(base, train, gpe, "abort")
        tenth = dataclasses.replace(q, oversample_ratio=0.1)
        extra = [
            ("0", "0", q, "sync split", 2),
            ("0", "0.1", tenth, "sync split", 2),
            ("1", "0.1", tenth, "async K=1", 3),
            ("2", "0.1", tenth, "async K=2", 4),
        ]
        for k, over, preset, schedule, warmup in extra:
            r = simulate(preset, schedule, max(rollouts, 12), warmup=warmup)
            name = key(nodes, gpus_per_node, train // gpus_per_node, gpe, k, "abort", over)
            table["prices"][name] = _row(r, sync)
            log(f"{name}: {r['s_per_rollout']:.1f} s ({sync / r['s_per_rollout']:.2f}x)")
    # the synchronous protocol colocated (the launcher's default at K = 0): every node trains and generates,
    # at each engine size the frontier's sync colocated rows have, at the oversampling it may submit
    for gpe in sorted(int(g) for g in front["sync_colocated_by_engine"]):
        for over in OVERSAMPLE:
            q = dataclasses.replace(
                split_preset(base, nodes * gpus_per_node, gpe, "abort"), oversample_ratio=float(over)
            )
            r = simulate(q, "sync colocated", max(rollouts, 12), warmup=2)
            name = key(nodes, gpus_per_node, nodes, gpe, "0", "abort", over)
            table["prices"][name] = _row(r, sync)
            log(f"{name}: {r['s_per_rollout']:.1f} s ({sync / r['s_per_rollout']:.2f}x)")
    table["picks"][f"{nodes}x{gpus_per_node}"] = best
    if best is not None:
        band = Band(base, rollouts, log=log)
        table["band_ranges"] = ranges_text(base)
        for k in BAND_KS:
            # the launcher's own command at each K: push abort, Table 2's 0.1 from the config at K <= 1, its own 0
            # at K >= 2 (the oversampling it submits); at K = 0 colocated on every node at the sync colocated best
            # engine size (its default), and the split layout (--layout split: half the nodes, 8-GPU engines)
            over = "0.1" if k in ("0", "1") else "0"
            layouts = (
                [(nodes, sync_gpe, "sync colocated"), (nodes // 2, 8, "sync split")]
                if k == "0"
                else [(best["actor_nodes"], best["gpus_per_engine"], f"async K={k}")]
            )
            for train_nodes, gpe, schedule in layouts:
                name = key(nodes, gpus_per_node, train_nodes, gpe, k, "abort", over)
                q = dataclasses.replace(
                    split_preset(base, train_nodes * gpus_per_node, gpe, "abort"), oversample_ratio=float(over)
                )
                b = band.row(q, schedule, warmup=max(2, int(k) + 2))
                table["prices"][name]["band"] = [round(b["lo"], 4), round(b["hi"], 4)]
    return table


def write(table: dict, path: Path = TABLE) -> None:
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


def load(path: Path = TABLE) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: build it with python bench/schedule_sim.py launch-table")
    return json.loads(path.read_text())


def pick(nodes: int, gpus_per_node: int, path: Path = TABLE, k: str = str(PICK_K)) -> dict | None:
    """The launcher's split and engine size: the asynchronous pick, or at K = 0 the synchronous protocol
    colocated on every node at its best engine size."""
    table = load(path)
    if str(k) == "0":
        sync = table["prices"].get(f"{nodes}x{gpus_per_node}|sync colocated")
        return None if sync is None else dict(actor_nodes=nodes, gpus_per_engine=sync["gpus_per_engine"])
    return table["picks"].get(f"{nodes}x{gpus_per_node}")


def predict(
    nodes: int,
    gpus_per_node: int,
    actor_nodes: int,
    gpus_per_engine: int,
    k: str,
    push: str,
    oversample: str,
    path: Path = TABLE,
) -> str:
    """One line for the launcher's dry run: the simulated price of its settings, or why there is none."""
    table = load(path)
    sync = table["prices"].get(f"{nodes}x{gpus_per_node}|sync colocated")
    over = oversample if oversample in OVERSAMPLE else str(float(oversample)).rstrip("0").rstrip(".")
    row = table["prices"].get(key(nodes, gpus_per_node, actor_nodes, gpus_per_engine, str(k), push, over))
    settings = (
        f"{nodes} x {gpus_per_node} GPUs, {actor_nodes} train node(s), {gpus_per_engine} GPUs per engine, "
        f"K={k}, push {push}, oversampling {oversample}"
    )
    if sync is None or row is None:
        return (
            f"# simulator: no precomputed price for {settings} ({path.name} covers 4 x 8 GPUs, K 1-8 with "
            f"oversampling 0, K 0-2 at 0.1); run python bench/schedule_sim.py plan --gpus {nodes * gpus_per_node} "
            f"--max-staleness {k} --push-mode {push} --oversample-ratio {oversample}"
        )
    hist = " ".join(f"{a}:{b}" for a, b in row["staleness_hist"].items())
    if "band" in row:
        lo, hi = min(row["band"][0], row["speedup"]), max(row["band"][1], row["speedup"])
        band = f" ({lo:.2f}-{hi:.2f}x over {table['band_ranges']})"
    else:
        band = " (no band precomputed for this setting: the pick's split carries them)"
    return (
        f"# simulator (paper preset, {path.name}): {settings}: {row['s_per_rollout']:.1f} s/rollout, "
        f"{row['speedup']:.2f}x sync colocated{band} at its best engine size ({sync['gpus_per_engine']} GPUs, "
        f"{sync['s_per_rollout']:.1f} s/rollout); staleness {hist}; dropped {row['dropped']}, requeued {row['requeued']}"
    )
