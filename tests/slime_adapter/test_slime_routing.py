"""R3 routing within host memory (``epic_slime.slime.routing``) against slime 624b824a's own code.

The payload test runs at Qwen3-30B-A3B's routing shape (48 MoE layers, top-8 of 128 experts),
scaled down in tokens: slime's ``build_dp_schedule`` partitions a rollout over DP ranks and packs
micro-batches, slime's ``prepare_routed_experts_for_routing_replay`` gives every (CP, TP) rank its
rows from the unsharded int32 routing (slime's way), and the project's staged path must give each
rank the same tensor while fetching only its own rows. Needs slime's source (SLIME_PATH or
../shared/vendor/slime-624b824a) and megatron-core (its ``mpu`` is patched, no process group).
"""

from __future__ import annotations

import argparse
import pickle
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from support.preconditions import slime_or_skip

with slime_or_skip(
    "R3 routing tests need slime's source (SLIME_PATH or ../shared/vendor/slime-624b824a) and megatron-core"
):
    from megatron.core import mpu
    from slime.backends.megatron_utils import cp_utils
    from slime.observability.rollout_data_utils import (
        tensorize_rollout_data_for_training,
        validate_rollout_routed_experts_for_replay,
    )
    from slime.utils.dp_schedule import build_dp_schedule
    from slime.utils.types import Sample

from epic_slime.slime import routing  # noqa: E402

LAYERS, TOPK, EXPERTS = 48, 8, 128  # Qwen3-30B-A3B
TP, DP = 4, 2


def _args(**overrides):
    args = argparse.Namespace(
        num_layers=LAYERS, moe_router_topk=TOPK, num_experts=EXPERTS, use_rollout_routing_replay=True, moe_layer_freq=1
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def _rollout(num_prompts=8, n=4, seed=0):
    """Groups of slime Samples with int32 routing as slime's decoder leaves it (~5k tokens)."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for p in range(num_prompts):
        prompt = torch.randint(0, 1000, (int(torch.randint(20, 60, (1,), generator=g)),), generator=g).tolist()
        group = []
        for i in range(n):
            response = int(torch.randint(30, 300, (1,), generator=g))
            tokens = prompt + torch.randint(0, 1000, (response,), generator=g).tolist()
            s = Sample(group_index=p, index=p * n + i, tokens=tokens, response_length=response)
            s.rollout_routed_experts = torch.randint(
                0, EXPERTS, (len(tokens) - 1, LAYERS, TOPK), generator=g, dtype=torch.int32
            )
            group.append(s)
        groups.append(group)
    return groups


def _use_ranks(monkeypatch, tp_rank, cp_rank, cp_size):
    monkeypatch.setattr(mpu, "get_tensor_model_parallel_world_size", lambda: TP)
    monkeypatch.setattr(mpu, "get_tensor_model_parallel_rank", lambda: tp_rank)
    monkeypatch.setattr(mpu, "get_context_parallel_world_size", lambda: cp_size)
    monkeypatch.setattr(mpu, "get_context_parallel_rank", lambda: cp_rank)


@pytest.mark.parametrize("cp_size,allgather_cp", [(1, False), (2, False), (2, True)])
def test_each_rank_fetches_only_its_slice_and_replays_what_slime_would(monkeypatch, cp_size, allgather_cp):
    args = _args()
    groups = _rollout()
    samples = [s for group in groups for s in group]
    unsharded = [s.rollout_routed_experts.clone() for s in samples]
    tokens = [torch.tensor(s.tokens) for s in samples]
    sched_args = argparse.Namespace(
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=700,
        micro_batch_size=1,
        balance_data=False,
        balance_by_flops=False,
    )
    partitions, mb_indices, _, _ = build_dp_schedule(
        sched_args,
        {"dp_size": DP, "cp_size": cp_size, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1},
        [len(t) for t in tokens],
        global_batch_size=len(groups),
        rollout_indices=[s.group_index for s in samples],
    )

    store = routing.RoutingStore()
    routing.stage_for_training(args, groups, rollout_id=3, store=store)
    handles = [s.rollout_routed_experts for s in samples]
    # slime's manager-side check and per-rank tensorising accept the handles as they are
    validate_rollout_routed_experts_for_replay(list(handles), args)
    shipped = {"rollout_routed_experts": list(handles)}
    tensorize_rollout_data_for_training(shipped)
    handles = pickle.loads(pickle.dumps(shipped["rollout_routed_experts"]))
    assert all(routing.is_handle(h) for h in handles)

    prepare_kw = dict(
        num_experts=EXPERTS, data_pad_size_multiplier=4, sequence_parallel=True, allgather_cp=allgather_cp
    )
    key_of = {int(h.reshape(-1)[0]): j for j, h in enumerate(handles)}
    reassembled = [torch.full_like(u, -1) for u in unsharded]
    times_fetched = [torch.zeros(u.shape[0], dtype=torch.int64) for u in unsharded]
    before, after = {}, {}
    for dp in range(DP):
        part = partitions[dp]
        for cp_rank in range(cp_size):
            for tp_rank in range(TP):
                _use_ranks(monkeypatch, tp_rank, cp_rank, cp_size)
                rank = (dp, cp_rank, tp_rank)
                # slime's way: the whole DP partition, int32, on every rank of the DP group
                before[rank] = sum(unsharded[j].nbytes for j in part)
                after[rank] = 0

                def fetch(requests, rank=rank):
                    parts = store.rows(requests)
                    for (key, rows), got in zip(requests, parts, strict=True):
                        j = key_of[key]
                        reassembled[j][torch.from_numpy(rows)] = torch.from_numpy(got).to(torch.int32)
                        times_fetched[j][torch.from_numpy(rows)] += 1
                        after[rank] += got.nbytes
                    return parts

                for mb in mb_indices[dp]:
                    js = [part[i] for i in mb]
                    want = cp_utils.prepare_routed_experts_for_routing_replay(
                        [unsharded[j] for j in js], [tokens[j] for j in js], **prepare_kw
                    )
                    got = routing.local_routing(
                        cp_utils.prepare_routed_experts_for_routing_replay,
                        cp_utils._pad_routed_experts,
                        [handles[j] for j in js],
                        [tokens[j] for j in js],
                        fetch,
                        **prepare_kw,
                    )
                    assert got.dtype == torch.uint8
                    assert torch.equal(got.to(torch.int32), want), (rank, js)

    # every row of the rollout reached exactly one rank, and put together it is the unsharded routing
    assert all(bool((t == 1).all()) for t in times_fetched)
    assert all(torch.equal(r, u) for r, u in zip(reassembled, unsharded, strict=True))
    tokens_total = sum(u.shape[0] for u in unsharded)
    assert sum(after.values()) == tokens_total * LAYERS * TOPK  # uint8, each row once
    assert sum(before.values()) == TP * cp_size * tokens_total * LAYERS * TOPK * 4
    ratio = max(before.values()) / max(after.values())
    print(
        f"\nR3 bytes per rank at the 30B-A3B shape ({tokens_total} routed tokens, DP {DP}, CP {cp_size}, TP {TP}"
        f"{', allgather-cp' if allgather_cp else ''}): before max {max(before.values())}, after max "
        f"{max(after.values())} (x{ratio:.1f} less); per DP group {sum(before.values()) // DP} -> "
        f"{sum(after.values()) // DP}"
    )
    # uint8 (x4) and own CP x TP slice: close to x(4 * CP * TP) for the largest rank
    assert ratio >= 0.8 * 4 * TP * cp_size


def test_the_payload_test_fails_when_a_rank_gets_another_ranks_slice(monkeypatch):
    """The comparison above is sharp: a rank answering with its neighbour's rows is caught."""
    args = _args()
    groups = _rollout(num_prompts=2, n=2)
    samples = [s for group in groups for s in group]
    unsharded = [s.rollout_routed_experts.clone() for s in samples]
    tokens = [torch.tensor(s.tokens) for s in samples]
    store = routing.RoutingStore()
    routing.stage_for_training(args, groups, rollout_id=0, store=store)
    kw = dict(num_experts=EXPERTS, data_pad_size_multiplier=1, sequence_parallel=True, allgather_cp=False)

    def neighbour(experts, toks, **k):
        _use_ranks(monkeypatch, 1, 0, 1)
        return cp_utils.prepare_routed_experts_for_routing_replay(experts, toks, **k)

    _use_ranks(monkeypatch, 0, 0, 1)
    want = cp_utils.prepare_routed_experts_for_routing_replay(unsharded, tokens, **kw)
    got = routing.local_routing(
        neighbour, cp_utils._pad_routed_experts, [s.rollout_routed_experts for s in samples], tokens, store.rows, **kw
    )
    assert got.shape == want.shape and not torch.equal(got.to(torch.int32), want)


def _meta(rows, start_len=None, finish="abort"):
    meta = {"routed_experts": rows.reshape(-1).tolist(), "finish_reason": {"type": finish}}
    if start_len is not None:
        meta["routed_experts_start_len"] = start_len
    return meta


def _continued_sample(args):
    """A sample aborted by a push after 5 tokens, then continued on the new weights (slime's
    resubmission sends prompt + partial response; SGLang returns the whole sequence's routing)."""
    g = torch.Generator().manual_seed(1)
    prompt = list(range(7))
    sample = Sample(index=0, tokens=list(prompt))
    before = torch.randint(0, EXPERTS, (len(prompt) + 5 - 1, LAYERS, TOPK), generator=g, dtype=torch.int32)
    sample.append_response_tokens(args, tokens=[11] * 5, log_probs=[-0.1] * 5, meta_info=_meta(before))
    assert sample.status == Sample.Status.ABORTED
    after = torch.randint(0, EXPERTS, (len(prompt) + 5 + 3 - 1, LAYERS, TOPK), generator=g, dtype=torch.int32)
    return sample, before, after


def test_slime_alone_replaces_the_routing_recorded_before_the_push():
    """Why ``remember_partial_routing`` exists: slime's Sample keeps only the continued request's rows."""
    args = _args()
    sample, before, after = _continued_sample(args)
    sample.append_response_tokens(args, tokens=[12] * 3, log_probs=[-0.2] * 3, meta_info=_meta(after, finish="stop"))
    assert torch.equal(sample.rollout_routed_experts, after)
    assert not torch.equal(sample.rollout_routed_experts[: before.shape[0]], before)


def test_a_resubmitted_partial_response_keeps_its_routing_from_before_the_push():
    args = _args()
    sample, before, after = _continued_sample(args)
    routing.remember_partial_routing([sample])
    sample.append_response_tokens(args, tokens=[12] * 3, log_probs=[-0.2] * 3, meta_info=_meta(after, finish="stop"))
    routing.finish_group_routing(args, [sample])
    got = sample.rollout_routed_experts
    assert got.dtype == torch.uint8 and got.shape == (len(sample.tokens) - 1, LAYERS, TOPK)
    assert torch.equal(got[: before.shape[0]].to(torch.int32), before)
    assert torch.equal(got[before.shape[0] :].to(torch.int32), after[before.shape[0] :])
    assert not hasattr(sample, routing._PREFIX_ATTR)


def test_two_pushes_keep_the_rows_of_both_earlier_requests():
    args = _args()
    sample, first, second = _continued_sample(args)
    routing.remember_partial_routing([sample])
    sample.append_response_tokens(args, tokens=[12] * 3, log_probs=[-0.2] * 3, meta_info=_meta(second))
    routing.remember_partial_routing([sample])
    third = torch.randint(0, EXPERTS, (len(sample.tokens) + 2 - 1, LAYERS, TOPK), dtype=torch.int32)
    sample.append_response_tokens(args, tokens=[13] * 2, log_probs=[-0.3] * 2, meta_info=_meta(third, finish="stop"))
    routing.finish_group_routing(args, [sample])
    got = sample.rollout_routed_experts.to(torch.int32)
    n1, n2 = first.shape[0], second.shape[0]
    assert torch.equal(got[:n1], first) and torch.equal(got[n1:n2], second[n1:]) and torch.equal(got[n2:], third[n2:])


def test_continued_request_that_returns_only_new_rows_is_merged_by_slime_and_left_alone():
    """If SGLang is asked for rows from ``routed_experts_start_len`` on, slime appends them itself;
    remembering first changes nothing."""
    args = _args()
    sample, before, after = _continued_sample(args)
    routing.remember_partial_routing([sample])
    start = before.shape[0]
    sample.append_response_tokens(
        args, tokens=[12] * 3, log_probs=[-0.2] * 3, meta_info=_meta(after[start:], start_len=start, finish="stop")
    )
    routing.finish_group_routing(args, [sample])
    expected = torch.cat([before, after[start:]])
    assert torch.equal(sample.rollout_routed_experts.to(torch.int32), expected)


def test_eval_args_ask_sglang_for_no_routing_and_leave_training_args_alone():
    args = _args()
    ev = routing.eval_args(args)
    assert ev.use_rollout_routing_replay is False and args.use_rollout_routing_replay is True
    assert ev.num_layers == LAYERS and ev is not args
    off = _args(use_rollout_routing_replay=False)
    assert routing.eval_args(off) is off


def test_routing_dtype_and_bad_input_name_the_field():
    assert routing.routing_dtype(128) == torch.uint8 and routing.routing_dtype(256) == torch.uint8
    assert routing.routing_dtype(257) == torch.int32
    args = _args()
    with pytest.raises(ValueError, match=r"rollout_routed_experts has shape \(3, 48, 8\), expected \(4, 48, 8\)"):
        routing.compact_routing(args, torch.zeros(3, LAYERS, TOPK, dtype=torch.int32), num_tokens=5)
    with pytest.raises(ValueError, match=r"expert ids in \[128, 128\], outside \[0, num_experts=128\)"):
        routing.compact_routing(args, torch.full((4, LAYERS, TOPK), 128, dtype=torch.int32), num_tokens=5)
    with pytest.raises(ValueError, match=r"args.num_experts as a positive int .* got None"):
        routing.compact_routing(_args(num_experts=None), torch.zeros(4, LAYERS, TOPK), num_tokens=5)
    big = routing.compact_routing(_args(num_experts=300), torch.full((4, LAYERS, TOPK), 299), num_tokens=5)
    assert big.dtype == torch.int32 and int(big.max()) == 299


def test_staging_without_routing_names_the_sample():
    s = Sample(index=17, tokens=[1, 2, 3])
    with pytest.raises(ValueError, match="sample 17 has no rollout_routed_experts"):
        routing.stage_for_training(_args(), [[s]], rollout_id=0, store=routing.RoutingStore())
    assert routing.stage_for_training(_args(use_rollout_routing_replay=False), [[s]], 0) == [[s]]


def test_store_keeps_the_two_latest_rollouts():
    store = routing.RoutingStore()
    keys = [store.put(r, [np.full((2, 1, 1), r, dtype=np.uint8)])[0] for r in range(4)]
    assert len(set(keys)) == 4 and min(keys) >= routing.HANDLE_BASE and sorted(store.rollouts) == [2, 3]
    assert store.rows([(keys[3], np.array([1]))])[0].tolist() == [[[3]]]
    with pytest.raises(KeyError, match=rf"no routing for keys \[{keys[1]}\]"):
        store.rows([(keys[1], np.array([0]))])


def test_train_hook_passes_unstaged_routing_to_slime_and_staged_to_the_fetch(monkeypatch):
    """``install_train_hook`` on a stand-in of slime's actor module (the real one needs CUDA-only packages)."""
    actor = types.ModuleType("slime.backends.megatron_utils.actor")
    actor.prepare_routed_experts_for_routing_replay = cp_utils.prepare_routed_experts_for_routing_replay
    monkeypatch.setitem(sys.modules, "slime.backends.megatron_utils.actor", actor)
    _use_ranks(monkeypatch, 2, 0, 1)
    routing.install_train_hook(_args())
    hooked = actor.prepare_routed_experts_for_routing_replay
    assert hooked is not cp_utils.prepare_routed_experts_for_routing_replay
    routing.install_train_hook(_args())
    assert actor.prepare_routed_experts_for_routing_replay is hooked  # installed once
    kw = dict(num_experts=EXPERTS, data_pad_size_multiplier=1, sequence_parallel=True, allgather_cp=False)
    groups = _rollout(num_prompts=1, n=2)
    samples = groups[0]
    unsharded = [s.rollout_routed_experts.clone() for s in samples]
    tokens = [torch.tensor(s.tokens) for s in samples]
    want = cp_utils.prepare_routed_experts_for_routing_replay(unsharded, tokens, **kw)
    assert torch.equal(hooked(unsharded, tokens, **kw), want)
    store = routing.RoutingStore()
    routing.stage_for_training(_args(), groups, rollout_id=0, store=store)
    monkeypatch.setattr(routing, "_store", types.SimpleNamespace(rows=types.SimpleNamespace(remote=store.rows)))
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(get=lambda x: x))
    got = hooked([s.rollout_routed_experts for s in samples], tokens, **kw)
    assert torch.equal(got.to(torch.int32), want)
    with pytest.raises(ValueError, match="mixes staged routing handles"):
        hooked([samples[0].rollout_routed_experts, unsharded[1]], tokens, **kw)


def test_setup_check_names_the_hook_when_another_init_is_set():
    args = _args(rollout_function_path="epic_slime.slime.rollout.generate_rollout", custom_megatron_init_path="my.init")
    assert routing.HOOK_PATH in routing.check_r3_setup(args) and "'my.init'" in routing.check_r3_setup(args)
    args.custom_megatron_init_path = routing.HOOK_PATH
    assert routing.check_r3_setup(args) is None
    args.custom_megatron_init_path = None  # the driver adds the hook (train.driver_argv)
    assert routing.check_r3_setup(args) is None
    assert routing.check_r3_setup(_args(use_rollout_routing_replay=False)) is None


def test_through_ray_a_rank_in_another_process_gets_only_the_rows_it_asks_for():
    """The store as the named Ray actor the RolloutManager creates, asked from another worker process."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        groups = _rollout(num_prompts=1, n=1)
        sample = groups[0][0]
        full = sample.rollout_routed_experts.clone()
        routing.stage_for_training(_args(), groups, rollout_id=0)
        key = int(sample.rollout_routed_experts.reshape(-1)[0])

        @ray.remote(num_cpus=0)
        def rank(key):
            import numpy

            from epic_slime.slime import routing as r

            return ray.get(ray.get_actor(r.STORE_NAME).rows.remote([(key, numpy.arange(10, 20))]))[0]

        got = ray.get(rank.remote(key))
        assert got.dtype == np.uint8 and np.array_equal(got, full[10:20].numpy())
        stats = ray.get(routing._ray_store().stats.remote())
        assert stats["bytes_served"] == 10 * LAYERS * TOPK and stats["bytes_held"] == full.numel()
    finally:
        routing._store = None
        ray.shutdown()


def test_bench_reproduces_the_issue_figures_at_paper_scale():
    """bench/r3_payload.py at its defaults: 1,536 B/token, 7.1 GB per batch, ~14 GB per node before,
    3.5 GB the own int32 slices, 16x less after (uint8 x own TP slice), ~14 GB per eval -> 0."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "r3_payload", Path(__file__).resolve().parents[2] / "bench" / "r3_payload.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    a = argparse.Namespace(
        layers=48,
        topk=8,
        experts=128,
        samples=512,
        tokens=9000,
        train_gpus=16,
        gpus_per_node=8,
        tp=4,
        cp=1,
        pp=1,
        eval_samples=1040,
    )
    r = bench.payload(a)
    assert r["bytes_per_token_before"] == 1536 and round(r["batch_gb_int32"], 1) == 7.1
    assert round(r["node_before_gb"]) == 14 and round(r["node_needed_int32_gb"], 1) == 3.5
    assert r["node_before_gb"] / r["node_after_gb"] == 16 and round(r["eval_before_gb"]) == 14
    with pytest.raises(ValueError, match="--train-gpus 10 must be a multiple"):
        bench.payload(argparse.Namespace(**{**vars(a), "train_gpus": 10}))


def test_slime_actor_still_calls_the_wrapped_name():
    """The hook rebinds ``prepare_routed_experts_for_routing_replay`` in slime's actor module (which
    does not import on CPU): its source must still import that name and call it in fill_routing_replay."""
    source = (Path(cp_utils.__file__).parent / "actor.py").read_text()
    assert "from .cp_utils import prepare_routed_experts_for_routing_replay" in source
    fill = source[source.index("def fill_routing_replay") :]
    fill = fill[: fill.index("\n    def ", 1)]
    assert "prepare_routed_experts_for_routing_replay(" in fill and ".record(layer_routed_experts)" in fill
