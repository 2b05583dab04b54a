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
    res = sample(
        model,
        prompts,
        temperature=run_cfg.rollout_temperature,
        top_p=1.0,
        max_new_tokens=run_cfg.rollout_max_response_len,
        eos_id=tok.eos_id,
        pad_id=tok.pad_id,
        generator=gen,
    )
    responses = [r["response_ids"] for r in res]
    _, mask, all_lp = response_log_probs(
        model, prompts, responses, run_cfg.rollout_temperature, tok.pad_id, return_all=True
    )
    entropy = -(all_lp.exp() * all_lp).sum(-1)
    eq = tok.token_to_id["="]
    is_result = torch.zeros_like(mask)
    for i, r in enumerate(responses):  # the token right after each '=' is a step's result
        for j in range(1, len(r)):
            is_result[i, j] = r[j - 1] == eq
    kinds = step_token_kinds(responses, tok)
    copy_by_position: dict[str, list[float]] = {}
    for i, r in enumerate(responses):
        for j, kind in enumerate(kinds[i]):
            if kind.startswith("copy"):
                copy_by_position.setdefault(kind, []).append(float(entropy[i, j]))
    copy_means = {k: sum(v) / len(v) for k, v in sorted(copy_by_position.items())}

    def kind_mean(prefix: str) -> float:
        vals = [float(entropy[i, j]) for i, ks in enumerate(kinds) for j, k in enumerate(ks) if k.startswith(prefix)]
        return sum(vals) / len(vals) if vals else 0.0

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
        # tokens that are a function of the prompt alone (operator and operand of step k, the first operand)
        "entropy_copy_tokens": kind_mean("copy"),
        "entropy_copy_by_position": copy_means,
        "entropy_copy_max_position": max(copy_means.values()) if copy_means else 0.0,
        "entropy_carry_tokens": kind_mean("carry"),
    }


def step_token_kinds(responses: list[list[int]], tok) -> list[list[str]]:
    """Each response token's role in the step format `a op b = c ;` (steps counted from 0):
    `copy:a0` (the prompt's first operand), `copy:op<k>` / `copy:b<k>` (the prompt's operator and operand
    k + 1), `carry:a<k>` (step k's first operand: the previous result), `result:<k>`, and `format`
    for '=', ';', `Answer:`, the answer digit and <eos>. A response that leaves the format is
    classified up to where it does (the rest is `format`)."""
    eq, semi = tok.token_to_id["="], tok.token_to_id[";"]
    ops = {tok.token_to_id["+"], tok.token_to_id["-"], tok.token_to_id["*"]}
    out = []
    for r in responses:
        kinds, step, slot = [], 0, 0  # slot: 0 a, 1 op, 2 b, 3 '=', 4 c, 5 ';'
        broken = False
        for t in r:
            if broken or t in (tok.answer_id, tok.eos_id):
                broken = True
                kinds.append("format")
                continue
            expect_op, expect_eq, expect_semi = slot == 1, slot == 3, slot == 5
            if (expect_op and t not in ops) or (expect_eq and t != eq) or (expect_semi and t != semi):
                broken = True
                kinds.append("format")
                continue
            kinds.append(
                {
                    0: f"copy:a{step}" if step == 0 else f"carry:a{step}",
                    1: f"copy:op{step}",
                    2: f"copy:b{step}",
                    3: "format",
                    4: f"result:{step}",
                    5: "format",
                }[slot]
            )
            slot += 1
            if slot == 6:
                slot, step = 0, step + 1
        out.append(kinds)
    return out
