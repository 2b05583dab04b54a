"""R3 routing payload per train rank and per node, slime 624b824a's way and the project's.

    python bench/r3_payload.py            # the paper's setting (defaults below)

Arithmetic, no slime needed. slime's way: routing decoded as int32 and each DP partition's whole
list deserialised by every rank of that DP group; evaluation requests ask for routing too. The
project's (``epic_slime.slime.routing``): uint8 for <= 256 experts, each rank fetches only the rows
its CP x TP slice replays (padding rows aside, measured at this shape by
tests/slime_adapter/test_slime_routing.py), no routing for evaluation. Defaults: Qwen3-30B-A3B (48 MoE layers,
top-8 of 128), 512 samples of 9k tokens per rollout, 16 train GPUs (2 nodes of 8), TP 4, CP 1,
PP 1; eval 130 prompts (AIME24/25, AMC23, HMMT25) x 8 samples of 9k tokens.
"""

from __future__ import annotations

import argparse

from epic_slime.slime.routing import KEEP_ROLLOUTS, routing_dtype

GB = 1e9


def payload(a) -> dict[str, float]:
    """Bytes (GB) per rank and per node, before and after."""
    int32_token = a.layers * a.topk * 4
    after_token = a.layers * a.topk * routing_dtype(a.experts).itemsize
    model_parallel = a.tp * a.cp * a.pp
    if a.train_gpus % model_parallel or a.train_gpus % a.gpus_per_node:
        raise ValueError(
            f"--train-gpus {a.train_gpus} must be a multiple of TP*CP*PP={model_parallel} "
            f"and of --gpus-per-node {a.gpus_per_node}"
        )
    dp = a.train_gpus // model_parallel
    tokens = a.samples * a.tokens
    partition = tokens / dp  # tokens in one DP partition
    out = {
        "bytes_per_token_before": int32_token,
        "bytes_per_token_after": after_token,
        "dp": dp,
        "batch_gb_int32": tokens * int32_token / GB,
        "rank_before_gb": partition * int32_token / GB,
        "rank_needed_int32_gb": partition / (a.tp * a.cp) * int32_token / GB,
        "rank_after_gb": partition / (a.tp * a.cp) * after_token / GB,
        "eval_before_gb": a.eval_samples * a.tokens * int32_token / GB,
        "eval_after_gb": 0.0,
        "store_held_gb": KEEP_ROLLOUTS * tokens * after_token / GB,
    }
    for key in ("rank_before_gb", "rank_needed_int32_gb", "rank_after_gb"):
        out[key.replace("rank_", "node_")] = out[key] * a.gpus_per_node
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--samples", type=int, default=512, help="samples per rollout batch (64 prompts x 8)")
    p.add_argument("--tokens", type=int, default=9000, help="tokens per sample (prompt + response)")
    p.add_argument("--train-gpus", type=int, default=16)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--tp", type=int, default=4)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1, help="each PP stage receives the rows of all layers")
    p.add_argument("--eval-samples", type=int, default=130 * 8)
    a = p.parse_args(argv)
    r = payload(a)
    print(
        f"routing: {r['bytes_per_token_before']} B/token as int32 -> {r['bytes_per_token_after']} B/token; "
        f"batch {a.samples} x {a.tokens} tokens = {r['batch_gb_int32']:.2f} GB int32; DP {r['dp']}, TP {a.tp}, CP {a.cp}"
    )
    print(f"{'':26}{'slime 624b824a':>16}{'own slice int32':>17}{'epic-slime':>12}{'ratio':>8}")
    for where in ("rank", "node"):
        b, n, f = r[f"{where}_before_gb"], r[f"{where}_needed_int32_gb"], r[f"{where}_after_gb"]
        label = f"per train {where}" + (f" ({a.gpus_per_node} GPUs)" if where == "node" else "")
        print(f"{label:26}{b:13.2f} GB{n:14.2f} GB{f:9.2f} GB{b / f:7.0f}x")
    print(f"{'per evaluation':26}{r['eval_before_gb']:13.2f} GB{'':17}{r['eval_after_gb']:9.2f} GB")
    print(f"store (latest {KEEP_ROLLOUTS} rollouts, one process): {r['store_held_gb']:.2f} GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
