"""One prepared check of the loss path on a GPU: correctness, bf16, host syncs, speed, slime.

    python bench/gpu_check.py                   # CUDA, about 5 minutes on one H200, no network
    python bench/gpu_check.py --cpu             # small sizes on the CPU (part of the test suite)
    python bench/gpu_check.py --out figs.json --sections correctness sync

Sections (each one records "pass" / "fail" / "skip" with a reason in one JSON, --out):

  correctness  every registered mode on the device against the core on the CPU in float64, on the
               same (dtype-rounded) inputs: loss, gradient (tokens whose clip decision agrees),
               clip-decision mismatches; float32 and bfloat16 inputs. Also grpo == the plain
               6-line PPO clip written below (value and gradient).
  bounds       exact_kl_log_bounds on the device (float32, float64) against the CPU float64 solver.
  sync         no host synchronisation in compute_policy_loss(..., validate=False), with and
               without metrics (validation's value check is the one documented sync):
               * everywhere: a detector on the "meta" device (which takes the accelerator branches
                 of the core, and raises on .item() / bool() / bincount) that records data-dependent
                 ops and tensors built from Python data on the device (an H2D copy, i.e. a sync on
                 CUDA), metrics off and on; and the same detector on the CPU with the accelerator
                 branches forced and metrics on (for ops without meta kernels);
               * CUDA only: torch.cuda.set_sync_debug_mode("error") around forward + backward,
                 metrics off and on.
  speed        forward + backward time of epic, its ablations, grpo, gspo, ctpo, cppo, bandpo at
               512 x 16384 (CUDA; --cpu: 4 x 512), with and without metrics, as ratios to grpo
               and to the plain PPO clip in the same run, plus peak memory above the inputs (CUDA);
               and a torch.compile'd loss (kept only if exact and faster; --cpu: dynamo with the
               "eager" backend, i.e. tracing only, never timed as a verdict).
  slime        slime's own loss_function (world size 1; NCCL on CUDA, gloo on the CPU) with
               --loss-type custom_loss and the project's loss, against the core on log-probs
               computed here from the same logits: loss and logit gradients.
  graph        (CUDA only, last) CUDA-graph capture of forward + backward (validate=False, no
               metrics) of every mode and of the plain PPO clip (the control), replayed against eager.

Host syncs found by the detector fail the run only with --require-sync-free (see docs/losses.md
"Performance on a GPU" for the current findings); every other failed check gives exit status 1.

slime and megatron-core (the slime section; nothing is fetched): slime's source is the first of
--slime-path, $SLIME_PATH, bench/slime-624b824a, ../shared/vendor/slime-624b824a (beside the repo);
megatron-core is imported if installed, else installed with pip --no-index --no-deps into a
temporary folder from a megatron_core-0.16.1 wheel in --wheel-dir (default bench/wheels/).

The sections are modules of bench/gpu_check_sections/ (one each; common.py: sizes, inputs and the
error measure; report.py: the table); this file is the entry point and its flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

BENCH_DIR = Path(__file__).resolve().parent
# A checkout run as `python bench/gpu_check.py` measures its own package (not an installed copy),
# and the sections import bench/loss_bench.py.
sys.path.insert(0, str(BENCH_DIR.parent))
sys.path.insert(0, str(BENCH_DIR))
from gpu_check_sections.common import CPU_SIZES, GPU_SIZES, SECTIONS  # noqa: E402
from gpu_check_sections.correctness import section_correctness  # noqa: E402
from gpu_check_sections.graph import section_graph  # noqa: E402
from gpu_check_sections.host_sync import section_sync  # noqa: E402
from gpu_check_sections.kl_bounds import section_bounds  # noqa: E402
from gpu_check_sections.report import print_table  # noqa: E402
from gpu_check_sections.slime_loss import section_slime  # noqa: E402
from gpu_check_sections.speed import run_compile_one, section_speed  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="small sizes on the CPU; CUDA-only parts skipped")
    parser.add_argument("--sections", nargs="*", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument("--out", default=None, help="JSON of all figures (default gpu_check_<device>.json here)")
    parser.add_argument("--slime-path", default=None)
    parser.add_argument("--wheel-dir", default=str(BENCH_DIR / "wheels"))
    parser.add_argument(
        "--compile-modes",
        nargs="*",
        default=None,
        help="modes with a torch.compile'd variant (default: grpo epic; --cpu: epic)",
    )
    parser.add_argument(
        "--compile-timeout-s",
        type=float,
        default=100.0,
        help="cut off a compiled variant (compile + timing, own process) after this",
    )
    parser.add_argument("--compile-one", default=None, help=argparse.SUPPRESS)  # internal: one compiled variant
    parser.add_argument(
        "--require-sync-free",
        action="store_true",
        help="fail when the sync detector finds a host sync (default: report it)",
    )
    args = parser.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --cpu")
    device = "cpu" if args.cpu else "cuda"
    sizes = CPU_SIZES if args.cpu else GPU_SIZES
    if args.compile_modes is None:
        args.compile_modes = ["epic"] if args.cpu else ["grpo", "epic"]
    if args.compile_one:
        return run_compile_one(args.compile_one, device, sizes, Path(args.out))
    results = dict(
        device=device,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        torch=torch.__version__,
        device_name=torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        sizes=dataclasses.asdict(sizes),
        sections={},
        seconds={},
    )
    for name in args.sections:
        start = time.perf_counter()
        try:
            if name == "correctness":
                section = section_correctness(device, sizes)
            elif name == "bounds":
                section = section_bounds(device, sizes)
            elif name == "sync":
                section = section_sync(device, sizes, args.require_sync_free)
            elif name == "graph":
                section = section_graph(device, sizes, args.require_sync_free)
            elif name == "speed":
                section = section_speed(device, sizes, args.compile_modes, args.compile_timeout_s)
            else:
                section = section_slime(device, sizes, args.slime_path, Path(args.wheel_dir))
        except Exception as exc:  # noqa: BLE001 - one broken section must not cost the others' figures
            section = dict(status="fail", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        results["sections"][name] = section
        results["seconds"][name] = time.perf_counter() - start
        print(f"[{name}] {section['status']} in {results['seconds'][name]:.1f} s", flush=True)
    out = Path(args.out or f"gpu_check_{device}.json")
    out.write_text(json.dumps(results, indent=1, default=str))
    print_table(results)
    failed = [n for n, s in results["sections"].items() if s["status"] == "fail"]
    print(f"\nwrote {out}; " + (f"FAILED: {', '.join(failed)}" if failed else "all checks passed or skipped"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
