"""The trainer: GRPO advantages -> D minibatch updates with a policy loss from the core registry.

Data flow: groups (samples with behaviour log-probs) -> padded tensors -> log pi (recomputed with
gradients) -> compute_policy_loss(mode, log_pi, behavior_log_probs, advantages, mask) [+ k3 KL to a
frozen reference] -> AdamW step with gradient clipping. One call = one rollout step = one new
weight version."""

from __future__ import annotations

import copy
import math
import random

import torch

from epic_slime import metric_names as names
from epic_slime.losses.tis import tis_diagnostics, tis_weighted_loss, tis_weights
from .model import ModelConfig, build_policy, response_log_probs
from .task import Tokenizer


def group_advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """GRPO: (r - mean) / (std + eps) within a group (population std). All-equal groups get 0."""
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    return [(r - mean) / (std + eps) for r in rewards]


def pad_rows(rows: list[list[float]], width: int, value: float = 0.0) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
    return out


def topk_loss_inputs(
    samples: list[dict], responses: list[list[int]], behavior: torch.Tensor, current_log_probs_all: torch.Tensor
) -> dict:
    """DPPO Top-K inputs: the behaviour top-k set recorded by the worker plus the sampled token,
    with the trainer's log pi of the same ids (gathered from its full log-softmax)."""
    from epic_slime.losses.topk import behavior_topk_set

    if any("topk_ids" not in s for s in samples):
        raise ValueError(
            "a Top-K policy loss needs rollout samples with topk_ids (workers record them when "
            "the mode needs them; was the run resumed from samples generated for another mode?)"
        )
    B, T = behavior.shape
    k = len(samples[0]["topk_ids"][0])
    ids = torch.full((B, T, k), -1, dtype=torch.long)
    lps = torch.zeros((B, T, k), dtype=torch.float32)
    sampled = torch.zeros((B, T), dtype=torch.long)
    for i, (s, r) in enumerate(zip(samples, responses)):
        n = len(r)
        ids[i, :n] = torch.tensor(s["topk_ids"], dtype=torch.long)
        lps[i, :n] = torch.tensor(s["topk_log_probs"], dtype=torch.float32)
        sampled[i, :n] = torch.tensor(r, dtype=torch.long)
    ids_all, behavior_topk, topk_mask = behavior_topk_set(ids, lps, sampled, behavior)
    current = current_log_probs_all.gather(-1, ids_all.clamp(min=0))
    current = torch.where(topk_mask, current, 0.0)
    return {"behavior_topk_log_probs": behavior_topk, "current_topk_log_probs": current, "topk_mask": topk_mask}


def loss_mask_rows(samples: list[dict], width: int) -> torch.Tensor:
    """[B, width] bool: each sample's optional ``loss_mask`` (1 on model tokens, 0 on tool tokens of a
    multi-turn response; absent: every response token), padded with True (padding is masked anyway)."""
    rows = torch.ones((len(samples), width), dtype=torch.bool)
    for i, sample in enumerate(samples):
        values = sample.get("loss_mask")
        if values is None:
            continue
        n = len(sample["response_ids"])
        if len(values) != n:
            raise ValueError(f"sample {i}: loss_mask has {len(values)} entries for {n} response tokens")
        bad = next((v for v in values if v not in (0, 1)), None)
        if bad is not None:
            raise ValueError(f"sample {i}: loss_mask holds {bad!r}; it must be 0 or 1 per response token")
        rows[i, :n] = torch.tensor([bool(v) for v in values])
    return rows


def mean_token_entropy(log_probs_all: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over valid tokens of the policy's entropy -sum_v p_v log p_v ([B, T, V] log-softmax, [B, T] mask)."""
    p_log_p = torch.where(log_probs_all > -torch.inf, log_probs_all.exp() * log_probs_all, 0.0)
    entropy = -p_log_p.sum(-1)
    return (entropy * mask).sum() / mask.sum().clamp(min=1)


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear warmup: optimizer step k (from 0) runs at lr * (k + 1) / N while k < N, then at lr (N = 0: none).
    The first step is lr / N, not 0 (a zero-lr step would be a wasted update)."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    return (step + 1) / warmup_steps


def _scalar(v) -> float:
    return float(v.detach()) if isinstance(v, torch.Tensor) else float(v)


class PolicyTrainer:
    """Owns the policy, the frozen reference and AdamW. Plain Python; the Ray actor wraps it."""

    def __init__(
        self,
        *,
        model_cfg: ModelConfig,
        init_state: dict,
        policy_loss: str,
        policy_loss_params: dict,
        policy_loss_aggregation: str | None,
        update_depth: int,
        lr: float,
        weight_decay: float,
        clip_grad: float,
        kl_loss_coef: float,
        temperature: float,
        seed: int,
        on_bad_tokens: str = "raise",
        max_bad_token_frac: float = 0.01,
        kl_loss_type: str = "k3",
        adam_beta2: float = 0.999,
        lr_warmup_steps: int = 0,
        use_tis: bool = False,
        tis_clip: float = 2.0,
        behavior_logprobs: str = "rollout",
    ):
        self.tok = Tokenizer()
        self.model = build_policy(
            model_cfg, self.tok.vocab_size, self.tok.pad_id, self.tok.bos_id, self.tok.eos_id, seed
        )
        self.model.load_state_dict(init_state)
        self.model.train()
        self.ref = None
        if kl_loss_coef > 0:
            self.ref = copy.deepcopy(self.model).eval()
            for p in self.ref.parameters():
                p.requires_grad_(False)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, adam_beta2))
        self.base_lr, self.lr_warmup_steps, self.adam_steps = lr, lr_warmup_steps, 0
        self.kl_loss_type, self.use_tis, self.tis_clip = kl_loss_type, use_tis, tis_clip
        if behavior_logprobs not in ("rollout", "recompute"):
            raise ValueError(f"behavior_logprobs must be rollout or recompute, got {behavior_logprobs!r}")
        # The ratio's base: the engine's log-probs, or pi_old (the trainer's own at the step start). TIS needs pi_old.
        self.recompute = use_tis or behavior_logprobs == "recompute"
        self.policy_loss, self.policy_loss_params = policy_loss, dict(policy_loss_params)
        self.aggregation = policy_loss_aggregation
        self.update_depth, self.clip_grad, self.kl_loss_coef = update_depth, clip_grad, kl_loss_coef
        self.temperature = temperature
        self.bad_tokens = {"on_bad_tokens": on_bad_tokens, "max_bad_token_frac": max_bad_token_frac}
        self.rng = random.Random(f"trainer/{seed}")  # minibatch order
        self.version = 0

    # ---- weights and state ----
    def get_weights(self) -> dict:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def state(self) -> dict:
        return {
            "model": self.get_weights(),
            "optimizer": copy.deepcopy(self.opt.state_dict()),
            "ref": None if self.ref is None else {k: v.clone() for k, v in self.ref.state_dict().items()},
            "rng": self.rng.getstate(),
            "torch_rng": torch.get_rng_state(),
            "version": self.version,
            "adam_steps": self.adam_steps,
        }

    def load_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        if self.ref is not None and state.get("ref") is not None:
            self.ref.load_state_dict(state["ref"])
        self.rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        self.version = int(state["version"])
        self.adam_steps = int(state.get("adam_steps", 0))

    @torch.no_grad()
    def _old_log_probs(self, samples: list[dict], chunk: int = 64) -> dict[int, list[float]]:
        """The trainer's own log-probs of every sample before this step's first update (pi_old), by id."""
        out = {}
        for i in range(0, len(samples), chunk):
            part = samples[i : i + chunk]
            lp, _ = response_log_probs(
                self.model,
                [s["prompt_ids"] for s in part],
                [s["response_ids"] for s in part],
                self.temperature,
                self.tok.pad_id,
            )
            for s, row in zip(part, lp):
                out[id(s)] = row[: len(s["response_ids"])].tolist()
        return out

    # ---- one rollout step ----
    def train_step(self, samples: list[dict]) -> dict:
        """samples: dicts with prompt_ids, response_ids, behavior_log_probs, advantage. Returns metrics."""
        from epic_slime.losses import LOSS_MODES, aggregate_loss, compute_policy_loss
        from epic_slime.losses.kl import kl_penalty

        n = len(samples)
        if n % self.update_depth:
            raise ValueError(f"batch of {n} samples does not split into update_depth={self.update_depth} minibatches")
        order = list(range(n))
        self.rng.shuffle(order)
        mb_size = n // self.update_depth
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}

        def add(name, value):
            sums[name] = sums.get(name, 0.0) + _scalar(value)
            counts[name] = counts.get(name, 0) + 1

        old_lp = self._old_log_probs(samples) if self.recompute else {}
        first_gap = None
        bad_tokens = skipped = checked_tokens = 0
        skip = self.bad_tokens["on_bad_tokens"] == "skip"
        needs_topk = LOSS_MODES[self.policy_loss].needs_topk
        for d in range(self.update_depth):
            mb = [samples[i] for i in order[d * mb_size : (d + 1) * mb_size]]
            prompts = [s["prompt_ids"] for s in mb]
            responses = [s["response_ids"] for s in mb]
            log_probs, mask, *all_lp = response_log_probs(
                self.model, prompts, responses, self.temperature, self.tok.pad_id, return_all=True
            )
            T = log_probs.shape[1]
            mask = mask & loss_mask_rows(mb, T)  # tool tokens (loss mask 0) count nowhere below
            behavior = pad_rows([s["behavior_log_probs"] for s in mb], T)
            weights = None
            if self.recompute:  # the loss's ratio is to pi_old (this step's start); mu enters only through TIS
                rollout = behavior
                behavior = pad_rows([old_lp[id(s)] for s in mb], T)
            if self.use_tis:
                weights = tis_weights(behavior, rollout, mask, self.tis_clip)
                for k, v in tis_diagnostics(weights, mask, self.tis_clip).items():
                    add(f"train/{k}", v)
            adv = torch.tensor([s["advantage"] for s in mb], dtype=torch.float32)
            topk_kwargs = topk_loss_inputs(mb, responses, behavior, all_lp[0]) if needs_topk else {}
            out = compute_policy_loss(
                self.policy_loss,
                log_probs,
                behavior,
                adv,
                mask,
                aggregation=self.aggregation,
                **topk_kwargs,
                **self.bad_tokens,
                **self.policy_loss_params,
            )
            loss = (
                out.loss if weights is None else tis_weighted_loss(out.per_token_loss, weights, mask, out.aggregation)
            )
            bad_tokens += int(out.metrics["bad_tokens"])
            checked_tokens += int(mask.sum())
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"policy loss {self.policy_loss} is {float(loss)} at version {self.version}, minibatch {d}"
                )
            add(names.PG_LOSS, loss)
            add("train/entropy", mean_token_entropy(all_lp[0].detach(), mask))  # Fig. 6 of the paper
            for k, v in out.metrics.items():
                if k == "bad_tokens":
                    continue  # a count: summed over the step below, not averaged
                try:
                    add(names.policy_metric(k), v)
                except (TypeError, ValueError, RuntimeError):
                    pass  # non-scalar diagnostics (e.g. per-bin vectors) are not averaged here
            if self.ref is not None:
                with torch.no_grad():
                    ref_lp, _ = response_log_probs(self.ref, prompts, responses, self.temperature, self.tok.pad_id)
                # Padding (and skipped bad tokens) is zeroed before the estimator, so no inf/NaN can
                # reach the gradient.
                kl_mask = mask if out.bad is None else mask & ~out.bad
                k3 = kl_penalty(
                    log_probs.masked_fill(~kl_mask, 0.0), ref_lp.masked_fill(~kl_mask, 0.0), self.kl_loss_type
                )
                kl = aggregate_loss(k3, kl_mask, self.aggregation or "seq-mean-token-mean")
                loss = loss + self.kl_loss_coef * kl
                add(names.KL_LOSS, kl)
            if first_gap is None:  # before any update of this step: the train-rollout mismatch
                first_gap = (
                    float(out.metrics["logprob_abs_diff"])
                    if not self.recompute
                    else float(((behavior - rollout).abs() * mask).sum() / mask.sum().clamp(min=1))
                )
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad)
            if not torch.isfinite(grad_norm):
                if not skip:
                    raise FloatingPointError(
                        f"gradient norm is {float(grad_norm)} at version {self.version}, "
                        f"minibatch {d} (--on-bad-tokens skip skips such steps)"
                    )
                skipped += 1  # as Megatron's NaN check: no update from this minibatch, counted
                self.opt.zero_grad(set_to_none=True)
                continue
            add(names.GRAD_NORM, grad_norm)
            add(names.TRAIN_LOSS, loss)
            lr_now = self.base_lr * warmup_factor(self.adam_steps, self.lr_warmup_steps)
            for g in self.opt.param_groups:
                g["lr"] = lr_now
            add("train/lr", lr_now)
            self.opt.step()
            self.adam_steps += 1
        self.version += 1
        metrics = {k: sums[k] / counts[k] for k in sums}
        metrics["train/logprob_abs_diff_step_start"] = first_gap
        metrics[names.BAD_TOKENS] = bad_tokens  # skipped tokens over the step's minibatches
        metrics[names.SKIPPED_STEPS] = skipped  # optimizer steps skipped for a non-finite gradient
        # the slime path's name for the same thing (it cannot log a summed count)
        metrics[names.policy_metric("bad_token_frac")] = bad_tokens / max(checked_tokens, 1)
        metrics["train/version"] = self.version
        return metrics
