"""CPU time of the embedded runtime's per-step work, in whichever tree is first on PYTHONPATH (issue 34).

    PYTHONPATH=TREE python bench/runtime_cpu_bench.py [--repeats 5] [--loss-repeats 200] [--json OUT]
    python bench/runtime_cpu_pairs.py [--old-tree DIR] [--pairs 5]     # this tree interleaved with an older one

Why CPU time: on 2 shared cores a wall-clock A/B of the async loop is at the mercy of the load; the
CPU seconds a call burns on one thread (torch threads 1, `time.process_time`) barely move with it.
What is timed, on the default config (configs/local/default.yaml) from its cached warm start:
  - generate: one rollout worker's request (`PolicyEngine.generate`, B / workers prompts x n samples);
  - train_step: the trainer actor's step on one batch (group advantages + `PolicyTrainer.train_step`:
    D minibatches, forward, loss with its metrics, backward, AdamW), a fresh trainer per repeat;
  - loss / loss_no_metrics: `compute_policy_loss` of one minibatch (forward only) with and without
    `compute_metrics`: their difference is the metrics' cost, once per minibatch;
  - select_batch: the driver's batch selection from a buffer of two batches.
Each line prints the median CPU ms per call and the min-max over the repeats. The inputs are the same
in every tree (same warm start, seeds and problems): `inputs` prints a hash of the batch's tokens.
"""

from __future__ import annotations

import argparse
import collections
import copy
import hashlib
import inspect
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

os.environ.setdefault("EPIC_SLIME_TORCH_THREADS", "1")


def _cpu_ms(fn, repeats: int, setup=None) -> list[float]:
    out = []
    for _ in range(repeats):
        arg = setup() if setup else None
        t0 = time.process_time()
        fn(arg) if setup else fn()
        out.append((time.process_time() - t0) * 1e3)
    return out


def _line(name: str, ms: list[float]) -> dict:
    med = statistics.median(ms)
    print(f"{name:16s} {med:9.2f} ms CPU (min {min(ms):.2f}, max {max(ms):.2f}, n {len(ms)})", flush=True)
    return {"median_ms": med, "min_ms": min(ms), "max_ms": max(ms), "n": len(ms)}


def _metrics_only(lp, behavior, adv, mask, cfg, params, repeats: int) -> dict:
    """`policy_loss_metrics` alone on the minibatch's inputs, and (where the tree has them) the parts issue 34
    asked about: abs_L_p50/p90_position and grad_removed_frac."""
    import torch

    from epic_slime.losses import metrics as lm
    from epic_slime.losses import policy_loss as pl

    seen = {}
    real = pl.policy_loss_metrics

    def grab(batch, terms, clipped, *a, **k):  # the arguments compute_policy_loss passes, kept for the timing
        seen.update(batch=batch, terms=terms, clipped=clipped, a=a, k=k)
        return real(batch, terms, clipped, *a, **k)

    pl.policy_loss_metrics = grab
    try:
        pl.compute_policy_loss(
            cfg.policy_loss, lp, behavior, adv, mask, aggregation=cfg.policy_loss_aggregation, **params
        )
    finally:
        pl.policy_loss_metrics = real
    b, t, c = seen["batch"], seen["terms"], seen["clipped"]
    out = {}
    with torch.no_grad():
        out["all"] = _line("metrics", _cpu_ms(lambda: real(b, t, c, *seen["a"], **seen["k"]), repeats))
        if hasattr(lm, "_prefix_at_positions"):

            def new_parts():
                lm._prefix_at_positions(b)
                removed, total = (x.to(torch.float64) for x in lm._removed_gradient_sums(b, t))
                torch.where(total > 0, removed / total.clamp(min=1e-300), 0.0)

            out["new_parts"] = _line("metrics_new", _cpu_ms(new_parts, repeats))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="repeats of generate and train_step")
    ap.add_argument("--loss-repeats", type=int, default=200, help="repeats of the loss and select_batch")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)

    import torch

    from epic_slime.losses import compute_policy_loss
    from epic_slime.runtime.config import parse_config
    from epic_slime.runtime.model import response_log_probs
    from epic_slime.runtime.rollout import PolicyEngine
    from epic_slime.runtime.tasks import train_problem
    from epic_slime.runtime.threads import set_torch_threads
    from epic_slime.runtime.trainer import PolicyTrainer, group_advantages, pad_rows
    from epic_slime.runtime.warmstart import warm_start_for
    from epic_slime.runtime.batches import select_batch

    set_torch_threads(1)
    import epic_slime

    tree = str(Path(epic_slime.__file__).resolve().parents[1])
    commit = subprocess.run(
        ["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"tree {tree} ({commit}), torch threads {torch.get_num_threads()}", flush=True)

    cfg = parse_config(["--config", str(Path(tree) / "configs/local/default.yaml")])  # the tree's own config
    state, _ = warm_start_for(cfg)
    per_request = max(1, cfg.rollout_batch_size // cfg.num_rollout_workers)
    sampling = dict(
        n_samples=cfg.n_samples_per_prompt,
        temperature=cfg.rollout_temperature,
        top_p=cfg.rollout_top_p,
        max_new_tokens=cfg.rollout_max_response_len,
        seed=cfg.seed,
    )
    engine = PolicyEngine(cfg.model, state, 0, dtype=cfg.rollout_dtype, seed=cfg.seed)
    requests = [
        [(g, train_problem(g, cfg.seed, cfg.task)) for g in range(i * per_request, (i + 1) * per_request)]
        for i in range(cfg.num_rollout_workers)
    ]
    groups = [g for req in requests for g in engine.generate(req, **sampling)]
    digest = hashlib.sha256(repr([(s["response_ids"], s["reward"]) for g in groups for s in g.samples]).encode())
    n_tokens = sum(len(s["response_ids"]) for g in groups for s in g.samples)
    print(f"inputs: {len(groups)} groups, {n_tokens} response tokens, sha256 {digest.hexdigest()[:12]}", flush=True)

    res = {"tree": tree, "commit": commit, "inputs_sha256": digest.hexdigest()}
    res["generate"] = _line("generate", _cpu_ms(lambda: engine.generate(requests[0], **sampling), args.repeats))

    kwargs = dict(
        model_cfg=cfg.model,
        policy_loss=cfg.policy_loss,
        policy_loss_params=cfg.policy_loss_params,
        policy_loss_aggregation=cfg.policy_loss_aggregation,
        update_depth=cfg.update_depth,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        clip_grad=cfg.clip_grad,
        kl_loss_coef=cfg.kl_loss_coef if cfg.use_kl_loss else 0.0,
        temperature=cfg.rollout_temperature,
        seed=cfg.seed,
    )

    def trainer_step(trainer) -> None:  # what the Trainer actor does with a batch of groups
        samples = [
            {**s, "advantage": a}
            for g in groups
            for s, a in zip(g.samples, group_advantages([s["reward"] for s in g.samples]))
        ]
        trainer.train_step(samples)

    res["train_step"] = _line(
        "train_step", _cpu_ms(trainer_step, args.repeats, setup=lambda: PolicyTrainer(init_state=state, **kwargs))
    )

    # one minibatch of the loss, forward only, as the trainer calls it
    mb = [s for g in groups for s in g.samples][: cfg.samples_per_step // cfg.update_depth]
    trainer = PolicyTrainer(init_state=state, **kwargs)
    with torch.no_grad():
        lp, mask = response_log_probs(
            trainer.model,
            [s["prompt_ids"] for s in mb],
            [s["response_ids"] for s in mb],
            cfg.rollout_temperature,
            trainer.tok.pad_id,
        )
    # off-policy by a little (<= 0 stays a log-prob), as in the later minibatches of a step
    lp = (lp - 0.02 * torch.rand(lp.shape, generator=torch.Generator().manual_seed(0))).requires_grad_(True)
    behavior = pad_rows([s["behavior_log_probs"] for s in mb], lp.shape[1])
    adv = torch.tensor(group_advantages([s["reward"] for s in mb]), dtype=torch.float32)
    params = dict(cfg.policy_loss_params)

    def loss(metrics: bool):
        return lambda: compute_policy_loss(
            cfg.policy_loss,
            lp,
            behavior,
            adv,
            mask,
            compute_metrics=metrics,
            aggregation=cfg.policy_loss_aggregation,
            **params,
        )

    for _ in range(20):  # warm the allocator and the dispatcher before timing
        loss(True)()
    res["loss"] = _line("loss", _cpu_ms(loss(True), args.loss_repeats))
    res["loss_no_metrics"] = _line("loss_no_metrics", _cpu_ms(loss(False), args.loss_repeats))
    res["metrics"] = _metrics_only(lp, behavior, adv, mask, cfg, params, args.loss_repeats)

    buffer = collections.deque(groups + [copy.copy(g) for g in groups])
    start_order = "first_unfinished" in inspect.signature(select_batch).parameters

    def select(buf) -> None:
        extra = {"first_unfinished": None} if start_order else {}
        select_batch(buf, 1, cfg.rollout_batch_size, cfg.max_staleness, cfg.stale_policy, **extra)

    res["select_batch"] = _line(
        "select_batch", _cpu_ms(select, args.loss_repeats, setup=lambda: collections.deque(buffer))
    )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
