"""DPPO Top-K modes on the slime path (no slime needed): flags, SGLang request / answer, the
vocabulary-parallel gather of pi's set log-probs, and the adapter against the core (CP = 1 and
CP = 2 over gloo).

The reference is the core's documented recipe on padded [B, T] tensors: ``behavior_topk_set``
from the rollout top-k and ``gather_log_probs`` from pi's full logits.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import types

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.utils.rnn import pad_sequence

from epic_slime.losses import LOSS_MODES, PolicyLossInputError, behavior_topk_set, compute_policy_loss, gather_log_probs
from epic_slime.slime import generate as gen
from epic_slime.slime.loss_parts.adapter import slime_policy_loss_from_log_probs
from epic_slime.slime.loss_parts.cp import make_all_reduce_gather, zigzag_response_positions
from epic_slime.slime.cli.dry_run import check_argv
from epic_slime.slime.cli.flags import GENERATE_FUNCTION_PATH, ProjectFlagError
from epic_slime.slime.loss_parts.topk import topk_token_sets, vocab_parallel_log_probs_at
from support.slime_loss import SHAPES, loss_args, sample_mean_reducer

TOPK_MODES = ["dppo_topk_tv", "dppo_topk_kl"]
VOCAB, K = 13, 4


def test_registry_marks_exactly_the_topk_modes():
    assert sorted(m for m, spec in LOSS_MODES.items() if spec.needs_topk) == sorted(TOPK_MODES)


# ------------------------------------------------------------------------------------------
# Fixture: full logits of mu and pi per response, sampled tokens, SGLang-style top-k
# ------------------------------------------------------------------------------------------


def _topk_data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    data = []
    for i, (total, resp) in enumerate(SHAPES):
        behavior_logits = 2.0 * torch.randn(resp, VOCAB, generator=g, dtype=torch.float64)
        current_logits = behavior_logits + 0.5 * torch.randn(resp, VOCAB, generator=g, dtype=torch.float64)
        sampled = torch.multinomial(torch.softmax(behavior_logits, -1), 1, generator=g).squeeze(1)
        prompt = torch.randint(0, VOCAB, (total - resp,), generator=g)
        log_mu_all = torch.log_softmax(behavior_logits, -1)
        topk_log_probs, topk_ids = log_mu_all.topk(K, dim=-1)
        topk_ids = topk_ids.to(torch.int32)
        if i == 1:  # SGLang returned fewer than k entries at one position
            topk_ids[2, -1], topk_log_probs[2, -1] = -1, 0.0
        mask = torch.ones(resp, dtype=torch.int32)
        if resp > 3:
            mask[resp // 2] = 0
        data.append(
            dict(
                total=total,
                resp=resp,
                behavior_logits=behavior_logits,
                current_logits=current_logits,
                tokens=torch.cat([prompt, sampled]),
                sampled=sampled,
                log_mu=log_mu_all.gather(1, sampled[:, None]).squeeze(1),
                log_pi=torch.log_softmax(current_logits, -1).gather(1, sampled[:, None]).squeeze(1),
                topk_ids=topk_ids,
                topk_log_probs=topk_log_probs.float(),
                mask=mask,
                adv=torch.full((resp,), [1.0, -0.7, 0.4, -1.3, 0.9][i], dtype=torch.float64),
            )
        )
    return data


def _slime_topk_inputs(data, rank, cp, args, gather_current=None):
    """A CP rank's batch, local log pi leaves and local log pi of the set ids."""
    leaves = [d["log_pi"].clone().requires_grad_(True) for d in data]
    positions = [zigzag_response_positions(d["total"], d["resp"], rank, cp) for d in data]
    masks = [d["mask"] for d in data]
    batch = {
        "unconcat_tokens": [d["tokens"] for d in data],
        "total_lengths": [d["total"] for d in data],
        "response_lengths": [d["resp"] for d in data],
        "loss_masks": masks,
        "advantages": [d["adv"][p] for d, p in zip(data, positions)],
        "rollout_log_probs": [d["log_mu"][p] for d, p in zip(data, positions)],
        "log_probs": None,
        "ref_log_probs": None,
        "rollout_mask_sums": None,
        "rollout_topk_ids": [d["topk_ids"] for d in data],
        "rollout_topk_log_probs": [d["topk_log_probs"] for d in data],
    }
    set_ids, set_masks = topk_token_sets(batch, batch["response_lengths"])
    local_ids = [ids[p] for ids, p in zip(set_ids, positions)]
    local_logits = [d["current_logits"][p] for d, p in zip(data, positions)]
    current = (gather_current or vocab_parallel_log_probs_at)(local_logits, local_ids, 0)
    log_probs = [leaf[p] for leaf, p in zip(leaves, positions)]
    reducer = sample_mean_reducer(positions, masks, [m.sum() for m in masks], False)
    return leaves, log_probs, batch, reducer, current, (set_ids, set_masks)


def _core_topk_reference(mode, data):
    """The core on padded tensors with the Top-K inputs built by the core's own helpers."""
    leaves = [d["log_pi"].clone().requires_grad_(True) for d in data]
    pad = lambda key: pad_sequence([d[key] for d in data], batch_first=True)  # noqa: E731
    ids, behavior, topk_mask = behavior_topk_set(
        pad("topk_ids").long(), pad("topk_log_probs").double(), pad("sampled"), pad("log_mu")
    )
    current = gather_log_probs(pad("current_logits"), ids, topk_mask)
    out = compute_policy_loss(
        mode,
        pad_sequence(leaves, batch_first=True),
        pad("log_mu"),
        pad("adv"),
        pad("mask").bool(),
        behavior_topk_log_probs=behavior,
        current_topk_log_probs=current,
        topk_mask=topk_mask,
    )
    loss = out.loss * len(data)  # slime's step normaliser for seq-mean-token-mean: the sample count
    loss.backward()
    return loss.detach(), [leaf.grad for leaf in leaves], out


@pytest.mark.parametrize("mode", TOPK_MODES)
def test_cp1_adapter_equals_core(mode):
    data = _topk_data()
    args = loss_args(mode)
    leaves, log_probs, batch, reducer, current, sets = _slime_topk_inputs(data, 0, 1, args)
    loss, metrics = slime_policy_loss_from_log_probs(
        args, batch, log_probs, None, reducer, current_topk_log_probs=current, topk_sets=sets
    )
    loss.backward()
    ref_loss, ref_grads, ref_out = _core_topk_reference(mode, data)
    torch.testing.assert_close(loss.detach(), ref_loss, rtol=1e-6, atol=1e-9)
    for leaf, grad in zip(leaves, ref_grads):
        torch.testing.assert_close(leaf.grad, grad, rtol=1e-6, atol=1e-9)
    assert 0 < float(ref_out.clipped.sum()) < float(ref_out.clipped.numel()), "the fixture must clip some tokens"
    # the set divergence (continuous in every set log-prob, unlike the loss): the core's value
    # weighted by the micro-batch's sample count, like every core diagnostic
    name = "topk_tv_mean" if mode.endswith("tv") else "topk_kl_mean"
    assert float(ref_out.metrics[name]) > 0
    torch.testing.assert_close(
        metrics[f"policy/{name}"].double(),
        torch.tensor(float(ref_out.metrics[name]) * len(data), dtype=torch.float64),
        rtol=1e-6,
        atol=1e-9,
    )
    # the sets are computed by the adapter when the caller does not pass them
    again, _ = slime_policy_loss_from_log_probs(args, batch, log_probs, None, reducer, current_topk_log_probs=current)
    torch.testing.assert_close(again.detach(), loss.detach())


def test_missing_topk_inputs_are_named():
    data = _topk_data()
    args = loss_args("dppo_topk_tv")
    _, log_probs, batch, reducer, current, _ = _slime_topk_inputs(data, 0, 1, args)
    with pytest.raises(PolicyLossInputError, match=r"\['rollout_topk_ids', 'rollout_topk_log_probs'\]"):
        slime_policy_loss_from_log_probs(
            args,
            {**batch, "rollout_topk_ids": None, "rollout_topk_log_probs": None},
            log_probs,
            None,
            reducer,
            current_topk_log_probs=current,
        )
    with pytest.raises(ValueError, match="current_topk_log_probs"):
        slime_policy_loss_from_log_probs(args, batch, log_probs, None, reducer)
    bad = {**batch, "rollout_topk_ids": [x[:-1] for x in batch["rollout_topk_ids"]]}
    with pytest.raises(
        PolicyLossInputError, match=r"batch\['rollout_topk_ids'\]\[0\] has shape \(4, 4\), expected \(5, 4\)"
    ):
        slime_policy_loss_from_log_probs(args, bad, log_probs, None, reducer, current_topk_log_probs=current)
    with pytest.raises(ValueError, match=r"current_topk_log_probs\[0\] has shape"):
        slime_policy_loss_from_log_probs(
            args, batch, log_probs, None, reducer, current_topk_log_probs=[c[:, :-1] for c in current]
        )


def test_vocab_gather_without_tp_is_log_softmax_at_ids_with_temperature():
    g = torch.Generator().manual_seed(5)
    logits = [torch.randn(n, VOCAB, generator=g) * 3 for n in (4, 0, 7)]
    ids = [torch.randint(-1, VOCAB, (len(x), K + 1), generator=g) for x in logits]
    got = vocab_parallel_log_probs_at(logits, ids, 0, temperature=0.7)
    for x, i, out in zip(logits, ids, got):
        expected = torch.log_softmax(x.double() / 0.7, -1).gather(1, i.clamp(min=0).long()).float()
        torch.testing.assert_close(out, torch.where(i >= 0, expected, 0.0), rtol=1e-5, atol=1e-5)
        assert not out.requires_grad


# ------------------------------------------------------------------------------------------
# Two gloo processes: a 2-way vocabulary split (TP) and CP = 2, against one process
# ------------------------------------------------------------------------------------------

TP_TEMPERATURE = 0.8


def _tp_case():
    g = torch.Generator().manual_seed(11)
    logits = [torch.randn(n, 2 * 7, generator=g) * 4 for n in (6, 1, 9)]  # vocabulary 14, 7 per rank
    ids = [torch.randint(-1, 14, (len(x), K + 1), generator=g) for x in logits]
    return logits, ids


def _worker(rank, world, init_file, result_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        results = {}
        logits, ids = _tp_case()
        width = logits[0].shape[1] // world

        def reduce(op):
            def fn(t):
                dist.all_reduce(t, op=op)
                return t

            return fn

        results["tp"] = vocab_parallel_log_probs_at(
            [x[:, rank * width : (rank + 1) * width] for x in logits],
            ids,
            rank * width,
            reduce(dist.ReduceOp.MAX),
            reduce(dist.ReduceOp.SUM),
            temperature=TP_TEMPERATURE,
        )
        gather = make_all_reduce_gather()
        for mode in TOPK_MODES:
            data = _topk_data()
            args = loss_args(mode)
            leaves, log_probs, batch, reducer, current, sets = _slime_topk_inputs(data, rank, world, args)
            loss, metrics = slime_policy_loss_from_log_probs(
                args,
                batch,
                log_probs,
                None,
                reducer,
                rank,
                world,
                gather,
                current_topk_log_probs=current,
                topk_sets=sets,
            )
            loss.backward()
            results[mode] = (loss.detach(), [leaf.grad.clone() for leaf in leaves], metrics)
        torch.save(results, f"{result_file}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(2, os.path.join(tmp, "init"), os.path.join(tmp, "out")), nprocs=2, join=True)
        return [torch.load(os.path.join(tmp, f"out.{r}")) for r in range(2)]


def test_tp_sharded_gather_equals_unsharded_log_softmax(two_ranks):
    logits, ids = _tp_case()
    for r in two_ranks:
        for x, i, out in zip(logits, ids, r["tp"]):
            expected = torch.log_softmax(x.double() / TP_TEMPERATURE, -1).gather(1, i.clamp(min=0).long())
            torch.testing.assert_close(out.double(), torch.where(i >= 0, expected, 0.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", TOPK_MODES)
def test_cp2_over_gloo_equals_cp1(two_ranks, mode):
    data = _topk_data()
    args = loss_args(mode)
    leaves, log_probs, batch, reducer, current, sets = _slime_topk_inputs(data, 0, 1, args)
    loss, metrics = slime_policy_loss_from_log_probs(
        args, batch, log_probs, None, reducer, current_topk_log_probs=current, topk_sets=sets
    )
    loss.backward()
    r0, r1 = two_ranks[0][mode], two_ranks[1][mode]
    torch.testing.assert_close(r0[0] + r1[0], loss.detach(), rtol=1e-12, atol=1e-14)
    assert any(float(leaf.grad.abs().sum()) > 0 for leaf in leaves)
    for i, leaf in enumerate(leaves):
        torch.testing.assert_close(r0[1][i] + r1[1][i], leaf.grad, rtol=1e-12, atol=1e-14)
        assert bool(((r0[1][i] == 0) | (r1[1][i] == 0)).all())
    for name in (
        "pg_loss",
        "pg_clipfrac",
        "ppo_kl",
        "policy/topk_tv_mean" if mode.endswith("tv") else "policy/topk_kl_mean",
    ):
        torch.testing.assert_close((r0[2][name] + r1[2][name]).double(), metrics[name].double(), rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------------
# Flags
# ------------------------------------------------------------------------------------------

BASE = [
    "--loss-type",
    "custom_loss",
    "--custom-loss-function-path",
    "epic_slime.slime.loss.policy_loss",
    "--rollout-batch-size",
    "4",
]
TOPK_OK = [
    "--policy-loss",
    "dppo_topk_kl",
    "--custom-generate-function-path",
    GENERATE_FUNCTION_PATH,
    "--slime-forwards-topk",
]


def test_topk_flag_default_and_value():
    config, _, _ = check_argv(BASE + TOPK_OK)
    assert config.policy_loss_topk == 20
    config, _, _ = check_argv(BASE + TOPK_OK + ["--policy-loss-topk", "5"])
    assert config.policy_loss_topk == 5 and config.policy_loss == "dppo_topk_kl"
    config, _, _ = check_argv(BASE + ["--policy-loss", "epic"])
    assert config.policy_loss_topk is None


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--policy-loss-topk", "0"], "--policy-loss-topk must be an int >= 1, got 0"),
        (["--policy-loss-topk", "-3"], "got -3"),
        (
            ["--custom-generate-function-path", "x.y"],
            "--custom-generate-function-path epic_slime.slime.generate.generate",
        ),
        (["--rollout-top-p", "0.9"], "--rollout-top-p 1.0"),
        (["--behavior-logprobs", "recompute"], "--behavior-logprobs rollout"),
        (["--allgather-cp"], "--allgather-cp"),
    ],
)
def test_bad_topk_flags_are_named(extra, message):
    with pytest.raises(ProjectFlagError, match=message.replace(".", r"\.").replace("-", r"\-")):
        check_argv(BASE + TOPK_OK + extra)


def test_topk_mode_is_refused_unless_slime_forwards_the_data():
    argv = BASE + [a for a in TOPK_OK if a != "--slime-forwards-topk"]
    with pytest.raises(ProjectFlagError, match="rollout_topk_ids and rollout_topk_log_probs"):
        check_argv(argv)
    with pytest.raises(ProjectFlagError, match="must be an int >= 1"):
        check_argv(BASE + ["--policy-loss", "epic", "--policy-loss-topk", "0"])


# ------------------------------------------------------------------------------------------
# The generate function: request payload and answer parsing (fake SGLang answer, no network)
# ------------------------------------------------------------------------------------------


def _sglang_answer(tokens, log_probs, top):
    return {
        "text": "abc",
        "meta_info": {
            "finish_reason": {"type": "stop"},
            "output_token_logprobs": [[lp, t, None] for t, lp in zip(tokens, log_probs)],
            "output_top_logprobs": [[[lp, t, None] for t, lp in row] for row in top],
        },
    }


ANSWER = _sglang_answer(
    [7, 3, 9],
    [-0.1, -2.5, -0.7],
    [[(7, -0.1), (2, -2.4), (5, -3.0)], [(1, -0.3), (4, -1.6), (3, -2.5)], [(9, -0.7), (8, None)]],
)


def test_parse_top_logprobs():
    ids, lps = gen.parse_top_logprobs(ANSWER["meta_info"], 3, 3)
    assert ids.dtype == torch.int32 and lps.dtype == torch.float32
    assert ids.tolist() == [[7, 2, 5], [1, 4, 3], [9, 8, -1]]
    assert lps[0].tolist() == pytest.approx([-0.1, -2.4, -3.0])
    assert lps[2, 1] == -math.inf and lps[2, 2] == 0.0  # null -> probability 0; short row -> absent
    assert gen.parse_generated_tokens(ANSWER["meta_info"]) == ([7, 3, 9], [-0.1, -2.5, -0.7])
    with pytest.raises(ValueError, match="more than top_logprobs_num=2"):
        gen.parse_top_logprobs(ANSWER["meta_info"], 2, 3)
    with pytest.raises(ValueError, match="3 positions for 4 generated tokens"):
        gen.parse_top_logprobs(ANSWER["meta_info"], 3, 4)
    with pytest.raises(ValueError, match="without meta_info.output_top_logprobs"):
        gen.parse_top_logprobs({"output_token_logprobs": []}, 3, 0)
    bad = _sglang_answer([1], [-0.1], [[(1, 0.5)]])
    with pytest.raises(ValueError, match=r"output_top_logprobs\[0\]\[0\]: log-prob 0.5"):
        gen.parse_top_logprobs(bad["meta_info"], 3, 1)


class _FakeSample:
    """The part of slime's Sample the generate function uses (append_response_tokens as documented)."""

    class Status:
        PENDING, ABORTED, TRUNCATED, COMPLETED = "pending", "aborted", "truncated", "completed"

    def __init__(self, prompt_tokens, response=(), response_log_probs=()):
        self.index, self.prompt, self.multimodal_inputs, self.session_id = 0, "p", None, "s1"
        self.tokens = list(prompt_tokens) + list(response)
        self.response_length = len(response)
        self.rollout_log_probs = list(response_log_probs) or None
        self.status = self.Status.PENDING

    def append_response_tokens(self, args, *, tokens, log_probs, trainable, meta_info, text):
        assert trainable
        self.tokens += tokens
        self.response_length += len(tokens)
        self.rollout_log_probs = (self.rollout_log_probs or []) + log_probs
        self.status = self.Status.COMPLETED


def _install_fake_slime(monkeypatch, answer, calls):
    async def post(url, payload, headers=None):
        calls.append((url, payload, headers))
        return answer

    async def slime_generate(args, sample, sampling_params):
        calls.append(("slime", sampling_params))
        return sample

    modules = {
        "slime": types.ModuleType("slime"),
        "slime.rollout": types.ModuleType("slime.rollout"),
        "slime.rollout.sglang_rollout": types.SimpleNamespace(generate=slime_generate),
        "slime.utils": types.ModuleType("slime.utils"),
        "slime.utils.http_utils": types.SimpleNamespace(post=post),
        "slime.utils.types": types.SimpleNamespace(Sample=_FakeSample),
    }
    modules["slime.rollout"].sglang_rollout = modules["slime.rollout.sglang_rollout"]
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)


def _gen_args(mode="dppo_topk_tv", k=3):
    return argparse.Namespace(
        policy_loss=mode,
        policy_loss_topk=k,
        sglang_router_ip="127.0.0.1",
        sglang_router_port=3000,
        use_rollout_routing_replay=False,
        router_policy="consistent_hashing",
    )


def test_generate_requests_top_logprobs_and_stores_them(monkeypatch):
    calls = []
    _install_fake_slime(monkeypatch, ANSWER, calls)
    sample = _FakeSample([11, 12], response=[4, 6], response_log_probs=[-0.2, -0.3])  # a resumed partial rollout
    params = {"max_new_tokens": 10, "temperature": 1.0}
    out = asyncio.run(gen.generate(_gen_args(), sample, params))
    url, payload, headers = calls[0]
    assert url == "http://127.0.0.1:3000/generate"
    assert payload == {
        "input_ids": [11, 12, 4, 6],
        "sampling_params": {"max_new_tokens": 8, "temperature": 1.0},
        "return_logprob": True,
        "top_logprobs_num": 3,
    }
    assert headers == {"X-SMG-Routing-Key": "s1"} and params["max_new_tokens"] == 10
    assert out.response_length == 5 and out.tokens[-3:] == [7, 3, 9]
    assert out.rollout_topk_ids.shape == (5, 3) and out.rollout_topk_log_probs.shape == (5, 3)
    assert out.rollout_topk_ids[:2].tolist() == [[-1] * 3] * 2  # rows of the earlier tokens are absent
    assert out.rollout_topk_ids[2:].tolist() == [[7, 2, 5], [1, 4, 3], [9, 8, -1]]
    # evaluation and the other modes use slime's own generate
    asyncio.run(gen.generate(_gen_args(), _FakeSample([1]), {"max_new_tokens": 4}, evaluation=True))
    asyncio.run(gen.generate(_gen_args("epic"), _FakeSample([1]), {"max_new_tokens": 4}))
    assert [c[0] for c in calls[1:]] == ["slime", "slime"]


def test_generated_topk_rows_feed_the_adapter(monkeypatch):
    """The Sample arrays are what the adapter reads as batch keys (shapes, absent rows)."""
    calls = []
    _install_fake_slime(monkeypatch, ANSWER, calls)
    sample = asyncio.run(gen.generate(_gen_args(), _FakeSample([11, 12]), {"max_new_tokens": 10}))
    batch = {
        "rollout_topk_ids": [sample.rollout_topk_ids],
        "rollout_topk_log_probs": [sample.rollout_topk_log_probs],
        "unconcat_tokens": [torch.tensor(sample.tokens)],
    }
    (ids,), (mask,) = topk_token_sets(batch, [sample.response_length])
    assert ids.tolist() == [[7, 2, 5, 7], [1, 4, 3, 3], [9, 8, -1, 9]]
    assert mask.tolist() == [[True, True, True, False], [True, True, True, False], [True, True, False, False]]


def test_launch_method_configs_thread_the_topk_flags():
    from support.launch_helpers import dry_run as _dry_run, flag_value as _flag, submit_command as _command

    refused = _dry_run("--method", "dppo_topk_tv")
    assert refused.returncode != 0 and "--slime-forwards-topk" in refused.stderr
    result = _dry_run("--method", "dppo_topk_kl", "--", "--slime-forwards-topk", "--policy-loss-topk", "8")
    assert result.returncode == 0, result.stderr
    driver = _command(result)
    assert _flag(driver, "--policy-loss") == "dppo_topk_kl"
    assert _flag(driver, "--custom-generate-function-path") == GENERATE_FUNCTION_PATH
    assert "policy_loss_topk=8" in result.stdout  # flags after -- come last and win
