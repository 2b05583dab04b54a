"""The router stand-in (tests/support/router_standin.py) and the real sglang-router 0.3.2, each in front
of the same two SGLang stand-ins (engines that count what they serve, which the real SGLang server
cannot): ``POST /workers`` and ``DELETE /workers/{id}`` answer 202 (queued: the real router lists the
change a moment later), ``GET /workers`` lists them, and the default ``cache_aware`` policy routes
by the request's text: requests with ``input_ids`` only, as slime sends them, all go to the first
worker (the stand-in runs with ``--route-by text``; its default, by ``input_ids``, spreads new
prompts, which the real router does not). The real router needs only the real SGLang venv."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import subprocess
import sys
import time

import pytest

if importlib.util.find_spec("aiohttp") is None or importlib.util.find_spec("requests") is None:
    pytest.skip("the router and SGLang stand-ins need aiohttp and requests", allow_module_level=True)

import requests  # noqa: E402

from support import real_sglang  # noqa: E402
from support.sglang_client import REPO, standin_factory, tokens_of  # noqa: E402


class _RouterStandIn:
    def __init__(self, workdir):
        port_file = workdir / "router_port"
        self.log = open(workdir / "router_standin.log", "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "tests" / "support" / "router_standin.py"),
                "--port-file",
                str(port_file),
                "--route-by",
                "text",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, "router stand-in did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{int(port_file.read_text())}"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


@pytest.fixture(scope="module", params=["standin", "real"])
def routed(request, tmp_path_factory):
    """(router url, [two engines]) with no worker registered yet."""
    workdir = tmp_path_factory.mktemp(f"router_{request.param}")
    if request.param == "real" and real_sglang.unavailable_reason() is not None:
        reason = real_sglang.unavailable_reason()
        if real_sglang.required():
            pytest.fail(f"{real_sglang.REQUIRE_ENV}=1 and {reason}", pytrace=False)
        pytest.skip(reason)
    with standin_factory(workdir) as start:
        engines = [start(), start()]
        router = (
            real_sglang.RealRouter([], workdir).wait_ready() if request.param == "real" else _RouterStandIn(workdir)
        )
        try:
            yield router.url, engines
        finally:
            router.stop()


def _http():
    s = requests.Session()
    s.trust_env = False
    return s


def _listed(url, expected, timeout=60):
    """``GET /workers`` until it lists ``expected`` (the real router applies a 202 a moment later)."""
    deadline = time.monotonic() + timeout
    while True:
        workers = _http().get(f"{url}/workers", timeout=10).json()["workers"]
        if sorted(w["url"] for w in workers) == sorted(expected) or time.monotonic() > deadline:
            return workers
        time.sleep(0.25)


def test_workers_register_route_by_prefix_and_leave(routed):
    url, engines = routed
    http = _http()
    for engine in engines:
        reply = http.post(f"{url}/workers", json={"url": engine.url}, timeout=30)
        assert reply.status_code == 202, reply.text
    workers = _listed(url, [e.url for e in engines])
    assert sorted(w["url"] for w in workers) == sorted(e.url for e in engines)
    assert all("id" in w for w in workers)

    # 3 groups of 4 samples, each group sent at once (as slime sends a group), the groups in turn
    body = lambda ids: {"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "temperature": 1.0}}  # noqa: E731
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for text in ("3+4=", "12+30=", "7*7="):
            replies = list(
                pool.map(lambda _: http.post(f"{url}/generate", json=body(tokens_of(text)), timeout=120), range(4))
            )
            assert all(r.status_code == 200 for r in replies)
    # the cache-aware tree keys on the request's text: input_ids-only requests (slime's) all match nothing
    # and go to the smallest tree, one worker (the real router breaks the tie by its own order), while
    # the loads stay balanced (within 64)
    served = [e.stats().get("requests", 0) for e in engines]
    assert sorted(served) == [0, 12], f"every input_ids request on one worker: {served}"

    gone = next(w for w in workers if w["url"] == engines[0].url)
    assert http.delete(f"{url}/workers/{gone['id']}", timeout=30).status_code == 202
    assert [w["url"] for w in _listed(url, [engines[1].url])] == [engines[1].url]
    before = engines[1].stats().get("requests", 0)
    assert http.post(f"{url}/generate", json=body(tokens_of("1+1=")), timeout=120).status_code == 200
    assert engines[1].stats()["requests"] == before + 1
