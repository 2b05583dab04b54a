"""The throughput bound of a split: engines at full KV occupancy, training overlapped with generation.

    bound s/rollout = max(generation tokens / fleet throughput (+ prompt prefill), train time) + push

Fleet throughput: every engine decoding with its KV cache full of contexts of the mean length a token
is decoded at (prompt + E[L^2] / 2 E[L]), so batch = capacity / that length and a step costs
t_base + c_tok x batch + c_kv x capacity. No schedule beats it: a rollout's tokens must be decoded and
its batch trained, and a push stops decoding (abort) or pauses it (in place) either way."""

from __future__ import annotations

import random

from .engine import draw_length, solve_mu, train_seconds
from .presets import Preset


def length_sample(p: Preset, n: int = 20000) -> list[int]:
    """Response lengths drawn as the simulator draws them (groups of n_samples share a prompt effect)."""
    if p.fixed_length is not None:
        return [p.fixed_length] * n
    rng, effects = random.Random(p.seed + 7919), {}
    mu = solve_mu(p.mean_response_len, p.length_sigma, p.max_response_len)
    return [min(draw_length(p, mu, rng, effects, i // p.n_samples), p.max_response_len) for i in range(n)]


def engine_full_throughput(p: Preset, lengths: list[int]) -> float:
    """Tokens/s of one engine at full KV occupancy."""
    ctx = p.prompt_len + sum(x * x for x in lengths) / (2 * sum(lengths))
    if p.fixed_length is not None:
        return p.decode_speed / p.c_tok
    batch = p.kv_capacity_tokens / ctx
    step = p.t_base + p.c_tok * batch + p.c_kv * p.kv_capacity_tokens
    return batch / step * p.decode_speed


def throughput_bound(p: Preset, rollout_gpus: int, train_gpus: int, push_s: float) -> dict:
    lengths = length_sample(p)
    engines = max(1, rollout_gpus // p.gpus_per_engine)
    per_engine = engine_full_throughput(p, lengths)
    samples = p.rollout_batch_size * p.n_samples
    mean = sum(lengths) / len(lengths)
    gen_s = samples * mean / (engines * per_engine) + samples * p.prompt_len / (engines * p.engine_prefill_tok_s())
    fixed = p.update_depth * p.optimizer_step_s if p.train_s_fixed is None else 0.0
    train_s = (train_seconds(p, train_gpus, lengths) - fixed) * samples / len(lengths) + fixed
    if p.train_s_fixed is not None:
        train_s = p.train_s_fixed
    return dict(
        bound_s=max(gen_s, train_s) + push_s,
        gen_s=gen_s,
        train_s=train_s,
        push_s=push_s,
        engine_tok_s=per_engine,
        engines=engines,
        tokens_per_rollout=samples * mean,
    )


def bound_for(p: Preset, row: dict, warmup: int = 2) -> dict:
    """The bound of the split a simulated row ran on (colocated: generation and training take turns),
    scaled to the tokens its steady-state batches actually held (a 10-rollout window's batches differ
    from the expected length distribution by a few percent)."""
    rollout, train = (int(x) for x in row["split"].split(":"))
    colocated = row["schedule"] == "sync colocated"
    b = throughput_bound(p, rollout, train, p.push_s_colocated if colocated else p.push_s_split)
    steady = [v["tokens"] for r, v in row.get("batches", {}).items() if r >= warmup]
    scale = (sum(steady) / len(steady)) / b["tokens_per_rollout"] if steady else 1.0
    gen_s, train_s = b["gen_s"] * scale, b["train_s"] * scale
    if colocated:
        bound_s = gen_s + train_s + p.push_s_colocated + 3 * p.offload_s
    else:
        bound_s = max(gen_s, train_s) + b["push_s"]
    return dict(b, bound_s=bound_s, gen_s=gen_s, train_s=train_s, token_scale=scale)
