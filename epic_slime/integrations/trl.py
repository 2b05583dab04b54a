"""TRL's GRPOTrainer training with one of the project's loss modes (tested with TRL 1.16.0).

    from epic_slime.integrations.trl import EpicGRPOTrainer
    trainer = EpicGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                              loss_mode="epic", loss_params={"delta_high": 2e-3})

TRL has no loss registry: the subclass overrides `_compute_loss`, the method TRL's `compute_loss`
calls. Everything else (generation, rewards, advantages, batching, logging) stays TRL's.

Behaviour log-probs (mu of `compute_policy_loss`), the first of:
1. `sampling_per_token_logps`: the sampler's own log-probs (vLLM generation);
2. `old_per_token_logps`: the trained model's log-probs at generation time, which TRL computes when
   a generation batch is used over several optimizer steps (`steps_per_generation` or
   `num_iterations` > 1);
3. the current log-probs, detached (on-policy: every ratio is 1, as in TRL's own losses).

Refused at construction, each with its reason (`UNSUPPORTED`): TRL's vLLM importance-sampling
correction (mu is already the sampler's, so a second correction would count the mismatch twice),
the KL term (`beta`), entropy masking and the entropy bonus, the off-policy sequence mask, and
sequence-level importance sampling (each mode defines its own ratio).
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer

from epic_slime.integrations import exported_modes
from epic_slime.losses import AGGREGATIONS, LOSS_MODES, PolicyLossInputError, PolicyLossOutput
from epic_slime.losses import compute_policy_loss, resolve_params

# inputs TRL passes on to the forward pass when present (vision-language batches)
FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
BEHAVIOUR_KEYS = ("sampling_per_token_logps", "old_per_token_logps")
# The core's diagnostics that TRL's own losses log under a name of TRL's; the others go under "policy/".
TRL_METRIC_NAMES = {
    "clipfrac": "clip_ratio/region_mean",
    "clipfrac_lower": "clip_ratio/low_mean",
    "clipfrac_upper": "clip_ratio/high_mean",
}

# (what is set, the reason it is refused): checked on the trainer after GRPOTrainer's own set-up.
UNSUPPORTED = (
    (
        lambda t: t.use_vllm and t.vllm_importance_sampling_correction,
        "vllm_importance_sampling_correction=True: the loss already uses vLLM's sampling log-probs as the "
        "behaviour policy, so TRL's correction would count the mismatch twice; set it to False",
    ),
    (lambda t: t.beta != 0.0, "beta={beta}: TRL's KL-to-reference term is not mapped; set beta=0.0"),
    (
        lambda t: t.top_entropy_quantile < 1.0,
        "top_entropy_quantile={top_entropy_quantile}: entropy masking is not mapped; set it to 1.0",
    ),
    (lambda t: t._entropy_bonus_enabled, "entropy_coef / use_adaptive_entropy: the entropy bonus is not mapped"),
    (
        lambda t: t.off_policy_mask_threshold is not None,
        "off_policy_mask_threshold={off_policy_mask_threshold}: the off-policy sequence mask is not mapped",
    ),
    (
        lambda t: t.importance_sampling_level != "token",
        "importance_sampling_level={importance_sampling_level!r}: each loss mode defines its own ratio; use 'token'",
    ),
)


class EpicGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose policy loss is `compute_policy_loss(loss_mode, ...)` (TRL's `loss_type` is unused)."""

    def __init__(
        self, *args, loss_mode: str = "epic", loss_params: dict | None = None, aggregation: str | None = None, **kwargs
    ):
        if loss_mode not in exported_modes():
            needs = " (it needs top-K log-probs TRL does not produce)" if loss_mode in LOSS_MODES else ""
            raise PolicyLossInputError(
                f"loss_mode={loss_mode!r} is not offered here{needs}; choose one of {exported_modes()}"
            )
        if aggregation is not None and aggregation not in AGGREGATIONS:
            raise PolicyLossInputError(f"aggregation={aggregation!r} is not one of {AGGREGATIONS}")
        self.loss_mode = loss_mode
        self.loss_params = dict(loss_params or {})
        resolve_params(loss_mode, self.loss_params)  # a bad parameter fails before the model loads
        self.loss_aggregation = aggregation or LOSS_MODES[loss_mode].aggregation
        super().__init__(*args, **kwargs)
        for is_set, reason in UNSUPPORTED:
            if is_set(self):
                raise PolicyLossInputError(f"EpicGRPOTrainer: {reason.format(**vars(self))}")

    def behaviour_log_probs(self, inputs: dict, log_probs: torch.Tensor) -> torch.Tensor:
        for key in BEHAVIOUR_KEYS:
            if inputs.get(key) is not None:
                return inputs[key]
        return log_probs.detach()

    def policy_loss(
        self, log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
    ) -> PolicyLossOutput:
        """The one call into the core (a subclass may wrap it, e.g. to record what it was given)."""
        return compute_policy_loss(
            self.loss_mode,
            log_probs,
            behaviour_log_probs,
            advantages,
            mask,
            aggregation=self.loss_aggregation,
            **self.loss_params,
        )

    def _compute_loss(self, model, inputs):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = (
            inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        )
        log_probs, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{k: inputs.get(k) for k in FORWARD_KEYS if k in inputs},
        )

        out = self.policy_loss(log_probs, self.behaviour_log_probs(inputs, log_probs), inputs["advantages"], mask)
        mode = "train" if self.model.training else "eval"
        # TRL's Trainer does not scale for gradient accumulation here (GRPOTrainer scales each loss itself)
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        loss = out.loss / accumulation
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather(aux_loss.detach()).mean().item())
        self._log_policy_metrics(mode, out, entropies, mask)
        return loss

    def _log_policy_metrics(self, mode: str, out: PolicyLossOutput, entropies: torch.Tensor, mask) -> None:
        mask = mask.to(entropies.dtype)
        names = ["policy_loss", "entropy"] + [TRL_METRIC_NAMES.get(n, "policy/" + n) for n in out.metrics]
        values = [
            out.loss.detach(),
            (entropies.detach() * mask).sum() / mask.sum().clamp(min=1.0),
            *out.metrics.values(),
        ]
        local = torch.stack([v.to(torch.float64) for v in values])
        # one gather for all of them; the mean over processes (TRL's own metrics are means as well)
        gathered = self.accelerator.gather(local[None]).mean(dim=0).tolist()
        for name, value in zip(names, gathered):
            self._metrics[mode][name].append(value)
