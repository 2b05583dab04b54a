"""CPU cost and memory of the slime path's per-rollout bookkeeping at the paper's size.

    SLIME_PATH=... PYTHONPATH=.:$SLIME_PATH python bench/bookkeeping_bench.py [--prompts 64] [--samples 8]
        [--response-len 9000] [--rollouts 5] [--rollout-wall-s S]

What is timed (the real functions of epic_slime/slime/rollout.py, stream/gate.py and stream/ledger.py, on one
thread, with synthetic slime ``Sample`` objects: token ids and per-token log-probs as Python lists, as
slime holds them): per rollout, the RolloutManager's work outside generation:
  - ``StreamingDataSource``-style consumption: ``GroupLedger.consume`` with a deep copy of the fresh group
    (what ``StreamingDataSource.get_samples`` does);
  - the real ``GroupStream`` bookkeeping around each finished group (``_forget_empty_calls``, the R3
    hooks ``remember_partial_routing`` / ``finish_group_routing`` with R3 off) and ``pop``;
  - ``collect_admitted_groups`` (``sample_version`` per sample, ``select_groups``, ``StalenessGate``,
    ``annotate_group``), ``GroupLedger.deliver`` / ``close_rollout`` / ``check`` / ``metrics``,
    ``StalenessGate.metrics``, and the batch sort ``_group_sort_key``;
  - R3 (separately): ``compact_routing`` of each sample's int32 routing to uint8.
The share is against a simulated rollout's wall time at the same batch size (bench/schedule_sim.py,
paper preset, async K = 2), passed with --rollout-wall-s or computed here. The issue's size, 512
prompts x 8, is ``--prompts 512`` (about 75 s and 5 GiB resident here); the default is Table 2's 64.
Needs slime (the timed functions import it): SLIME_PATH on PYTHONPATH, as above.

Memory: resident set growth while one rollout batch plus the held groups (oversampled leftovers:
--async-groups-in-flight minus the batch) are alive, measured for the token / log-prob lists, and
for R3 routing (int32 [tokens - 1, 48, 8] per sample before compaction, uint8 after), measured on a
scaled-down number of samples and extrapolated linearly (said in the output) to stay within a few GB.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def make_group(Sample, key: int, n: int, response_len: int, prompt_len: int, version: int, rng: random.Random):
    group = []
    for j in range(n):
        length = max(1, int(rng.lognormvariate(0, 0.3) * response_len))
        tokens = [rng.randrange(150_000) for _ in range(prompt_len + length)]
        group.append(
            Sample(
                group_index=key,
                index=key * n + j,
                tokens=tokens,
                response_length=length,
                rollout_log_probs=[-rng.random() for _ in range(length)],
                loss_mask=[1] * length,
                weight_versions=[str(version)],
                status=Sample.Status.COMPLETED,
                metadata={},
            )
        )
    return group


def fresh_group(Sample, key: int, n: int, prompt_len: int, rng: random.Random):
    prompt = [rng.randrange(150_000) for _ in range(prompt_len)]
    return [
        Sample(
            group_index=key, index=key * n + j, tokens=list(prompt), response_length=0, weight_versions=[], metadata={}
        )
        for j in range(n)
    ]


def time_bookkeeping(args, Sample) -> dict:
    import epic_slime.slime.rollout as ro
    from epic_slime.metric_names import STALENESS_PREFIX
    from epic_slime.slime.cli.oversampling import groups_in_flight
    from epic_slime.slime.routing import finish_group_routing, remember_partial_routing
    from epic_slime.slime.stream.gate import StalenessGate, collect_admitted_groups
    from epic_slime.slime.stream.ledger import GroupLedger

    rng = random.Random(0)
    capacity = groups_in_flight(args.prompts, args.oversample)
    run_args = SimpleNamespace(rollout_batch_size=args.prompts, use_rollout_routing_replay=False)
    ledger = GroupLedger()
    # a GroupStream without its event loop: only its bookkeeping methods are called
    stream = ro.GroupStream.__new__(ro.GroupStream)
    stream.active, stream.failures, stream.empty_call_versions = {}, [], 0
    stream.order, stream.finished, stream.to_start = __import__("collections").deque(), {}, []
    stream.taken = set()
    stream.top_up = lambda up_to=None: None
    stream.data_source = SimpleNamespace(ledger=ledger, handed_back=lambda: 0)  # nothing is handed back here
    totals = {"consume": 0.0, "on_done": 0.0, "collect": 0.0, "ledger": 0.0, "metrics": 0.0}
    key = 0
    per_rollout = []
    for r in range(args.rollouts):
        trainer_version = r + 1
        # generation is not timed: build the finished groups of this rollout (one version of slack: staleness 1,
        # leftovers 2)
        need = capacity if r == 0 else args.prompts
        fresh = [fresh_group(Sample, key + i, args.samples, args.prompt_len, rng) for i in range(need)]
        t = time.process_time()
        for i, g in enumerate(fresh):
            ledger.consume(key + i, __import__("copy").deepcopy(g))  # StreamingDataSource.get_samples
        totals["consume"] += (dt_consume := time.process_time() - t)
        finished = [
            make_group(
                Sample, key + i, args.samples, args.response_len, args.prompt_len, max(0, trainer_version - 1), rng
            )
            for i in range(need)
        ]
        key += need
        t = time.process_time()
        for g in finished:  # GroupStream._on_done's bookkeeping for a finished group
            before = [(s.response_length, len(s.weight_versions)) for s in g]
            stream._forget_empty_calls(g, before)
            remember_partial_routing(g)
            finish_group_routing(run_args, g)
            stream.order.append(ro.group_key(g))  # started in order, finished
            stream.finished[ro.group_key(g)] = g
        totals["on_done"] += (dt_done := time.process_time() - t)
        gate = StalenessGate(2, "drop")
        t = time.process_time()
        batch = asyncio.run(
            collect_admitted_groups(
                stream.pop,
                trainer_version=trainer_version,
                gate=gate,
                target=args.prompts,
                on_drop=lambda g: (ledger.drop(ro.group_key(g)), stream.release(g)),
            )
        )
        batch.sort(key=ro._group_sort_key)
        totals["collect"] += (dt_collect := time.process_time() - t)
        t = time.process_time()
        for g in batch:
            ledger.deliver(ro.group_key(g), r)
            stream.release(g)
        ledger.close_rollout(r - 2)
        ledger.check(worker_in_flight=stream.accounted())
        totals["ledger"] += (dt_ledger := time.process_time() - t)
        t = time.process_time()
        metrics = gate.metrics(prefix=STALENESS_PREFIX) | ledger.metrics()
        totals["metrics"] += (dt_metrics := time.process_time() - t)
        per_rollout.append(dt_consume + dt_done + dt_collect + dt_ledger + dt_metrics)
        assert metrics and len(batch) == args.prompts
        del finished, fresh, batch
        gc.collect()
    return {
        "per_rollout_s": per_rollout,
        "parts_s": {k: v / args.rollouts for k, v in totals.items()},
        "mean_s": sum(per_rollout) / len(per_rollout),
        "capacity": capacity,
    }


def time_r3(args, Sample) -> dict:
    import torch

    from epic_slime.slime.routing import compact_routing

    run_args = SimpleNamespace(num_layers=48, moe_router_topk=8, num_experts=128, use_rollout_routing_replay=True)
    n = args.r3_samples
    tokens = args.prompt_len + args.response_len
    t_total = 0.0
    for _ in range(n):
        routing = torch.randint(0, 128, (tokens - 1, 48, 8), dtype=torch.int32)
        t = time.process_time()
        compact_routing(run_args, routing, tokens)
        t_total += time.process_time() - t
    return {"per_sample_s": t_total / n}


def memory(args, Sample) -> dict:
    """RSS growth for the batch + held groups: token / log-prob lists for all of them; R3 arrays for a scaled
    number of samples, extrapolated."""
    import numpy as np

    from epic_slime.slime.cli.oversampling import groups_in_flight

    rng = random.Random(1)
    groups_alive = groups_in_flight(args.prompts, args.oversample)  # the batch + the held leftovers
    gc.collect()
    base = rss_mb()
    held = [
        make_group(Sample, i, args.samples, args.response_len, args.prompt_len, 1, rng) for i in range(groups_alive)
    ]
    gc.collect()
    lists_mb = rss_mb() - base
    samples_alive = groups_alive * args.samples
    tokens = args.prompt_len + args.response_len
    scaled = min(samples_alive, args.r3_mem_samples)
    out = {
        "groups_alive": groups_alive,
        "samples_alive": samples_alive,
        "lists_mb": lists_mb,
        "r3_measured_samples": scaled,
    }
    for name, dtype in (("r3_int32", np.int32), ("r3_uint8", np.uint8)):
        gc.collect()
        b = rss_mb()
        arrays = [np.ones((tokens - 1, 48, 8), dtype=dtype) for _ in range(scaled)]
        per_sample = (rss_mb() - b) / scaled
        out[f"{name}_mb_per_sample"] = per_sample
        out[f"{name}_mb"] = per_sample * samples_alive
        del arrays
    del held
    gc.collect()
    return out


def simulated_rollout_wall_s(prompts: int, samples: int) -> float:
    """The paper preset's async K = 2 rollout at the same batch size (a bigger batch takes longer to generate)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import logging

    import schedule_sim

    logging.getLogger("epic_slime").setLevel(logging.WARNING)
    preset = schedule_sim.paper_preset(rollout_batch_size=prompts, n_samples=samples)
    return schedule_sim.simulate(preset, "async K=2", 6)["s_per_rollout"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64, help="groups per rollout (paper Table 2: 64)")
    ap.add_argument("--samples", type=int, default=8, help="samples per prompt (Table 2: 8)")
    ap.add_argument("--response-len", type=int, default=9000)
    ap.add_argument("--prompt-len", type=int, default=250)
    ap.add_argument("--oversample", type=float, default=0.1)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--r3-samples", type=int, default=16, help="samples whose R3 routing compaction is timed")
    ap.add_argument(
        "--r3-mem-samples", type=int, default=64, help="samples whose R3 arrays are allocated (extrapolated)"
    )
    ap.add_argument(
        "--rollout-wall-s", type=float, default=None, help="default: the schedule simulator's paper async K=2"
    )
    a = ap.parse_args(argv)
    try:
        from slime.utils.types import Sample
    except ImportError:  # the timed functions are slime's adapter's own: they import slime themselves
        print(
            "bookkeeping_bench times epic_slime/slime/rollout.py, which needs slime: put it on the path, e.g. "
            "SLIME_PATH=../shared/vendor/slime-624b824a PYTHONPATH=.:$SLIME_PATH",
            file=sys.stderr,
        )
        return 2
    kind = "slime's Sample"

    import torch

    torch.set_num_threads(1)
    print(
        f"bookkeeping at {a.prompts} prompts x {a.samples} samples, {a.response_len}-token responses "
        f"(lognormal around it) with per-token log-probs, K = 2, oversampling {a.oversample}; {kind}",
        flush=True,
    )
    t = time_bookkeeping(a, Sample)
    r3 = time_r3(a, Sample)
    wall = a.rollout_wall_s or simulated_rollout_wall_s(a.prompts, a.samples)
    samples_per_rollout = a.prompts * a.samples
    print(
        f"CPU s per rollout (process time, one thread): {t['mean_s']:.3f} s "
        f"(per rollout: {', '.join(f'{x:.3f}' for x in t['per_rollout_s'])}); parts: "
        + ", ".join(f"{k} {v:.3f}" for k, v in t["parts_s"].items())
    )
    r3_s = r3["per_sample_s"] * samples_per_rollout
    print(
        f"R3 compaction (int32 -> uint8, checked): {r3['per_sample_s'] * 1e3:.1f} ms per sample, {r3_s:.2f} s per rollout"
    )
    print(
        f"share of a simulated rollout ({wall:.0f} s, paper preset async K=2 at {a.prompts} x {a.samples}): {t['mean_s'] / wall:.3%} "
        f"without R3, {(t['mean_s'] + r3_s) / wall:.3%} with R3 (goal < 1%)"
    )
    m = memory(a, Sample)
    print(
        f"RolloutManager memory for one batch + held groups ({m['groups_alive']} groups, {m['samples_alive']} samples): "
        f"token / log-prob lists {m['lists_mb']:.0f} MiB; R3 routing int32 {m['r3_int32_mb'] / 1024:.1f} GiB, "
        f"uint8 {m['r3_uint8_mb'] / 1024:.1f} GiB (measured on {m['r3_measured_samples']} samples, "
        f"{m['r3_int32_mb_per_sample']:.1f} / {m['r3_uint8_mb_per_sample']:.1f} MiB each, extrapolated linearly)"
    )
    if a.prompts != 512:
        scale = 512 / a.prompts
        print(
            f"at 512 prompts x {a.samples} ({scale:.0f}x the groups; linear extrapolation, measure with --prompts 512): "
            f"{t['mean_s'] * scale:.2f} CPU s per rollout, lists {m['lists_mb'] * scale / 1024:.1f} GiB, R3 uint8 "
            f"{m['r3_uint8_mb'] * scale / 1024:.1f} GiB, int32 {m['r3_int32_mb'] * scale / 1024:.1f} GiB"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
