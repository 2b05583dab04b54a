"""The engine side of slime's hand-back path (tests/slime_adapter/test_slime_hand_back.py): what
slime's synchronous ``generate_rollout`` talks to when it aborts the groups left over at the end of
a rollout and, with ``--partial-rollout``, hands them back through ``data_source.add_samples``.

- ``generate`` is a ``--custom-generate-function-path`` (slime's ``generate_and_rm`` calls it per
  sample): a group in ``ENGINE.slow`` waits until the engine is aborted and comes back ABORTED with
  no token and no weight version (it was queued when slime aborted); every other sample gets two
  tokens with the engine's weight version, and its reward.
- ``EngineHttp`` answers the three HTTP calls of slime's ``abort``: the router's ``GET /workers``
  (this one engine), the engine's ``POST /abort_request`` (which releases the waiting groups) and
  ``GET /v1/loads`` (idle once aborted).
"""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class EngineState:
    def __init__(self) -> None:
        self.version = 1
        self.slow: set[int] = set()
        self.aborted = threading.Event()
        self.calls: list[int] = []  # group_index per generate call (one per sample)
        self.abort_requests = 0

    def next_rollout(self, version: int, slow: set[int]) -> None:
        self.version, self.slow = version, set(slow)
        self.aborted.clear()


ENGINE = EngineState()


async def generate(args, sample, sampling_params):
    from slime.utils.types import Sample

    key = sample.group_index
    ENGINE.calls.append(key)
    if key in ENGINE.slow:
        while not ENGINE.aborted.is_set():
            await asyncio.sleep(0.002)
        sample.status = Sample.Status.ABORTED
        return sample
    sample.tokens = sample.tokens or [3]  # the prompt, as slime's generate sets it (the sample check needs one)
    sample.append_response_tokens(
        args,
        tokens=[7, 8],
        log_probs=[-0.1, -0.2],
        meta_info={"weight_version": str(ENGINE.version), "finish_reason": {"type": "stop"}},
    )
    sample.reward = 1.0
    return sample


class _Handler(BaseHTTPRequestHandler):
    def _reply(self, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path.startswith("/workers"):
            self._reply({"workers": [{"url": f"http://127.0.0.1:{self.server.server_port}"}]})
        else:  # /v1/loads?include=core
            self._reply({"num_reqs": 0 if ENGINE.aborted.is_set() else len(ENGINE.slow)})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        ENGINE.abort_requests += 1
        ENGINE.aborted.set()
        self._reply({})

    def log_message(self, *args):  # quiet
        pass


class EngineHttp:
    """Router and engine on one loopback port, served from a thread."""

    def __enter__(self) -> EngineHttp:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
