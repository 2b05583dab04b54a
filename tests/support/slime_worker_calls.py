"""slime 624b824a's own router calls of an SGLang engine actor, made on an object built without GPUs:
``SGLangEngine._register_to_router`` (``POST /workers {"url", "worker_type"}``, what its ``init`` ends
with) and ``SGLangEngine.shutdown`` (``GET /workers``, then ``DELETE /workers/{id}`` of its own url).

slime's module imports SGLang (``ServerArgs``, ``kill_process_tree``), which does not install in the
project's CPU venv; this runs in a child process of its own (``python slime_worker_calls.py remove|add
ROUTER_URL ENGINE_URL``) with those two names stood in for in ``sys.modules``. ``shutdown`` ends with
``kill_process_tree(self.process.pid)``: here the stand-in records the pid and kills nothing, so the
router forgets an engine that still serves (the router's fault alone; a dead engine is another test's).
Prints one JSON line: what was called, the router's answer and the seconds it took.
"""

from __future__ import annotations

import json
import sys
import time
import types
from urllib.parse import urlparse


def _stand_in_sglang(killed: list) -> None:
    """The two SGLang names slime's engine module imports at its top."""
    server_args = types.ModuleType("sglang.srt.server_args")
    server_args.ServerArgs = type("ServerArgs", (), {})
    utils = types.ModuleType("sglang.srt.utils")
    utils.kill_process_tree = killed.append  # shutdown's process kill: recorded, nothing killed
    for name in ("sglang", "sglang.srt"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["sglang.srt.server_args"] = server_args
    sys.modules["sglang.srt.utils"] = utils


def engine_actor(router_url: str, engine_url: str, killed: list):
    """slime's ``SGLangEngine`` with the attributes its ``init`` sets that the two calls read."""
    _stand_in_sglang(killed)
    from slime.backends.sglang_utils.sglang_engine import SGLangEngine

    router, engine = urlparse(router_url), urlparse(engine_url)
    actor = object.__new__(SGLangEngine)
    actor.args = types.SimpleNamespace(rollout_external=False)
    actor.worker_type, actor.node_rank = "regular", 0
    actor.router_ip, actor.router_port = router.hostname, router.port
    actor.server_host, actor.server_port = engine.hostname, engine.port
    actor.process = types.SimpleNamespace(pid=-1)  # never killed (see the module docstring)
    return actor


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("remove", "add"):
        raise SystemExit("usage: slime_worker_calls.py remove|add ROUTER_URL ENGINE_URL")
    action, router_url, engine_url = argv
    killed: list = []
    actor = engine_actor(router_url, engine_url, killed)
    started = time.monotonic()
    if action == "remove":
        actor.shutdown()  # slime: GET /workers, DELETE /workers/{id}, then the (stood-in) process kill
    else:
        actor._register_to_router({})  # slime: POST /workers {"url": ..., "worker_type": "regular"}
    print(json.dumps({"action": action, "seconds": time.monotonic() - started, "killed_pids": killed}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
