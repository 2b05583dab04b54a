"""The tiny Qwen3-MoE policy, its log-probs, and the KV-cache sampler.

Behaviour log-prob convention (the paper's and slime's): for each sampled token o_t,
    behavior_log_prob_t = log_softmax(logits_t / temperature)[o_t]
which is exactly what the trainer recomputes (`response_log_probs`) for the same weights, so that
without precision mismatch the train-rollout gap is float noise. When top-p < 1 the token is drawn
from the top-p renormalised distribution; its log-prob under that distribution is returned separately
as `sampling_log_probs` (= behaviour log-prob - log(kept mass), or -inf never). The loss uses
`behavior_log_probs`; the top-p truncation is a documented, measured mismatch
(`rollout/top_p_logprob_gap`), as in slime/SGLang.
"""

from __future__ import annotations

import torch

from .model_config import ModelConfig  # noqa: F401  (re-exported: the model's size lives with the model)


def build_policy(cfg: ModelConfig, vocab_size: int, pad_id: int, bos_id: int, eos_id: int, seed: int):
    """A freshly initialised Qwen3MoeForCausalLM (built locally from a config; nothing downloaded)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    hf_cfg = Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=2 * cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        max_position_embeddings=cfg.max_positions,
        moe_intermediate_size=cfg.moe_intermediate_size,
        num_experts=cfg.num_experts,
        num_experts_per_tok=cfg.top_k,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
    )
    hf_cfg._attn_implementation = "sdpa"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen3MoeForCausalLM(hf_cfg)
    return model


def _right_padded_sequences(prompts: list[list[int]], responses: list[list[int]], pad_id: int):
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    L = max(lengths)
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    attn = torch.zeros((len(prompts), L), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        attn[i, : len(p) + len(r)] = 1
    return ids, attn


def response_log_probs(
    model,
    prompts: list[list[int]],
    responses: list[list[int]],
    temperature: float,
    pad_id: int,
    return_all: bool = False,
):
    """log_softmax(logits / temperature) of each response token given its prefix.

    Returns (log_probs [B, T] float32, mask [B, T] bool), T = longest response, zeros on padding;
    with return_all also the full [B, T, V] log-softmax at those positions (Top-K modes).
    Differentiable when called with gradients enabled."""
    if any(len(r) == 0 for r in responses):
        raise ValueError("response_log_probs: empty response (a sampler always emits >= 1 token)")
    ids, attn = _right_padded_sequences(prompts, responses, pad_id)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits.float()
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    B, T = len(responses), max(len(r) for r in responses)
    pos = torch.zeros((B, T), dtype=torch.long)
    tok = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        n = len(r)
        pos[i, :n] = torch.arange(len(p) - 1, len(p) - 1 + n)
        tok[i, :n] = torch.tensor(r, dtype=torch.long)
        mask[i, :n] = True
    lp_rows = logp_all.gather(1, pos.unsqueeze(-1).expand(-1, -1, logp_all.shape[-1]))
    lp = lp_rows.gather(2, tok.unsqueeze(-1)).squeeze(-1).masked_fill(~mask, 0.0)
    return (lp, mask, lp_rows) if return_all else (lp, mask)


def _top_p_filter(log_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Log-probs renormalised over the smallest set of tokens whose mass reaches top_p (rest -inf)."""
    if top_p >= 1.0:
        return log_probs
    sorted_lp, order = torch.sort(log_probs, dim=-1, descending=True)
    cum = sorted_lp.exp().cumsum(-1)
    # keep a token if the mass strictly before it is < top_p (the top token is always kept)
    keep_sorted = (cum - sorted_lp.exp()) < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    filtered = log_probs.masked_fill(~keep, float("-inf"))
    return filtered - torch.logsumexp(filtered, dim=-1, keepdim=True)


@torch.no_grad()
def sample(
    model,
    prompts: list[list[int]],
    *,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    generator: torch.Generator,
    topk: int = 0,
    stop_ids: tuple[int, ...] = (),
) -> list[dict]:
    """Sample one response per prompt with the model's KV cache (our own loop, not `generate`).
    ``stop_ids``: tokens that end a response besides <eos>, kept in it (a tool call's last token, for
    the agent task's turns); such a response's status is "stopped".

    Returns per prompt: response ids (including <eos> when emitted), behavior_log_probs (see module
    doc), sampling_log_probs (exact top-p distribution), status "completed" | "truncated"; with
    topk > 0 also topk_ids / topk_log_probs: the behaviour distribution's k most likely ids per
    token and their behaviour log-probs (the DPPO Top-K modes' input)."""
    from transformers import DynamicCache

    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B = len(prompts)
    P = max(len(p) for p in prompts)
    ids = torch.full((B, P), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding: every prompt ends at column P-1
        ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        attn[i, P - len(p) :] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)  # positions match the trainer's right-padded layout
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, cache=cache, use_cache=True).logits[:, -1]
    last_pos = pos[:, -1:]
    out_tokens, out_blp, out_slp, out_topk_lp, out_topk_ids = [], [], [], [], []
    done = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_new_tokens):
        blp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
        slp_all = _top_p_filter(blp_all, top_p)
        tok = torch.multinomial(slp_all.exp(), 1, generator=generator).squeeze(-1)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        out_tokens.append(tok)
        out_blp.append(blp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1))
        out_slp.append(slp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1))
        if topk > 0:
            top = torch.topk(blp_all, topk, dim=-1)
            out_topk_lp.append(top.values)
            out_topk_ids.append(top.indices)
        out_tokens[-1] = torch.where(done, torch.full_like(tok, -1), tok)  # -1 marks "after eos"
        done = done | (tok == eos_id)
        for stop in stop_ids:
            done = done | (tok == stop)
        if bool(done.all()):
            break
        attn = torch.cat([attn, torch.ones((B, 1), dtype=torch.long)], dim=1)
        last_pos = last_pos + 1
        logits = model(
            input_ids=tok.unsqueeze(-1), attention_mask=attn, position_ids=last_pos, cache=cache, use_cache=True
        ).logits[:, -1]
    toks = torch.stack(out_tokens, 1)
    blp = torch.stack(out_blp, 1)
    slp = torch.stack(out_slp, 1)
    if topk > 0:
        topk_lp, topk_ids = torch.stack(out_topk_lp, 1), torch.stack(out_topk_ids, 1)
    results = []
    for i in range(B):
        n = int((toks[i] >= 0).sum())
        resp = toks[i, :n].tolist()
        if topk > 0:
            extra = {"topk_ids": topk_ids[i, :n].tolist(), "topk_log_probs": topk_lp[i, :n].tolist()}
        else:
            extra = {}
        results.append(
            {
                **extra,
                "response_ids": resp,
                "behavior_log_probs": blp[i, :n].tolist(),
                "sampling_log_probs": slp[i, :n].tolist(),
                "status": "completed"
                if resp and resp[-1] == eos_id
                else "stopped"
                if resp and resp[-1] in stop_ids
                else "truncated",
            }
        )
    return results
