"""The metrics path has no host synchronisation, and its sync-free pieces are exact.

Sync-freedom is checked on the "meta" device: a meta tensor has a shape and no data, so
.item(), bool(tensor), nonzero, bincount (no meta kernel) and anything whose output shape
depends on values raise there. The core's accelerator branches are forced (as on CUDA).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from epic_slime.losses import LOSS_MODES, compute_policy_loss
from epic_slime.losses import bounds as _bounds
from epic_slime.losses.metrics import POSITION_BINS, kth_smallest
from epic_slime.losses.topk import topk_inputs_around


@pytest.fixture
def accelerator_branches(monkeypatch):
    monkeypatch.setattr(_bounds, "host_checks_are_free", lambda x: False)


def _inputs(B=3, T=40, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 1e-3
    blp = (lp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-4)
    mask = torch.arange(T)[None] < torch.tensor([T, T // 2, 3, T - 7][:B])[:, None]
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return lp.to(dtype), blp.to(dtype), adv.to(dtype), mask


def _run(mode, lp, blp, adv, mask, topk, **kw):
    extra = topk if LOSS_MODES[mode].needs_topk else {}
    leaf = lp.detach().requires_grad_(True)
    out = compute_policy_loss(mode, leaf, blp, adv, mask, **extra, **kw)
    out.loss.backward()
    return out, leaf.grad


@pytest.mark.parametrize("mode", sorted(LOSS_MODES))
def test_metrics_run_on_the_meta_device(mode, accelerator_branches):
    lp, blp, adv, mask = _inputs()
    topk = topk_inputs_around(lp, blp, 4, generator=torch.Generator().manual_seed(1)).loss_kwargs()
    meta = [t.to("meta") for t in (lp, blp, adv, mask)]
    out, grad = _run(mode, *meta, {k: v.to("meta") for k, v in topk.items()}, compute_metrics=True, validate=False)
    assert grad.device.type == "meta" and out.loss.device.type == "meta"
    assert len(out.metrics) >= 30
    assert all(v.device.type == "meta" and v.dim() == 0 for v in out.metrics.values()), mode
    # ... and the same call on the CPU (accelerator branches) gives the CPU path's values.
    cpu_out, cpu_grad = _run(mode, lp, blp, adv, mask, topk, compute_metrics=True, validate=False)
    assert set(cpu_out.metrics) == set(out.metrics)


def test_the_meta_check_fails_on_a_sync(accelerator_branches):
    """The check has teeth: validation (a documented host sync) and the old metric ops raise on meta."""
    lp, blp, adv, mask = (t.to("meta") for t in _inputs())
    with pytest.raises((RuntimeError, NotImplementedError)):
        compute_policy_loss("grpo", lp, blp, adv, mask, compute_metrics=True, validate=True)
    x = torch.zeros(8, device="meta")
    for op in (
        lambda: int(x.sum()),
        lambda: torch.bincount(x.long(), minlength=21),
        lambda: torch.nonzero(x),
        lambda: bool(x.max() > 0),
    ):
        with pytest.raises((RuntimeError, NotImplementedError)):
            op()


@pytest.mark.parametrize("mode", sorted(LOSS_MODES))
def test_accelerator_branches_give_the_cpu_metrics(mode, monkeypatch):
    """The scatter-add histograms (accelerators) and bincount (CPU) agree, metric by metric."""
    lp, blp, adv, mask = _inputs(seed=3, dtype=torch.float64)
    topk = topk_inputs_around(lp, blp, 4, generator=torch.Generator().manual_seed(2)).loss_kwargs()
    cpu, _ = _run(mode, lp, blp, adv, mask, topk)
    monkeypatch.setattr(_bounds, "host_checks_are_free", lambda x: False)
    acc, _ = _run(mode, lp, blp, adv, mask, topk)
    for name, value in cpu.metrics.items():
        assert float(acc.metrics[name]) == pytest.approx(float(value), rel=1e-12, abs=1e-15), name


# ------------------------------------------------------------------------------------------------
# The radix select against numpy
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("host", [True, False])
def test_kth_smallest_is_exact(dtype, host, monkeypatch):
    if not host:
        monkeypatch.setattr(_bounds, "host_checks_are_free", lambda x: False)
    g = torch.Generator().manual_seed(4)
    cases = [
        torch.randn(1000, generator=g, dtype=torch.float64),
        torch.randn(1000, generator=g, dtype=torch.float64) * 1e-30,  # tiny: same top digits everywhere
        torch.randint(-3, 4, (500,), generator=g).double(),  # ties, -0.0 / +0.0
        torch.tensor([-math.inf] * 7 + [0.5, -2.0, 1e30, -1e-40]),
        torch.tensor([3.0]),
        torch.cat([torch.full((50,), -math.inf), torch.tensor([-0.0, 0.0, math.inf])]),
    ]
    for values in cases:
        values = values.to(dtype)
        ordered = np.sort(values.numpy())
        for k in sorted({1, min(2, len(ordered)), max(1, len(ordered) // 2), max(1, len(ordered) - 1), len(ordered)}):
            got = kth_smallest(values, torch.tensor(k))
            assert got.dtype == dtype
            want = ordered[k - 1]
            assert float(got) == float(want), (
                values[:5],
                k,
                float(got),
                float(want),
            )  # -0.0 == 0.0: numpy keeps ties' order


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kth_smallest_host_bracket_and_its_fallback(dtype, monkeypatch):
    """The CPU select above 4096 elements: a bracket from a strided sample (the partitions it makes
    are small), and a full partition when the sample misleads it (a spike on every 64th element,
    exactly where the sample looks) or NaNs are present; exact against a sort either way (ties at 0
    widen the bracket, as masked tokens do)."""
    from epic_slime.losses import metrics

    sizes = []
    real_partition = np.partition
    monkeypatch.setattr(np, "partition", lambda a, kth, **kw: (sizes.append(a.size), real_partition(a, kth, **kw))[1])
    g = torch.Generator().manual_seed(11)
    n = 40_000
    ordinary = torch.cat(
        [
            torch.zeros(n // 3, dtype=torch.float64),  # masked tokens: many ties at 0
            torch.exp(0.05 * torch.randn(n - n // 3, generator=g, dtype=torch.float64)),
        ]
    )
    ordinary = ordinary[torch.randperm(n, generator=g)]
    spiky = torch.ones(n, dtype=torch.float64)
    spiky[::64] = 1e6  # every sampled element is a spike, no other element is
    ranks = (1, n // 2, int(0.97 * n), n - 5, n)
    # spiky: the bracket holds the spikes only, so ranks below them need the fallback (the top two
    # ranks, among the spikes, are found in the open-ended bracket)
    for values, full_partition in ((ordinary, (False,) * 5), (spiky, (True, True, True, False, False))):
        values = values.to(dtype)
        ordered = torch.sort(values).values
        for k, expect_full in zip(ranks, full_partition):
            sizes.clear()
            got = metrics._kth_smallest_host(values, k)
            assert got.dtype == dtype and float(got) == float(ordered[k - 1]), k
            assert (n in sizes) == expect_full, (k, sizes)
    # NaN compares false in the bracket: the fallback's partition places it last, as a sort does
    with_nan = ordinary.to(dtype).clone()
    with_nan[7] = math.nan
    assert float(metrics._kth_smallest_host(with_nan, n - 1)) == float(torch.sort(with_nan).values[n - 2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ratio_p95_and_max_against_numpy(dtype):
    lp, blp, adv, mask = _inputs(B=4, T=301, seed=7, dtype=dtype)
    out = compute_policy_loss("epic", lp, blp, adv, mask)
    r = np.exp((lp.double() - blp.double()).numpy())[mask.numpy()]
    rel = 1e-12 if dtype == torch.float64 else 1e-6
    assert float(out.metrics["ratio_p95"]) == pytest.approx(np.percentile(r, 95, method="inverted_cdf"), rel=rel)
    assert float(out.metrics["ratio_max"]) == pytest.approx(r.max(), rel=rel)


def test_no_valid_token_gives_zero_ratio_statistics():
    lp, blp, adv, mask = _inputs()
    out = compute_policy_loss("grpo", lp, blp, adv, torch.zeros_like(mask))
    assert float(out.metrics["ratio_p95"]) == 0.0 and float(out.metrics["ratio_max"]) == 0.0
    assert float(out.metrics["valid_tokens"]) == 0.0


def test_position_bins_are_exact_for_long_responses():
    """floor(10 (t - 1) / n) in float32 at lengths whose bin edges fall on integers (n = 10 k)
    and on odd lengths, against integer arithmetic; with holes in the mask."""
    T = 16384
    lengths = [16380, 16383, 9990, 7, 1001]
    mask = torch.zeros(len(lengths), T, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, T - n :] = True  # left padding: valid tokens start late
    mask[4, T - 600] = False  # a hole
    g = torch.Generator().manual_seed(9)
    lp = -torch.rand(len(lengths), T, generator=g) - 0.01
    blp = lp + 0.2 * torch.randn(len(lengths), T, generator=g)
    out = compute_policy_loss("grpo", lp, blp.clamp(max=-1e-4), torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0]), mask)
    clipped = out.clipped.numpy()
    tokens = np.zeros(POSITION_BINS)
    hits = np.zeros(POSITION_BINS)
    for b in range(len(lengths)):
        row = clipped[b][mask[b].numpy()]
        n = len(row)
        for j in range(n):
            k = (POSITION_BINS * j) // n
            tokens[k] += 1
            hits[k] += row[j]
    for k in range(POSITION_BINS):
        assert float(out.metrics[f"clipfrac_position_bin_{k}"]) == pytest.approx(hits[k] / tokens[k], rel=1e-12)
