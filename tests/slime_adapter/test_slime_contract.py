"""slime's own ``loss_function`` with ``loss_type=custom_loss`` pointing at the project's loss.

Needs slime's source (``SLIME_PATH=/path/to/slime`` or slime importable) and ``megatron-core``
(0.16.1 imports on CPU; Megatron's parallel state runs over gloo). Two gloo processes run CP = 2
(zigzag-sliced logits) and, after re-initialising Megatron's parallel state, CP = 1; the summed
CP = 2 losses and logit gradients must equal CP = 1's, and both must equal the core evaluated
on log-probs computed here from the logits.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import pytest
import torch

from support.preconditions import slime_or_skip

with slime_or_skip(
    "slime contract tests need slime's source (set SLIME_PATH) and megatron-core==0.16.1"
) as _SLIME_PATH:
    import megatron.core  # noqa: F401
    import slime.backends.megatron_utils.loss  # noqa: F401

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.utils.rnn import pad_sequence  # noqa: E402

from epic_slime.slime.loss_parts.adapter import approx_kl  # noqa: E402
from epic_slime.slime.loss_parts.cp import zigzag_response_ranges  # noqa: E402
from epic_slime.losses import LOSS_MODES  # noqa: E402
from support.slime_loss import loss_args  # noqa: E402

SHAPES = [(9, 5), (20, 17), (7, 1), (33, 30)]
VOCAB = 11
TEMPERATURE = 0.8
CASES = [
    ("epic", False),
    ("gspo", False),
    ("ctpo", False),
    ("dapo", False),
    ("epic", True),
    ("dppo_topk_tv", False),
    ("dppo_topk_kl", False),
]
TOPK = 3


def _args(mode: str, kl: bool) -> argparse.Namespace:
    """The adapter tests' loss args plus what slime's own loss_function reads."""
    return loss_args(
        mode,
        loss_type="custom_loss",
        custom_loss_function_path="epic_slime.slime.loss.policy_loss",
        recompute_loss_function=False,
        allgather_cp=False,
        rollout_temperature=TEMPERATURE,
        rollout_top_p=1.0,
        log_probs_chunk_size=-1,
        use_kl_loss=kl,
        kl_loss_coef=1e-3,
    )


def _data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for k, (total, resp) in enumerate(SHAPES):
        logits = torch.randn(total, VOCAB, generator=g)
        tokens = torch.randint(0, VOCAB, (total,), generator=g)
        mask = torch.ones(resp, dtype=torch.int32)
        if resp > 3:
            mask[1] = 0
        # behaviour log-probs: the policy's own, perturbed (some tokens far off, so clipping acts)
        log_pi = _response_log_probs(logits, tokens, resp)
        log_mu = (log_pi + 0.05 * torch.randn(resp, generator=g) + 0.5 * (torch.arange(resp) % 5 == 0)).clamp(max=-1e-3)
        ref = log_pi + 0.1 * torch.randn(resp, generator=g)
        adv = torch.full((resp,), [1.0, -0.6, 0.3, -1.1][k])
        out.append(
            dict(total=total, resp=resp, logits=logits, tokens=tokens, mask=mask, log_mu=log_mu, ref=ref, adv=adv)
        )
    _add_rollout_topk(out, seed)
    return out


def _add_rollout_topk(data, seed):
    """SGLang-style top-k rows consistent with log_mu: k ids other than the sampled token sharing
    90% of the rest of mu's mass (own generator: the other fields stay as they were)."""
    g = torch.Generator().manual_seed(1000 + seed)
    for d in data:
        sampled = d["tokens"][-d["resp"] :]
        ids = torch.stack(
            [
                torch.tensor([v for v in torch.randperm(VOCAB, generator=g).tolist() if v != int(tok)][:TOPK])
                for tok in sampled
            ]
        ).to(torch.int32)
        weights = torch.softmax(torch.randn(d["resp"], TOPK, generator=g), -1)
        rest = -torch.expm1(d["log_mu"].double())  # 1 - mu of the sampled token
        d["topk_ids"], d["topk_log_probs"] = ids, torch.log(0.9 * rest[:, None] * weights).float()


def _response_log_probs(logits: torch.Tensor, tokens: torch.Tensor, resp: int) -> torch.Tensor:
    """log softmax(logits / T) of each response token, from the logit one position earlier."""
    total = tokens.numel()
    scores = torch.log_softmax(logits[total - resp - 1 : total - 1] / TEMPERATURE, dim=-1)
    return scores.gather(1, tokens[total - resp :, None]).squeeze(1)


def _local_positions(d, rank, cp):
    (a0, b0), (a1, b1) = zigzag_response_ranges(d["total"], d["resp"], rank, cp)
    return torch.cat([torch.arange(a0, b0), torch.arange(a1, b1)])


def _batch_and_logits(data, leaves, rank, cp):
    """What slime's get_batch hands the loss on one CP rank (THD stream, zigzag for CP > 1)."""
    chunks = []
    for d, leaf in zip(data, leaves):
        if cp == 1:
            chunks.append(leaf)
            continue
        chunk = -(-d["total"] // (2 * cp))
        padded = torch.cat([leaf, leaf.new_zeros(2 * cp * chunk - d["total"], VOCAB)])
        chunks += [
            padded[rank * chunk : (rank + 1) * chunk],
            padded[(2 * cp - 1 - rank) * chunk : (2 * cp - rank) * chunk],
        ]
    logits = torch.cat(chunks)[None]
    positions = [_local_positions(d, rank, cp) for d in data]
    batch = {
        "unconcat_tokens": [d["tokens"] for d in data],
        "total_lengths": [d["total"] for d in data],
        "response_lengths": [d["resp"] for d in data],
        "loss_masks": [d["mask"] for d in data],
        "advantages": [d["adv"][p] for d, p in zip(data, positions)],
        "rollout_log_probs": [d["log_mu"][p] for d, p in zip(data, positions)],
        "ref_log_probs": [d["ref"][p] for d, p in zip(data, positions)],
        "log_probs": None,
        "rollout_mask_sums": torch.tensor([float(d["mask"].sum()) for d in data]),
        # full responses, as a slime that forwards them would hand them over (like loss_masks)
        "rollout_topk_ids": [d["topk_ids"] for d in data],
        "rollout_topk_log_probs": [d["topk_log_probs"] for d in data],
    }
    return batch, logits


def _run_loss_function(args, data):
    from megatron.core import mpu
    from slime.backends.megatron_utils.loss import loss_function

    rank, cp = mpu.get_context_parallel_rank(), mpu.get_context_parallel_world_size()
    leaves = [d["logits"].clone().requires_grad_(True) for d in data]
    batch, logits = _batch_and_logits(data, leaves, rank, cp)
    scaled, normalizer, log = loss_function(args, batch, 1, len(data), logits)
    scaled.backward()
    # undo slime's rescaling: x num_microbatches / step_global_batch_size x |DP x CP| (per-rollout
    # mean) or x |CP| (per-token mode, where Megatron divides by the token count)
    if args.calculate_per_token_loss:
        factor = mpu.get_context_parallel_world_size()
    else:
        factor = mpu.get_data_parallel_world_size(with_context_parallel=True) / len(data)
    metrics = dict(zip(log["keys"], log["values"][1:].tolist()))
    return scaled.detach() / factor, [leaf.grad / factor for leaf in leaves], metrics, float(normalizer)


def _worker(rank, world, init_file, result_file, slime_path):
    if slime_path and slime_path not in sys.path:
        sys.path.insert(0, slime_path)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    from megatron.core import parallel_state
    from slime.backends.megatron_utils.cp_utils import get_logits_and_tokens_offset_with_cp

    out = {"cp2": {}, "cp1": {}, "layout_mismatches": []}
    try:
        parallel_state.initialize_model_parallel(context_parallel_size=2)
        for total in range(2, 41):
            for resp in range(1, total):
                _, _, logits_offset, _ = get_logits_and_tokens_offset_with_cp(total, resp)
                prompt = total - resp
                theirs = [(lo - (prompt - 1), hi - (prompt - 1)) if hi > lo else (0, 0) for lo, hi in logits_offset]
                if tuple(theirs) != zigzag_response_ranges(total, resp, rank, 2):
                    out["layout_mismatches"].append((total, resp, theirs))
        for mode, kl in CASES:
            out["cp2"][mode, kl] = _run_loss_function(_args(mode, kl), _data())
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(context_parallel_size=1)
        for mode, kl in CASES:
            out["cp1"][mode, kl] = _run_loss_function(_args(mode, kl), _data())
        parallel_state.destroy_model_parallel()
        torch.save(out, f"{result_file}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(
            _worker, args=(2, os.path.join(tmp, "init"), os.path.join(tmp, "out"), _SLIME_PATH), nprocs=2, join=True
        )
        return [torch.load(os.path.join(tmp, f"out.{r}")) for r in range(2)]


def _core(mode, kl, data):
    """The core on log-probs computed here, reduced as slime's step would (sum of sample means / token sum)."""
    from epic_slime.losses import compute_policy_loss
    from epic_slime.losses.flags import policy_loss_config_from_args

    args = _args(mode, kl)
    _, params, _ = policy_loss_config_from_args(args)
    aggregation = args.policy_loss_aggregation or LOSS_MODES[mode].aggregation
    leaves = [d["logits"].clone().requires_grad_(True) for d in data]
    log_pi = [_response_log_probs(leaf, d["tokens"], d["resp"]) for leaf, d in zip(leaves, data)]
    mask = pad_sequence([d["mask"].bool() for d in data], batch_first=True)
    topk = {}
    if LOSS_MODES[mode].needs_topk:
        from epic_slime.losses import behavior_topk_set, gather_log_probs

        pad = lambda key: pad_sequence([d[key] for d in data], batch_first=True)  # noqa: E731
        sampled = pad_sequence([d["tokens"][-d["resp"] :] for d in data], batch_first=True)
        ids, behavior, topk_mask = behavior_topk_set(
            pad("topk_ids").long(), pad("topk_log_probs"), sampled, pad("log_mu")
        )
        response_logits = pad_sequence(
            [leaf[d["total"] - d["resp"] - 1 : d["total"] - 1] / TEMPERATURE for leaf, d in zip(leaves, data)],
            batch_first=True,
        )
        topk = dict(
            behavior_topk_log_probs=behavior,
            current_topk_log_probs=gather_log_probs(response_logits, ids, topk_mask),
            topk_mask=topk_mask,
        )
    out = compute_policy_loss(
        mode,
        pad_sequence(log_pi, batch_first=True),
        pad_sequence([d["log_mu"] for d in data], batch_first=True),
        pad_sequence([d["adv"] for d in data], batch_first=True),
        mask,
        aggregation=aggregation,
        **topk,
        **params,
    )
    per_token = aggregation == "token-mean"
    loss = out.loss * (float(mask.sum()) if per_token else len(data))
    if kl:
        for lp, d in zip(log_pi, data):
            r = d["ref"] - lp
            term = ((torch.exp(r) - 1 - r).clamp(-10, 10) * d["mask"]).sum()
            loss = loss + 1e-3 * (term if per_token else term / d["mask"].sum())
    loss.backward()
    return loss.detach(), [leaf.grad for leaf in leaves], out.metrics


def test_zigzag_layout_matches_slime(ranks):
    for r in ranks:
        assert r["layout_mismatches"] == []


def test_kl_estimators_match_slime():
    from slime.utils.ppo_utils import compute_approx_kl

    g = torch.Generator().manual_seed(3)
    lp, ref = torch.randn(200, generator=g) - 2, torch.randn(200, generator=g) - 2
    # slime's estimator is torch.compile'd: the same formula, rounding may differ in the last bit
    for kind in ("k1", "k2", "k3", "low_var_kl"):
        torch.testing.assert_close(approx_kl(lp, ref, kind), compute_approx_kl(lp, ref, kind), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=[f"{m}{'-kl' if k else ''}" for m, k in CASES])
def test_slime_loss_function_cp1_cp2_and_core_agree(ranks, case):
    mode, kl = case
    cp1_loss, cp1_grads, cp1_metrics, _ = ranks[0]["cp1"][case]
    cp2 = [r["cp2"][case] for r in ranks]
    ref_loss, ref_grads, ref_metrics = _core(mode, kl, _data())
    torch.testing.assert_close(cp1_loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cp2[0][0] + cp2[1][0], cp1_loss, rtol=1e-5, atol=1e-6)
    assert sum(float(g.abs().sum()) > 0 for g in ref_grads) >= 2, "the fixture must leave gradient in the band"
    for i, ref_grad in enumerate(ref_grads):
        torch.testing.assert_close(cp1_grads[i], ref_grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(cp2[0][1][i] + cp2[1][1][i], cp1_grads[i], rtol=1e-4, atol=1e-6)
    # slime's metric names survive; per-rank values add up to the CP = 1 value
    for name in ("loss", "pg_loss", "entropy_loss", "pg_clipfrac", "ppo_kl", "train_rollout_logprob_abs_diff"):
        assert name in cp1_metrics
        assert cp2[0][2][name] + cp2[1][2][name] == pytest.approx(cp1_metrics[name], rel=1e-4, abs=1e-6)
    assert ("kl_loss" in cp1_metrics) == kl
    if LOSS_MODES[mode].needs_topk:
        # the set divergence is continuous in pi's set log-probs (the loss only sees them through
        # a mask): the core's value, weighted by the micro-batch's sample count
        name = "topk_tv_mean" if mode.endswith("tv") else "topk_kl_mean"
        assert float(ref_metrics[name]) > 0
        for got in (cp1_metrics[f"policy/{name}"], cp2[0][2][f"policy/{name}"] + cp2[1][2][f"policy/{name}"]):
            assert got == pytest.approx(float(ref_metrics[name]) * len(SHAPES), rel=1e-5, abs=1e-7)
    assert any(name.startswith("policy/") for name in cp1_metrics)


def test_rollout_function_returns_slime_output_with_staleness(monkeypatch):
    from collections import deque

    from slime.rollout.base_types import RolloutFnTrainOutput
    from slime.utils.types import Sample

    import epic_slime.slime.rollout as rollout
    from epic_slime.slime.stream.engine_faults import EngineFaults
    from epic_slime.slime.stream.ledger import GroupLedger

    def group(index, version):
        return [Sample(index=2 * index + i, group_index=index, weight_versions=[str(version)]) for i in range(2)]

    class FakeStream:  # GroupStream's interface: finished groups waiting, counters
        crash_retries = abort_resubmits = stale_requeues = empty_call_versions = coarse_version_calls = 0

        def __init__(self, groups, can_requeue=False):
            self.completed = deque(groups)
            self.decile_records, self.run_decile_records = [], []
            self.can_requeue, self.requeued = can_requeue, []
            self.faults = EngineFaults(argparse.Namespace())  # the real fault counts, none raised here
            self.data_source = object.__new__(rollout.StreamingDataSource)
            self.data_source.ledger, self.data_source._returned = GroupLedger(), deque()
            for g in groups:
                self.data_source.ledger.consume(g[0].group_index, g)

        def add(self, groups):
            for g in groups:
                self.data_source.ledger.consume(g[0].group_index, g)
                self.completed.append(g)

        def pop(self, limit):
            return [self.completed.popleft() for _ in range(min(limit, len(self.completed)))]

        def held(self):
            return len(self.completed) + len(self.requeued)

        def accounted(self):  # popped groups are all delivered or dropped before the check
            return self.held() + self.data_source.handed_back()

        def release(self, group):
            pass

        def start_rollout(self, trainer_version):  # the groups are already here
            self.decile_records = []

        def record(self, group, outcome, lag=None):  # GroupStream's length-decile records (trained ones here)
            if lag is None:
                return
            self.decile_records.append((float(max(s.response_length for s in group)), lag, outcome))
            self.run_decile_records.append(self.decile_records[-1])

        def drop(self, group):  # GroupStream.drop: final in the ledger (release and record: nothing to do here)
            self.data_source.ledger.drop(group[0].group_index)

        def requeue(self, g):  # GroupStream regenerates the fresh prompt; here it waits in a list
            if self.can_requeue:
                self.requeued.append(g)
            return self.can_requeue

    stream = FakeStream([group(5, 1), group(1, 1), group(7, 0), group(2, 1)])
    monkeypatch.setattr(rollout, "_stream", stream)
    monkeypatch.setattr(rollout, "_first_rollout_id", None)
    monkeypatch.setattr(rollout, "_totals", {k: 0 for k in rollout._totals})
    # K = 1: the streaming path (K = 0 is the synchronous schedule, tests/slime_adapter/test_slime_sync.py)
    args = argparse.Namespace(rollout_global_dataset=True, rollout_batch_size=2, max_staleness=1, stale_policy="drop")
    out = rollout.generate_rollout(args, 3, data_source=stream.data_source)
    assert isinstance(out, RolloutFnTrainOutput)
    assert [[s.index for s in g] for g in out.samples] == [[2, 3], [10, 11]]  # sorted like slime's
    assert out.metrics["rollout/staleness/mean"] == 0.0 and out.metrics["rollout/staleness/trainer_version"] == 1.0
    assert out.samples[0][0].metadata["epic_group_staleness"] == 0
    assert (
        out.metrics["rollout/accounting/consumed_groups"] == 4
        and out.metrics["rollout/accounting/in_flight_groups"] == 4
    )
    assert out.metrics["rollout/faults/failed_calls"] == 0.0 and out.metrics["rollout/faults/engines_found_dead"] == 0.0
    deciles = {
        k: v for k, v in out.metrics.items() if k.startswith("rollout/staleness/deciles/") and k.endswith("/trained")
    }
    assert sum(deciles.values()) == 2.0  # the batch's two groups, reported by response-length decile
    # next rollout: the policy is version 2, the group from version 0 is stale by 2 > K = 1
    stream.add([group(9, 2), group(8, 2)])
    out = rollout.generate_rollout(args, 4, data_source=stream.data_source)
    assert out.metrics["rollout/staleness/dropped_groups"] == 1.0  # group(7, 0)
    assert out.metrics["rollout/staleness/total_dropped_samples"] == 2.0
    assert out.metrics["rollout/staleness/max"] == 1.0  # group(2, 1)
    assert [[s.index for s in g] for g in out.samples] == [[4, 5], [18, 19]]
    assert (
        out.metrics["rollout/accounting/dropped_groups"] == 1
        and out.metrics["rollout/accounting/in_flight_groups"] == 5
    )
    # a rollout with nothing dropped: the run's totals keep the earlier drop (they add up, never reset)
    stream.add([group(20, 3), group(21, 3)])
    out = rollout.generate_rollout(args, 5, data_source=stream.data_source)
    assert out.metrics["rollout/staleness/dropped_groups"] == 0.0
    assert out.metrics["rollout/staleness/total_dropped_samples"] == 2.0
    assert out.metrics["rollout/staleness/total_dropped_groups"] == 1.0
    with pytest.raises(ValueError, match="--data-source-path"):
        rollout.generate_rollout(args, 6, data_source=object())

    # the same stale group with a stream that can regenerate it: requeued, nothing dropped, still in flight
    stream = FakeStream([group(5, 1), group(1, 1), group(7, 0), group(2, 1)], can_requeue=True)
    monkeypatch.setattr(rollout, "_stream", stream)
    monkeypatch.setattr(rollout, "_first_rollout_id", None)
    monkeypatch.setattr(rollout, "_totals", {k: 0 for k in rollout._totals})
    rollout.generate_rollout(args, 3, data_source=stream.data_source)
    stream.add([group(9, 2), group(8, 2)])
    out = rollout.generate_rollout(args, 4, data_source=stream.data_source)
    assert [g[0].group_index for g in stream.requeued] == [7]
    assert out.metrics["rollout/staleness/requeued"] == 1.0 and out.metrics["rollout/staleness/dropped_groups"] == 0.0
    assert out.metrics["rollout/staleness/total_requeued_groups"] == 1.0
    assert (
        out.metrics["rollout/accounting/dropped_groups"] == 0
        and out.metrics["rollout/accounting/in_flight_groups"] == 6
    )


def test_generate_records_topk_on_slime_samples():
    """The generate function's answer handling on slime's own Sample (append_response_tokens,
    status from finish_reason), and the Top-K rows survive slime's to_dict / from_dict."""
    from slime.utils.types import Sample

    from epic_slime.slime.generate import apply_response

    answer = {
        "text": "xy",
        "meta_info": {
            "finish_reason": {"type": "length"},
            "output_token_logprobs": [[-0.2, 5, None], [-1.1, 2, None]],
            "output_top_logprobs": [[[-0.2, 5, None], [-2.0, 1, None]], [[-0.5, 4, None], [-1.1, 2, None]]],
        },
    }
    sample = Sample(prompt="p", tokens=[9, 8, 7])
    args = argparse.Namespace(sglang_speculative_algorithm=None)
    apply_response(args, sample, answer, 2)
    assert sample.tokens == [9, 8, 7, 5, 2] and sample.response_length == 2 and sample.loss_mask == [1, 1]
    assert sample.rollout_log_probs == pytest.approx([-0.2, -1.1])
    assert sample.status == Sample.Status.TRUNCATED
    assert sample.rollout_topk_ids.tolist() == [[5, 1], [4, 2]]
    again = Sample.from_dict(sample.to_dict())
    torch.testing.assert_close(again.rollout_topk_log_probs, torch.tensor([[-0.2, -2.0], [-0.5, -1.1]]))


def test_a_call_aborted_before_its_first_token_adds_no_weight_version():
    """slime's Sample.append_response_tokens records the engine's weight_version for every call; a
    request a push aborted while it waited brought no token, so its (pre-push) version goes."""
    from types import SimpleNamespace

    from slime.utils.types import Sample

    from epic_slime.slime.rollout import GroupStream
    from epic_slime.slime.stream.gate import sample_version

    args = argparse.Namespace(partial_rollout=False)
    waited, partial = Sample(index=0, tokens=[1, 2]), Sample(index=1, tokens=[1, 2])
    before = [(s.response_length, len(s.weight_versions)) for s in (waited, partial)]
    waited.append_response_tokens(
        args, tokens=[], log_probs=[], meta_info={"weight_version": "3", "finish_reason": {"type": "abort"}}
    )
    partial.append_response_tokens(
        args, tokens=[7], log_probs=[-0.5], meta_info={"weight_version": "3", "finish_reason": {"type": "abort"}}
    )
    assert waited.status == partial.status == Sample.Status.ABORTED and waited.weight_versions == ["3"]
    counters = SimpleNamespace(empty_call_versions=0)
    GroupStream._forget_empty_calls(counters, [waited, partial], before)
    assert waited.weight_versions == [] and partial.weight_versions == ["3"] and counters.empty_call_versions == 1
    # resubmitted after the push: the oldest version of its tokens is the new one
    waited.append_response_tokens(
        args, tokens=[5], log_probs=[-0.1], meta_info={"weight_version": "4", "finish_reason": {"type": "stop"}}
    )
    assert sample_version(waited.weight_versions) == 4


def test_a_stale_group_is_regenerated_from_its_prompt_at_most_max_requeues_times():
    """A requeued group leaves the live count (the budget frees its slot) and its fresh prompt waits
    to start as a new group at the end of the start order; past the cap it is only discarded."""
    from collections import Counter, deque
    from types import SimpleNamespace

    from epic_slime.admission import AdmissionBudget
    from epic_slime.slime.rollout import GroupStream

    stream = object.__new__(GroupStream)
    stream.max_requeues, stream.requeues, stream.stale_requeues = 2, Counter(), 0
    stream.order, stream.finished, stream.to_start = deque(), {}, deque()
    stream.budget = AdmissionBudget(batch_groups=4, max_staleness=2)
    stream.budget.start(5)
    stream.taken = set()
    stream.top_up = lambda: None
    stream.record = (
        lambda group, outcome, lag=None: None
    )  # the length-decile report (tests/slime_adapter/test_slime_stream.py)
    stream.data_source = SimpleNamespace(fresh_group=lambda key: [SimpleNamespace(group_index=key, fresh=True)])
    stale = [SimpleNamespace(group_index=7, fresh=False)]
    assert [stream.requeue(stale) for _ in range(3)] == [True, True, False]
    assert [(g[0].group_index, g[0].fresh) for g in stream.to_start] == [(7, True), (7, True)]
    assert stream.stale_requeues == 2 and stream.budget.live == 2  # each taken group left the count
    assert stream.requeue([SimpleNamespace(group_index=8)]) is True  # counted per group
