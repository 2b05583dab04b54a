"""slime 624b824a's own engine-failure detection, run without GPUs against a REAL SGLang server behind
the REAL router: ``RolloutHealthMonitor`` (its thread, first wait, interval, timeout and kill) over
``SGLangEngine`` objects built with ``object.__new__`` and the attributes its ``health_generate`` and
``shutdown`` read (``server_host``, ``server_port``, ``router_ip``, ``router_port``, ``node_rank``,
``worker_type``, ``process``).

Stand-ins, only for what cannot run here: Ray (the engines are Ray actors on a cluster: ``EngineActor``
calls the method at once and ``RayShim.get`` returns or raises its result, ``RayShim.kill`` drops the
handle) and the two SGLang functions ``sglang_engine.py`` imports at module level (``ServerArgs``, unused
here; ``kill_process_tree``, which here kills the victim's process group as SGLang's kills its tree)
when SGLang is not importable (it lives in a venv of its own: ``real_sglang.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import types
from types import SimpleNamespace


def _kill_process_tree(pid, *_, **__):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGCONT)  # a stopped process group dies on SIGKILL all the same
        os.killpg(pid, signal.SIGKILL)


@contextlib.contextmanager
def slime_sglang_engine_class():
    """slime's ``SGLangEngine`` class, importable without SGLang (its two module-level names stubbed)."""
    added = []
    try:
        import sglang.srt.server_args  # noqa: F401
    except ImportError:
        for name in ("sglang", "sglang.srt", "sglang.srt.server_args", "sglang.srt.utils"):
            if name not in sys.modules:
                sys.modules[name] = types.ModuleType(name)
                added.append(name)
        sys.modules["sglang.srt.server_args"].ServerArgs = object
        sys.modules["sglang.srt.utils"].kill_process_tree = _kill_process_tree
    try:
        from slime.backends.sglang_utils import sglang_engine

        yield sglang_engine.SGLangEngine
    finally:
        for name in added:
            sys.modules.pop(name, None)
        sys.modules.pop("slime.backends.sglang_utils.sglang_engine", None)


class _Ref:
    def __init__(self, fn, *a, **kw):
        try:
            self.value, self.error = fn(*a, **kw), None
        except Exception as exc:  # noqa: BLE001 - raised again by RayShim.get, as ray.get does
            self.value, self.error = None, exc


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *a, **kw):
        return _Ref(self.fn, *a, **kw)


class EngineActor:
    """A Ray actor handle's interface over a local object: ``handle.method.remote(...)``."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return _Method(getattr(self.engine, name))


class RayShim:
    """``ray.get`` / ``ray.kill`` for ``health_monitor``'s module global ``ray``."""

    def __init__(self):
        self.killed: list = []

    @staticmethod
    def get(ref):
        if isinstance(ref, list):
            return [RayShim.get(r) for r in ref]
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(self, handle):
        self.killed.append(handle)


def make_engine(engine_class, server_url: str, router_url: str, pid: int):
    """An ``SGLangEngine`` as ``init`` leaves it on node rank 0 (no server launched: it runs already)."""
    engine = object.__new__(engine_class)
    host, port = server_url.rsplit("//", 1)[1].rsplit(":", 1)
    r_host, r_port = router_url.rsplit("//", 1)[1].rsplit(":", 1)
    engine.args = SimpleNamespace(rollout_external=False)
    engine.rank, engine.node_rank, engine.worker_type = 0, 0, "regular"
    engine.server_host, engine.server_port = host, int(port)
    engine.router_ip, engine.router_port = r_host, int(r_port)
    engine.process = SimpleNamespace(pid=pid)
    return engine


def server_group(handles: list) -> SimpleNamespace:
    """The monitor's view of slime's ``ServerGroup``: ``all_engines``, ``engines``, ``nodes_per_engine``."""
    group = SimpleNamespace(all_engines=list(handles), nodes_per_engine=1)
    group.engines = group.all_engines  # one node per engine: the same list, as slime's property gives
    return group
