"""Tool tokens never count on the slime path (issue 44, item 2): the loss adapter under context
parallelism, with tool spans that straddle slime's CP chunks, against the same responses with the
spans cut out at CP = 1. slime's own code gives the layout and the reduction: its CP token offsets
(``get_logits_and_tokens_offset_with_cp``) slice each rank's local tensors and its
``get_sum_of_sample_mean`` reduces them (slime 624b824a's source; a stand-in only for Megatron's
``mpu`` rank queries). The CP ranks run one after another in this process: each rank's gather
buffer is recorded in a first pass and the gather of the second pass returns their sum, which is
what the all-reduce of ``cp.make_all_reduce_gather`` returns (tests/slime_adapter/test_slime_cp.py
runs that one over gloo).

Every value at a tool token is absurd: the trainer's log-probs (+50, -1e4), slime's placeholder
rollout log-probs (set to -1e4 / +50 instead of 0.0), the recompute, the reference model's
log-probs, the entropy and the advantage (1e6). The loss, the gradient at every model token (0 at
every tool token) and every reported metric (ppo_kl, the train-rollout gap, the KL loss, TIS
weights, the core's diagnostics) equal the cut responses'.
"""

from __future__ import annotations


import pytest
import torch

from support.preconditions import slime_or_skip

with slime_or_skip("needs slime's source (set SLIME_PATH) and megatron-core==0.16.1"):
    from megatron.core import mpu
    from slime.backends.megatron_utils import cp_utils

from epic_slime.slime.loss_parts import adapter  # noqa: E402
from epic_slime.slime.loss_parts.adapter import slime_policy_loss_from_log_probs  # noqa: E402
from support.slime_loss import loss_args  # noqa: E402
from support.tool_spans import ABSURD_ADVANTAGE, absurd_values, span_layout, with_spans  # noqa: E402

MODES = ["epic", "grpo", "dapo", "gspo", "ctpo", "cispo", "dppo_tv", "ripo", "cppo", "epic_cumulative"]
# (prompt length, model tokens, spans): at CP = 2 and 3 the spans cross chunk edges (checked below)
SAMPLES = [
    (5, 14, [(3, 6), (9, 4)]),
    (3, 20, [(0, 5), (11, 7), (20, 3)]),
    (9, 2, [(1, 11)]),
    (4, 9, []),
    (6, 17, [(5, 2), (6, 9), (16, 1)]),
]


def _data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for k, (prompt, n, spans) in enumerate(SAMPLES):
        log_mu = -torch.rand(n, generator=g, dtype=torch.float64) * 3 - 0.01
        drift = 0.08 * torch.randn(n, generator=g, dtype=torch.float64)
        drift[::3] += 0.5 * torch.randn(len(drift[::3]), generator=g, dtype=torch.float64)
        model = dict(
            log_pi=(log_mu + drift).clamp(max=-1e-4),
            log_mu=log_mu,
            log_old=(log_mu + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)).clamp(max=-1e-4),
            ref=log_mu + 0.1 * torch.randn(n, generator=g, dtype=torch.float64),
            entropy=torch.rand(n, generator=g, dtype=torch.float64),
            adv=torch.full((n,), [1.0, -0.7, 0.4, -1.3, 0.9][k], dtype=torch.float64),
        )
        is_model, index = span_layout(n, spans)
        n_tool = len(is_model) - n
        absurd = absurd_values(n_tool)
        tool_fill = dict(
            log_pi=absurd.flip(0),
            log_mu=absurd,
            log_old=absurd,
            ref=absurd.flip(0),
            entropy=torch.full((n_tool,), 1e4),
            adv=torch.full((n_tool,), ABSURD_ADVANTAGE),
        )
        spanned = {key: with_spans(value, is_model, tool_fill[key]) for key, value in model.items()}
        cut = dict(model, total=prompt + n, resp=n, mask=torch.ones(n, dtype=torch.int32))
        spanned.update(total=prompt + len(is_model), resp=len(is_model), mask=torch.tensor(is_model, dtype=torch.int32))
        out.append((cut, spanned, torch.tensor(index)))
    return out


def _set_cp(monkeypatch, rank: int, size: int) -> None:
    monkeypatch.setattr(mpu, "get_context_parallel_rank", lambda *a, **k: rank)
    monkeypatch.setattr(mpu, "get_context_parallel_world_size", lambda *a, **k: size)


def _local_positions(total: int, resp: int, size: int) -> torch.Tensor:
    """This rank's response indices, from slime's own CP token offsets."""
    if size == 1:
        return torch.arange(resp)
    _, _, _, tokens = cp_utils.get_logits_and_tokens_offset_with_cp(total, resp)
    prompt = total - resp
    return torch.cat(
        [torch.arange(a - prompt, b - prompt, dtype=torch.long) for a, b in tokens if b > a]
        + [torch.zeros(0, dtype=torch.long)]
    )


def _straddles(sample: dict, size: int) -> bool:
    """Some tool span holds response tokens of two CP chunks (their scoring logits cross an edge)."""
    chunk = -(-sample["total"] // (2 * size))
    prompt = sample["total"] - sample["resp"]
    owner = [(prompt + j - 1) // chunk for j in range(sample["resp"])]
    mask = sample["mask"].tolist()
    return any(mask[j] == 0 and mask[j + 1] == 0 and owner[j] != owner[j + 1] for j in range(sample["resp"] - 1))


def _loss(monkeypatch, args, samples, size: int):
    """Sum over CP ranks of the adapter's loss and metrics; the gradient per sample's full response."""
    leaves = [s["log_pi"].clone().requires_grad_(True) for s in samples]
    buffers: dict[int, torch.Tensor] = {}
    total_loss, metrics = 0.0, {}
    for pass_ in ("record", "compute"):
        for rank in range(size):
            _set_cp(monkeypatch, rank, size)
            positions = [_local_positions(s["total"], s["resp"], size) for s in samples]
            masks = [s["mask"] for s in samples]
            reducer = cp_utils.get_sum_of_sample_mean(
                [s["total"] for s in samples],
                [s["resp"] for s in samples],
                masks,
                calculate_per_token_loss=args.calculate_per_token_loss,
            )
            batch = {
                "total_lengths": [s["total"] for s in samples],
                "response_lengths": [s["resp"] for s in samples],
                "loss_masks": masks,
                "advantages": [s["adv"][p] for s, p in zip(samples, positions)],
                "rollout_log_probs": [s["log_mu"][p] for s, p in zip(samples, positions)],
                "log_probs": [s["log_old"][p] for s, p in zip(samples, positions)],
                "ref_log_probs": [s["ref"][p] for s, p in zip(samples, positions)],
                "rollout_mask_sums": None,
            }

            def gather(buffer, rank=rank, pass_=pass_):
                if pass_ == "record":
                    buffers[rank] = buffer.detach().clone()
                    return buffer
                return sum(buffers.values())

            log_probs = [leaf[p] for leaf, p in zip(leaves, positions)]
            entropy = [s["entropy"][p] for s, p in zip(samples, positions)]
            loss, reported = slime_policy_loss_from_log_probs(
                args, batch, log_probs, entropy, reducer, cp_rank=rank, cp_size=size, gather=gather
            )
            if pass_ == "compute":
                loss.backward()
                total_loss += float(loss.detach())
                for name, value in reported.items():
                    metrics[name] = metrics.get(name, 0.0) + float(value)
    return total_loss, [leaf.grad for leaf in leaves], metrics


def _args(mode, tis: bool):
    extra = dict(entropy_coef=0.01, use_kl_loss=True, kl_loss_coef=0.05, kl_loss_type="k3", use_unbiased_kl=True)
    if tis:
        extra.update(use_tis=True, tis_clip=1.5, tis_clip_low=0.5, behavior_logprobs=None)
    return loss_args(mode, **extra)


@pytest.mark.parametrize("size", [2, 3])
def test_the_spans_straddle_cp_chunks(size):
    spanned = [s for _, s, _ in _data()]
    assert sum(_straddles(s, size) for s in spanned) >= 2


@pytest.mark.parametrize("tis", [False, True], ids=["plain", "tis"])
@pytest.mark.parametrize("mode", MODES)
def test_cp_adapter_with_tool_spans_equals_cut_responses(monkeypatch, mode, tis):
    adapter._resolved = None
    data = _data()
    cut = [c for c, _, _ in data]
    spanned = [s for _, s, _ in data]
    ref_loss, ref_grads, ref_metrics = _loss(monkeypatch, _args(mode, tis), cut, 1)
    assert any(float(g.abs().sum()) > 0 for g in ref_grads)
    for size in (2, 3):
        adapter._resolved = None  # a fresh args object per run
        loss, grads, metrics = _loss(monkeypatch, _args(mode, tis), spanned, size)
        assert loss == pytest.approx(ref_loss, rel=1e-12, abs=1e-13), (mode, size)
        for (_, s, index), grad, ref in zip(data, grads, ref_grads):
            torch.testing.assert_close(grad[index], ref, rtol=1e-11, atol=1e-13)
            tool = s["mask"] == 0
            assert torch.equal(grad[tool], torch.zeros_like(grad[tool])), (mode, size)
        assert set(metrics) == set(ref_metrics)
        for name, value in ref_metrics.items():
            assert metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), (mode, size, name)
