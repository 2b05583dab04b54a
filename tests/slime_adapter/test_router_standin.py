"""The router stand-in (tests/support/router_standin.py) against sglang-router 0.3.2's behaviour
as slime 624b824a uses it: engines register with ``POST /workers``, slime's abort reads
``GET /workers`` and aborts every engine, ``POST /generate`` goes to one engine by the default
``cache_aware`` policy (a group's samples share an engine's prefix cache, new prompts spread,
an imbalance goes to the least loaded). The policy is checked in process; the HTTP path in front
of two SGLang stand-ins with slime's own HTTP client (``slime.utils.http_utils``) and abort
(``slime.backends.sglang_utils.server_control``)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("aiohttp") is None or importlib.util.find_spec("requests") is None:
    pytest.skip("the router and SGLang stand-ins need aiohttp and requests", allow_module_level=True)

from support.router_standin import Router  # noqa: E402


def test_a_prompt_stays_on_the_worker_that_has_its_prefix_and_new_prompts_spread():
    router = Router()
    a, b = router.add("http://127.0.0.1:1"), router.add("http://127.0.0.1:2")
    p, q = [1, 5, 6, 7, 8], [1, 9, 9, 3, 4]  # share only the first token: 0.2 <= the 0.3 threshold
    first = router.choose(p)
    assert [router.choose(p) for _ in range(3)] == [first] * 3  # the group's other samples
    assert router.choose(q) == ({a, b} - {first}).pop()  # the smaller tree
    assert router.choose(p + [2, 2]) == first  # a resubmission (prompt + partial)
    assert router.stats["prefix_match"] == 4 and router.stats["smallest_tree"] == 2
    assert router.stats["inputs_on_several_workers"] == 0


def test_round_robin_splits_a_group_and_the_router_counts_it():
    """The check the e2e run relies on can fail: round robin sends a group's samples to both."""
    router = Router(policy="round_robin")
    router.add("http://127.0.0.1:1"), router.add("http://127.0.0.1:2")
    for _ in range(4):
        router.choose([1, 2, 3])
    assert router.stats["inputs_on_several_workers"] == 1


def test_an_imbalanced_load_goes_to_the_least_loaded_worker():
    router = Router(balance_abs_threshold=2, balance_rel_threshold=1.5)
    a, b = router.add("http://127.0.0.1:1"), router.add("http://127.0.0.1:2")
    p = [1, 2, 3]
    assert router.choose(p) == a
    router.load[a] = 3  # 3 - 0 > 2 and 3 > 1.5 * 0
    assert router.choose(p) == b and router.stats["shortest_queue"] == 1
    router.load[b] = 2  # 3 - 2 <= 2: balanced again, the prefix wins
    assert router.choose(p) in (a, b) and router.stats["prefix_match"] == 1


def test_round_robin_and_bad_registrations_name_the_field():
    router = Router(policy="round_robin")
    ids = [router.add(f"http://127.0.0.1:{i}") for i in (1, 2)]
    assert [router.choose([1]) for _ in range(4)] == ids * 2
    with pytest.raises(ValueError, match="already registered"):
        router.add("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="url must be"):
        router.add("127.0.0.1:3")
    with pytest.raises(ValueError, match="policy must be one of"):
        Router(policy="power_of_two")
    router.remove(ids[0])
    assert list(router.workers) == [ids[1]]
    with pytest.raises(LookupError, match="no worker"):
        Router().choose([1])


# ---- over HTTP, in front of two SGLang stand-ins, with slime's client code

_SLIME = os.environ.get("SLIME_PATH") or str(
    Path(__file__).resolve().parents[3] / "shared" / "vendor" / "slime-624b824a"
)


@pytest.fixture
def two_engines(tmp_path):
    if not os.path.isdir(os.path.join(_SLIME, "slime")) or importlib.util.find_spec("httpx") is None:
        pytest.skip("needs slime's source (SLIME_PATH or ../shared/vendor/slime-624b824a) and httpx")
    if _SLIME not in sys.path:
        sys.path.insert(0, _SLIME)
    from support.slime_e2e_harness import ROLLOUT_MAX_RESPONSE_LEN, RouterServer, Server

    engines = []
    for i in range(2):
        (tmp_path / f"engine{i}").mkdir()
        # requests capped at the rollout's response length cannot stop early: they are still running for the abort
        engines.append(
            Server(
                str(tmp_path / f"engine{i}"),
                long_every=1,
                long_min_new_tokens=ROLLOUT_MAX_RESPONSE_LEN,
                extra_args=["--step-seconds", "0.1"],
            )
        )
    router = RouterServer(str(tmp_path), engines)
    yield router, engines
    router.stop()
    for engine in engines:
        engine.stop()


def _slime_client(engines: int):
    from slime.utils import http_utils

    http_utils._http_client = None
    http_utils.init_http_client(
        argparse.Namespace(
            rollout_num_gpus=engines,
            rollout_num_gpus_per_engine=1,
            sglang_server_concurrency=8,
            use_distributed_post=False,
        )
    )
    return http_utils


def test_groups_share_an_engine_and_slimes_abort_reaches_both(two_engines):
    """12 requests (3 prompts x 4 samples) through slime's ``post`` to the router: each prompt's
    samples land on one engine (its prefix cache hit 3 times), the prompts on both engines. Then
    slime's abort path (the router's worker list, every engine aborted until idle) ends requests
    running on both engines."""
    from support.sglang_client import tokens_of

    router, engines = two_engines
    prompts = [tokens_of(p) for p in ("3+4=", "12+30=", "7*7=")]

    async def run():
        http = _slime_client(2)
        url = f"{router.url}/generate"
        body = lambda ids: {"input_ids": ids, "sampling_params": {"max_new_tokens": 6, "temperature": 1.0}}  # noqa: E731
        answers = await asyncio.gather(*(http.post(url, body(p)) for p in prompts for _ in range(4)))
        workers = (await http.get(f"{router.url}/workers"))["workers"]
        return answers, workers

    answers, workers = asyncio.run(run())
    assert len(answers) == 12 and all(a["meta_info"]["finish_reason"]["type"] in ("stop", "length") for a in answers)
    assert sorted(w["url"] for w in workers) == sorted(e.url for e in engines)
    stats, per_engine = router.stats(), [e.stats() for e in engines]
    assert stats["prefix_match"] == 9 and stats["smallest_tree"] == 3, stats
    assert stats.get("inputs_on_several_workers", 0) == 0, stats
    assert sorted(s["requests"] for s in per_engine) == [4, 8], per_engine
    assert all(s["requests"] % 4 == 0 and s["requests"] > 0 for s in per_engine), per_engine
    # each group's 3 later samples hit its prompt's prefix (another prompt on the engine may add a <bos> hit)
    assert sum(s.get("prefix_hits", 0) for s in per_engine) >= 9, per_engine

    async def abort():
        from slime.backends.sglang_utils.server_control import abort_servers_until_idle

        http = _slime_client(2)
        from support.slime_e2e_harness import ROLLOUT_MAX_RESPONSE_LEN

        long = {"sampling_params": {"max_new_tokens": ROLLOUT_MAX_RESPONSE_LEN, "temperature": 1.0}}
        running = [
            asyncio.ensure_future(http.post(f"{router.url}/generate", {"input_ids": p, **long})) for p in prompts
        ]
        deadline = asyncio.get_running_loop().time() + 30
        while sum([(await http.get(f"{e.url}/v1/loads"))["loads"][0]["num_running_reqs"] for e in engines]) < len(
            prompts
        ):
            assert asyncio.get_running_loop().time() < deadline, "the requests never ran on the engines"
            await asyncio.sleep(0.02)
        urls = [w["url"] for w in (await http.get(f"{router.url}/workers"))["workers"]]  # slime's abort()
        await abort_servers_until_idle(urls)
        return await asyncio.gather(*running)

    aborted = asyncio.run(abort())
    assert all(a["meta_info"]["finish_reason"]["type"] == "abort" for a in aborted)
    assert all(e.stats().get("abort_requests", 0) >= 1 for e in engines)


def test_an_engine_leaving_is_removed_and_the_rest_keep_serving(two_engines):
    """An engine's shutdown (slime: find its id in GET /workers, DELETE /workers/{id})."""
    import requests

    from support.sglang_client import tokens_of

    router, engines = two_engines
    s = requests.Session()
    s.trust_env = False
    workers = s.get(f"{router.url}/workers", timeout=10).json()["workers"]
    gone = next(w for w in workers if w["url"] == engines[0].url)
    assert s.delete(f"{router.url}/workers/{gone['id']}", timeout=10).status_code == 202
    assert s.delete(f"{router.url}/workers/{gone['id']}", timeout=10).status_code == 404
    assert [w["url"] for w in s.get(f"{router.url}/workers", timeout=10).json()["workers"]] == [engines[1].url]
    reply = s.post(
        f"{router.url}/generate",
        json={"input_ids": tokens_of("1+1="), "sampling_params": {"max_new_tokens": 4}},
        timeout=60,
    )
    assert (
        reply.status_code == 200 and engines[1].stats()["requests"] == 1 and engines[0].stats().get("requests", 0) == 0
    )
