"""The embedded runtime: its measured times as a preset, the measurement itself, and the validation."""

from __future__ import annotations

import json
from pathlib import Path

from .presets import runtime_preset
from .schedules import simulate

ROOT = Path(__file__).resolve().parents[2]


def measure_runtime(steps: int, out: Path, config: str) -> dict:
    """Times one generation request and one train step of the runtime's config in this process (one thread,
    alone), then runs the runtime itself (async, then sync) and records its measured async/sync ratio."""
    import statistics
    import tempfile
    import time

    import torch

    from epic_slime.runtime.config import parse_config
    from epic_slime.runtime.driver import run_training
    from epic_slime.runtime.rollout import PolicyEngine
    from epic_slime.runtime.tasks import train_problem
    from epic_slime.runtime.trainer import PolicyTrainer, group_advantages
    from epic_slime.runtime.warmstart import warm_start_for

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="epic_slime_schedsim_"))
    cfg = parse_config(["--config", config, "--output-dir", str(root / "probe")])
    state, _ = warm_start_for(cfg)
    engine = PolicyEngine(cfg.model, state, 0, dtype=cfg.rollout_dtype, seed=cfg.seed)
    per_request = max(1, cfg.rollout_batch_size // cfg.num_rollout_workers)
    sampling = dict(
        n_samples=cfg.n_samples_per_prompt,
        temperature=cfg.rollout_temperature,
        top_p=cfg.rollout_top_p,
        max_new_tokens=cfg.rollout_max_response_len,
        seed=cfg.seed,
    )
    gen_s, groups = [], []
    for i in range(6):
        reqs = [(j, train_problem(j, cfg.seed, cfg.task)) for j in range(i * per_request, (i + 1) * per_request)]
        t = time.perf_counter()
        groups += engine.generate(reqs, **sampling)
        gen_s.append(time.perf_counter() - t)
    trainer = PolicyTrainer(
        model_cfg=cfg.model,
        init_state=state,
        **{
            k: v
            for k, v in dict(
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
                on_bad_tokens=cfg.on_bad_tokens,
                max_bad_token_frac=cfg.max_bad_token_frac,
            ).items()
        },
    )
    train_s = []
    for i in range(4):
        batch = groups[(i % 3) * cfg.rollout_batch_size // 2 :][: cfg.rollout_batch_size]
        if len(batch) < cfg.rollout_batch_size:
            batch = groups[: cfg.rollout_batch_size]
        samples = [
            {**s, "advantage": a}
            for g in batch
            for s, a in zip(g.samples, group_advantages([s["reward"] for s in g.samples]))
        ]
        t = time.perf_counter()
        trainer.train_step(samples)
        train_s.append(time.perf_counter() - t)
    mean_len = statistics.fmean(len(s["response_ids"]) for g in groups for s in g.samples)
    common = [
        "--config",
        config,
        "--num-rollout",
        str(steps),
        "--eval-interval",
        "0",
        "--no-plots",
        "--no-progress",
        "--save-interval",
        "0",
    ]
    rates = {}
    for mode in ("async", "sync"):
        run_training(parse_config([*common, "--rollout-mode", mode, "--output-dir", str(root / mode)]))
        rows = [json.loads(ln) for ln in (root / mode / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        seconds = rows[-1]["time/elapsed_s"] - rows[0]["time/elapsed_s"]
        rates[mode] = (rows[-1]["accounting/trained"] - rows[0]["accounting/trained"]) / seconds
    import os

    result = dict(
        config=str(Path(config).resolve().relative_to(ROOT)) if Path(config).resolve().is_relative_to(ROOT) else config,
        steps=steps,
        cores=len(os.sched_getaffinity(0)),
        num_rollout_workers=cfg.num_rollout_workers,
        rollout_batch_size=cfg.rollout_batch_size,
        n_samples_per_prompt=cfg.n_samples_per_prompt,
        update_depth=cfg.update_depth,
        max_staleness=cfg.max_staleness,
        gen_request_s=statistics.median(gen_s[1:]),
        train_step_s=statistics.median(train_s[1:]),
        mean_response_len=mean_len,
        gen_request_samples=gen_s,
        train_step_samples=train_s,
        trained_per_s=rates,
        measured_async_over_sync=rates["async"] / rates["sync"],
        command=f"python bench/schedule_sim.py measure-runtime --steps {steps} --out {out}",
    )
    out.write_text(json.dumps(result, indent=1))
    return result


def runtime_validation(m: dict, rollouts: int = 16) -> dict:
    p = runtime_preset(m)
    sync = simulate(p, "sync split", rollouts)
    asyn = simulate(p, "async K=2" if m.get("max_staleness", 2) >= 2 else "async K=1", rollouts)
    return dict(
        simulated=sync["s_per_rollout"] / asyn["s_per_rollout"],
        measured=m["measured_async_over_sync"],
        sync_s=sync["s_per_rollout"],
        async_s=asyn["s_per_rollout"],
    )
