"""Calibration of a mismatch level before any run (issue 47): for a study setting's warm start and a list
of rollout router-noise sigmas, the rollout engine's behaviour against the trainer's recomputation on the
same sampled responses, before any update:

- gap: mean |log pi_train - log mu_rollout| per response token (the paper's Fig. 6d quantity);
- per-token KL(mu || pi), two sample estimates on the rollout's own tokens (unbiased for the mean
  per-token KL over the sampled prefixes): k1 = mean(log mu - log pi) and k3 = mean(r - 1 - log r),
  r = pi / mu (k3 is never negative and has the lower variance; the table reports k3);
- rollout reward: the behaviour policy's mean reward on those responses, the quantity the gate compares
  with the clean level (`GATE_FRACTION` of sigma 0).

`python -m epic_slime.study.calibration --config C.yaml --setting S --sigmas 0 0.1 ... --out F.jsonl`
appends one JSON line per sigma (a sigma already in F is skipped, so an interrupted calibration resumes).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

GATE_FRACTION = 0.75  # a level whose rollout reward is below this fraction of the clean level's is not run
GATE_TOLERANCE = 1e-12  # rewards are fractions k / n: 0.75 * 0.4 is 0.30000000000000004 in floats


def meets_gate(reward: float, clean: float, fraction: float = GATE_FRACTION) -> bool:
    """At least `fraction` of the clean level's reward; exactly at the threshold passes."""
    return reward >= fraction * clean - GATE_TOLERANCE


def level_statistics(trainer_lp, behaviour_lp, mask) -> dict:
    """gap, k1 and k3 per token from [B, T] log-prob tensors and a {0, 1} mask of response tokens."""
    import torch

    n = mask.sum()
    if float(n) == 0:
        raise ValueError("calibration: no response tokens to measure (every response empty)")
    delta = (trainer_lp - behaviour_lp) * mask  # log r, r = pi / mu
    k3 = (torch.expm1(delta) - delta) * mask
    return {
        "gap_abs_mean": float(delta.abs().sum() / n),
        "kl_k1": float(-delta.sum() / n),
        "kl_k3": float(k3.sum() / n),
        "tokens": int(n),
    }


def measure_level(run_cfg, state: dict, sigma: float, seeds: list[int], prompts: int) -> dict:
    """One noise level: sample `prompts` training prompts x the run's n_samples_per_prompt per seed with
    the run's rollout sampling and `sigma` router noise, then recompute every response with the trainer's
    noiseless model (fp32)."""
    import torch

    from epic_slime.runtime.model import build_policy, response_log_probs
    from epic_slime.runtime.rollout import PolicyEngine
    from epic_slime.runtime.task import Tokenizer
    from epic_slime.runtime.tasks import train_problem

    t0 = time.time()
    tok = Tokenizer()
    trainer = build_policy(run_cfg.model, tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, 0)
    trainer.load_state_dict(state)
    trainer.eval()
    stats, rewards, reward_by_seed = [], [], {}
    for seed in seeds:
        engine = PolicyEngine(run_cfg.model, state, 0, dtype=run_cfg.rollout_dtype, seed=seed, router_noise=sigma)
        reqs = [(i, train_problem(i, seed, run_cfg.task)) for i in range(prompts)]
        groups = engine.generate(
            reqs,
            n_samples=run_cfg.n_samples_per_prompt,
            temperature=run_cfg.rollout_temperature,
            top_p=run_cfg.rollout_top_p,
            max_new_tokens=run_cfg.rollout_max_response_len,
            seed=seed,
        )
        batch = [s for g in groups for s in g.samples]
        with torch.no_grad():
            lp, mask = response_log_probs(
                trainer,
                [s["prompt_ids"] for s in batch],
                [s["response_ids"] for s in batch],
                run_cfg.rollout_temperature,
                tok.pad_id,
            )
        mu = torch.zeros_like(lp)
        for i, s in enumerate(batch):
            mu[i, : len(s["behavior_log_probs"])] = torch.tensor(s["behavior_log_probs"])
        stats.append(level_statistics(lp, mu, mask))
        seed_rewards = [float(s["reward"]) for s in batch]
        reward_by_seed[str(seed)] = sum(seed_rewards) / len(seed_rewards)
        rewards += seed_rewards
    tokens = sum(s["tokens"] for s in stats)
    pooled = {k: sum(s[k] * s["tokens"] for s in stats) / tokens for k in ("gap_abs_mean", "kl_k1", "kl_k3")}
    return {
        "sigma": sigma,
        **pooled,
        "tokens": tokens,
        "rollout_reward": sum(rewards) / len(rewards),
        "rollout_reward_by_seed": reward_by_seed,
        "responses": len(rewards),
        "wall_s": time.time() - t0,
    }


def gate(levels: list[dict], fraction: float = GATE_FRACTION) -> list[dict]:
    """Each level with `passes`: its rollout reward at least `fraction` of the clean level's (sigma 0).
    Exactly at the threshold passes."""
    clean = [lv for lv in levels if lv["sigma"] == 0]
    if len(clean) != 1:
        raise ValueError(f"calibration gate: needs exactly one clean level (sigma 0), got {len(clean)}")
    threshold = fraction * clean[0]["rollout_reward"]
    return [
        {
            **lv,
            "gate_threshold": threshold,
            "passes": meets_gate(lv["rollout_reward"], clean[0]["rollout_reward"], fraction),
        }
        for lv in levels
    ]


def interpolate_sigma(levels: list[dict], key: str, target: float) -> float | None:
    """The sigma at which `key` reaches `target`, linear in log(key) between the two measured levels that
    bracket it (the gap grows roughly exponentially in sigma); None when no measured pair brackets it."""
    pts = sorted((lv["sigma"], lv[key]) for lv in levels if lv[key] > 0)
    for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
        if min(v0, v1) <= target <= max(v0, v1):
            if v0 == v1:
                return s0
            w = (math.log(target) - math.log(v0)) / (math.log(v1) - math.log(v0))
            return s0 + w * (s1 - s0)
    return None


# The targets, each matched on one measured quantity (the toy's router noise gives about 0.3 nats of
# KL per nat of mean |delta| at these levels, the 30B-A3B MoE 0.03-0.12, so the two cannot be matched at once):
# the real engine's gap on this model, then the per-token KL reported at scale (what EPIC's lower budget sees:
# bench/epic_mismatch_budget.py).
TARGETS = (
    ("engine", "gap_abs_mean", 0.001),
    ("r3_low", "kl_k3", 2e-4),
    ("r3_high", "kl_k3", 5e-4),
    ("no_r3", "kl_k3", 1.5e-3),
)


def choose_levels(levels: list[dict], targets=TARGETS) -> list[dict]:
    """For each target the measured sigma nearest to it in log scale (ties: the smaller sigma), then the
    strongest level: the largest measured sigma below the smallest one that fails the gate (rewards are
    noisy: a pass above a failure does not count). A target whose nearest level fails the gate is
    reported with passes False (not run)."""
    gated = {lv["sigma"]: lv for lv in gate(levels)}
    noisy = [lv for lv in gated.values() if lv["sigma"] > 0]
    chosen = []
    for name, key, value in targets:
        best = min(noisy, key=lambda lv: (abs(math.log(max(lv[key], 1e-30) / value)), lv["sigma"]))
        chosen.append({"level": name, "matched_on": key, "target": value, **best})
    first_fail = min((lv["sigma"] for lv in noisy if not lv["passes"]), default=math.inf)
    passing = [lv for lv in noisy if lv["passes"] and lv["sigma"] < first_fail]
    if passing:
        strongest = max(passing, key=lambda lv: lv["sigma"])
        chosen.append({"level": "strongest", "matched_on": "rollout_reward", "target": None, **strongest})
    return chosen


def calibration_table(levels: list[dict]) -> list[str]:
    clean = next(lv for lv in levels if lv["sigma"] == 0)["rollout_reward"]
    lines = [
        "| sigma | gap (mean abs log-ratio) | KL k3 | KL k1 | rollout reward | of clean | gate | responses |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for lv in sorted(gate(levels), key=lambda lv: lv["sigma"]):
        lines.append(
            f"| {lv['sigma']:g} | {lv['gap_abs_mean']:.2e} | {lv['kl_k3']:.2e} | {lv['kl_k1']:.2e} | "
            f"{lv['rollout_reward']:.3f} | {lv['rollout_reward'] / clean:.0%} | "
            f"{'passes' if lv['passes'] else '**fails**'} | {lv['responses']} |"
        )
    return lines


def write_report(directory: Path) -> Path:
    """calibration.md from every calibration_<length>.jsonl of a study directory: the table, the gate and
    the levels `choose_levels` picks."""
    lines = [
        "# Calibration of the mismatch levels (generated: python -m epic_slime.study.calibration --report DIR)",
        "",
    ]
    for path in sorted(directory.glob("calibration_*.jsonl"), key=lambda p: int(p.stem.split("_")[1])):
        levels = [json.loads(line) for line in path.read_text().splitlines() if line]
        if not any(lv["sigma"] == 0 for lv in levels):
            continue
        length = path.stem.split("_")[1]
        lines += [f"## {length} response tokens ({path.name}, setting {levels[0]['setting']})", ""]
        lines += calibration_table(levels) + [""]
        lines += [
            "| level | matched on | target | sigma | measured | rollout reward | gate |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in choose_levels(levels):
            target = "" if c["target"] is None else f"{c['target']:g}"
            measured = f"{c[c['matched_on']]:.3g}"
            lines.append(
                f"| {c['level']} | {c['matched_on']} | {target} | {c['sigma']:g} | {measured} | "
                f"{c['rollout_reward']:.3f} | {'passes' if c['passes'] else '**fails** (not run)'} |"
            )
        lines.append("")
    out = directory / "calibration.md"
    out.write_text("\n".join(lines))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m epic_slime.study.calibration", description=__doc__)
    p.add_argument("--report", metavar="DIR", help="only write DIR/calibration.md from DIR/calibration_*.jsonl")
    p.add_argument("--config")
    p.add_argument("--setting")
    p.add_argument("--sigmas", type=float, nargs="+")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--prompts", type=int, default=8, help="training prompts per seed (the run's first batch)")
    p.add_argument("--out")
    p.add_argument(
        "--warm-start-dir", default="docs/study/mechanism/warm_start", help="the study's warm-start cache (committed)"
    )
    a = p.parse_args(argv)
    if a.report:
        print(write_report(Path(a.report)))
        return 0
    missing = [f"--{k}" for k in ("config", "setting", "sigmas", "out") if getattr(a, k) is None]
    if missing:
        p.error(f"{', '.join(missing)} required (or --report DIR)")

    import torch

    from epic_slime.runtime.config import parse_config
    from epic_slime.runtime.warmstart import warm_start_for

    from .plan import load_study_config, plan, run_argv

    torch.set_num_threads(1)
    cfg = load_study_config(a.config)
    specs = [s for s in plan(cfg) if s.setting == a.setting]
    if not specs:
        p.error(f"--setting {a.setting!r} is not a setting of {a.config}")
    run_cfg = parse_config(run_argv(cfg, specs[0], Path("/tmp/epic-slime-calibration"), Path(a.warm_start_dir)))
    state, provenance = warm_start_for(run_cfg)
    out = Path(a.out)
    done = {json.loads(line)["sigma"] for line in out.read_text().splitlines() if line} if out.exists() else set()
    for sigma in a.sigmas:
        if sigma in done:
            continue
        row = {
            "setting": a.setting,
            "warm_start": provenance,
            **measure_level(run_cfg, state, sigma, a.seeds, a.prompts),
        }
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
