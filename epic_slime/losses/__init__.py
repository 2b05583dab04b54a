"""The policy-loss core: pure functions over plain [B, T] tensors, no framework imports.

    out = compute_policy_loss("epic", log_probs, behavior_log_probs, advantages, mask)
    out.loss.backward()

See docs/losses.md for the math of every mode.
"""

from .bounds import exact_kl_log_bounds, exact_kl_lower_root, exact_kl_upper_root, kl_phi
from .core import (
    AGGREGATIONS,
    LOSS_MODES,
    LossSpec,
    PolicyLossInputError,
    TokenTerms,
    aggregate_loss,
    register_loss,
    resolve_params,
    sign_aware_clip,
)
from .inputs import LossBatch
from .policy_loss import PolicyLossOutput, compute_policy_loss
from .topk import TopKInputs, behavior_topk_set, gather_log_probs, topk_inputs_from_logits

DEFAULT_MODE = "epic"

__all__ = [
    "AGGREGATIONS",
    "DEFAULT_MODE",
    "LOSS_MODES",
    "LossBatch",
    "LossSpec",
    "PolicyLossInputError",
    "PolicyLossOutput",
    "TokenTerms",
    "TopKInputs",
    "aggregate_loss",
    "behavior_topk_set",
    "compute_policy_loss",
    "exact_kl_log_bounds",
    "exact_kl_lower_root",
    "exact_kl_upper_root",
    "gather_log_probs",
    "kl_phi",
    "register_loss",
    "resolve_params",
    "sign_aware_clip",
    "topk_inputs_from_logits",
]
