"""Per-position entropy of a policy on its own samples (the study task's "uncertainty is spread over
the whole response" check, on the warm-started policy)."""

from __future__ import annotations

import torch

from .analysis import POSITION_BINS


def position_entropy(entropy: torch.Tensor, mask: torch.Tensor, bins: int = POSITION_BINS) -> list[float]:
    """Mean entropy per relative-position bin (t - 1) / T of each response ([B, T] entropy and mask);
    the same binning as the loss core's clipfrac_position_bin_*. An empty bin is 0."""
    lengths = mask.sum(1, keepdim=True).clamp(min=1)
    t = torch.arange(mask.shape[1]).unsqueeze(0).expand_as(mask)
    idx = (t.double() / lengths * bins).long().clamp(max=bins - 1)
    out = []
    for b in range(bins):
        sel = mask & (idx == b)
        out.append(float(entropy[sel].double().mean()) if sel.any() else 0.0)
    return out


@torch.no_grad()
def warm_start_entropy_profile(run_cfg, state: dict, problems, samples_per_prompt: int = 4, seed: int = 0) -> dict:
    """Sample the policy on `problems`, recompute its full distribution at every response token, and
    summarise entropy by relative position, by absolute position and by token kind (the result digit
    of a step `a op b = c;` vs the copies around it)."""
    from epic_slime.runtime.model import build_policy, response_log_probs, sample
    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    model = build_policy(run_cfg.model, tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed)
    model.load_state_dict(state)
    model.eval()
    prompts = [[tok.bos_id] + tok.encode(p.prompt) for p in problems for _ in range(samples_per_prompt)]
    gen = torch.Generator().manual_seed(seed)
    res = sample(model, prompts, temperature=run_cfg.rollout_temperature, top_p=1.0,
                 max_new_tokens=run_cfg.rollout_max_response_len, eos_id=tok.eos_id, pad_id=tok.pad_id, generator=gen)
    responses = [r["response_ids"] for r in res]
    _, mask, all_lp = response_log_probs(model, prompts, responses, run_cfg.rollout_temperature, tok.pad_id,
                                         return_all=True)
    entropy = -(all_lp.exp() * all_lp).sum(-1)
    eq = tok.token_to_id["="]
    is_result = torch.zeros_like(mask)
    for i, r in enumerate(responses):        # the token right after each '=' is a step's result
        for j in range(1, len(r)):
            is_result[i, j] = r[j - 1] == eq
    lengths = mask.sum(1).double()
    by_abs = [float(entropy[mask[:, t], t].mean()) if mask[:, t].any() else 0.0 for t in range(mask.shape[1])]
    rel = position_entropy(entropy, mask)
    mean_rel = sum(rel) / len(rel)
    return {
        "responses": len(responses),
        "mean_length": float(lengths.mean()),
        "min_length": int(lengths.min()),
        "truncated_frac": sum(r["status"] == "truncated" for r in res) / len(res),
        "mean_entropy": float(entropy[mask].mean()),
        "entropy_by_relative_bin": rel,
        "relative_bin_cv": float(torch.tensor(rel).std(unbiased=False) / mean_rel) if mean_rel > 0 else 0.0,
        "entropy_by_position": by_abs,
        "entropy_result_tokens": float(entropy[mask & is_result].mean()),
        "entropy_other_tokens": float(entropy[mask & ~is_result].mean()),
    }
