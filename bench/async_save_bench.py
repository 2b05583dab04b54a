"""How long a checkpoint save blocks the caller, synchronous vs asynchronous (issue 28 §5).

Megatron's ``--async-save`` (torch_dist format) stages the state to host memory, returns, and
writes it on in the background through torch.distributed.checkpoint's file writer; the push after
the save waits only for the staging. This measures that mechanism with torch's own
``dcp.save`` / ``dcp.async_save`` (one process, ``no_dist``) on a state dict of ``--gb`` GB of
fp32 tensors (a rank's shard of weights and Adam state), each written to a fresh folder with
fsync, several rounds alternating, and prints the blocking time of each and the ratio. The
asynchronous write's own time (until its future is done) is printed too: it runs while the
caller goes on.

    python bench/async_save_bench.py --gb 1 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time


def state_dict(gigabytes: float, tensors: int = 16) -> dict:
    import torch

    per = int(gigabytes * 2**30 / 4 / tensors)
    generator = torch.Generator().manual_seed(0)
    return {f"shard_{i}": torch.randn(per, generator=generator) for i in range(tensors)}


def sync_save(state: dict, folder: str) -> float:
    import torch.distributed.checkpoint as dcp

    start = time.perf_counter()
    dcp.save(state, checkpoint_id=folder, no_dist=True)
    return time.perf_counter() - start


def async_save(state: dict, folder: str) -> tuple[float, float]:
    import torch.distributed.checkpoint as dcp

    start = time.perf_counter()
    future = dcp.async_save(state, checkpoint_id=folder, no_dist=True)
    blocked = time.perf_counter() - start
    future.result()
    return blocked, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="state size in GB (default 1)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    args = parser.parse_args(argv)
    import warnings

    import torch

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # no_dist: one process, on purpose
    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="async_save_", dir=args.dir)
    state = state_dict(args.gb)
    sync_s, async_block_s, async_total_s = [], [], []
    try:
        for round_ in range(args.rounds):
            sync_s.append(sync_save(state, os.path.join(root, f"sync_{round_}")))
            blocked, total = async_save(state, os.path.join(root, f"async_{round_}"))
            async_block_s.append(blocked)
            async_total_s.append(total)
            shutil.rmtree(os.path.join(root, f"sync_{round_}"))
            shutil.rmtree(os.path.join(root, f"async_{round_}"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    sync_med, block_med, total_med = (statistics.median(v) for v in (sync_s, async_block_s, async_total_s))
    print(f"state {args.gb:g} GB, {args.rounds} rounds (median), load average {os.getloadavg()[0]:.1f}")
    print(f"  synchronous save blocks          {sync_med:7.2f} s")
    print(f"  asynchronous save blocks         {block_med:7.2f} s   (staging; the write goes on)")
    print(f"  asynchronous save done after     {total_med:7.2f} s")
    print(f"  blocking ratio async / sync      {block_med / sync_med:7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
