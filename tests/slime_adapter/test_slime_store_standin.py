"""The object-store stand-in (tests/support/slime_store.py) under slime 624b824a's own
RolloutManager conversion and per-DP split, and the train side's per-rank fetch
(``process_rollout_data``), without the e2e run: each rank reads one object, its own, and the
bytes it read are its samples' tensors only."""

from __future__ import annotations

import argparse
import sys
import types

import pytest

from support.preconditions import skip_unless

skip_unless(
    "slime",
    "megatron.core",
    "ray",
    "httpx",
    why="needs slime's source (SLIME_PATH or ../shared/vendor/slime-624b824a) and the slime-contract extra",
)

import torch  # noqa: E402

from support.slime_store import (  # noqa: E402
    ObjectRefStandIn,
    ObjectStoreStandIn,
    install,
    remove_placeholders,
    rollout_manager_class,
    tensor_bytes,
)

N, GROUPS, DP = 4, 2, 2


@pytest.fixture(autouse=True)
def _restore_slimes_ray():
    """``install`` rebinds the ``ray`` of two slime modules and the import left placeholders for
    SGLang and wandb in sys.modules: undo both for the tests after these."""
    rollout_manager_class()
    import slime.ray.rollout as rollout
    import slime.utils.data as data

    before = rollout.ray, data.ray
    yield
    rollout.ray, data.ray = before
    remove_placeholders()
    assert not [n for n, m in list(sys.modules.items()) if getattr(m, "__epic_placeholder__", False)]


def _args():
    return argparse.Namespace(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
        n_samples_per_prompt=N,
        rollout_batch_size=GROUPS,
        global_batch_size=N * GROUPS // 2,
        use_dynamic_batch_size=False,
        max_tokens_per_gpu=None,
        micro_batch_size=1,
        balance_by_flops=False,
        balance_data=False,
        rollout_top_p=1.0,
        use_rollout_routing_replay=False,
        rollout_data_transport="object-store",
    )


def _samples():
    from slime.utils.types import Sample

    out = []
    for g in range(GROUPS):
        for i in range(N):
            response = 3 + g + i
            s = Sample(
                group_index=g,
                index=g * N + i,
                tokens=list(range(5 + response)),
                response_length=response,
                reward=float(i % 2),
                loss_mask=[1] * response,
                rollout_log_probs=[-0.5] * response,
                metadata={"pid": g},
            )
            out.append(s)
    return out


def _manager(store):
    cls = rollout_manager_class()
    install(store)
    m = types.SimpleNamespace(
        args=_args(),
        custom_reward_post_process_func=None,
        custom_convert_samples_to_train_data_func=None,
        train_parallel_config={"dp_size": DP, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1},
    )
    m._post_process_rewards = types.MethodType(cls._post_process_rewards, m)
    return cls, m


def test_slimes_split_gives_each_rank_its_own_object_and_only_its_samples_bytes():
    from slime.utils.data import process_rollout_data

    store = ObjectStoreStandIn()
    cls, manager = _manager(store)
    assert cls.__module__ == "slime.ray.rollout" and cls.__name__ == "RolloutManager"
    samples = _samples()
    refs = cls._split_train_data_by_dp(manager, cls._convert_samples_to_train_data(manager, samples))
    assert len(refs) == DP and all(isinstance(r.inner, ObjectRefStandIn) for r in refs)
    seen = []
    for rank in range(DP):
        with store.fetching_as(rank):
            data = process_rollout_data(manager.args, refs, rank, DP)
        seen += [int(i) for i in data["sample_indices"]]
        mine = [samples[int(i)] for i in data["sample_indices"]]
        # tokens int64, loss mask int32, rollout log-probs float32 per token, one float32 mask sum per sample
        want = sum(8 * len(s.tokens) + 4 * s.response_length + 4 * s.response_length + 4 for s in mine)
        assert store.fetches[-1] == {
            "fetcher": rank,
            "key": refs[rank].inner.key,
            "bytes": refs[rank].inner.nbytes,
            "tensor_bytes": want,
        }
        assert [int(n) for n in data["total_lengths"]] == [len(s.tokens) for s in mine]
    assert sorted(seen) == list(range(N * GROUPS))
    assert store.bytes_by_fetcher() == {r: refs[r].inner.nbytes for r in range(DP)}


def test_slimes_grpo_rewards_are_normalised_per_group():
    store = ObjectStoreStandIn()
    cls, manager = _manager(store)
    data = cls._convert_samples_to_train_data(manager, _samples())
    rewards = torch.tensor(data["rewards"]).view(GROUPS, N)
    raw = torch.tensor(data["raw_reward"], dtype=torch.float64).view(GROUPS, N)
    want = (raw - raw.mean(1, keepdim=True)) / (raw.std(1, keepdim=True) + 1e-6)
    assert torch.allclose(rewards.double(), want, atol=1e-6)


def test_the_store_refuses_what_ray_would_not_take_and_copies_on_get():
    store = ObjectStoreStandIn()
    ref = store.put({"t": torch.zeros(3, dtype=torch.int64), "xs": [torch.ones(2)]})
    first, second = store.get(ref), store.get([ref])[0]
    first["t"][0] = 7
    assert int(second["t"][0]) == 0  # every get deserialises its own copy
    assert tensor_bytes(second) == 3 * 8 + 2 * 4
    with pytest.raises(TypeError, match="ObjectRefStandIn"):
        store.get(123)
    with pytest.raises(ValueError, match="tensor transport 'nixl'"):
        store.put({}, _tensor_transport="nixl")
    store.drop([ref])
    with pytest.raises(KeyError):
        store.get(ref)
