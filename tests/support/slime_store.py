"""slime's RolloutManager data path on CPU: its own ``_convert_samples_to_train_data`` and
``_split_train_data_by_dp`` (``slime/ray/rollout.py``), and the train side's per-rank fetch
(``slime.utils.data.process_rollout_data``), with Ray's object store stood in for.

- ``rollout_manager_class``: slime's ``RolloutManager`` class itself (the one ``@ray.remote``
  wraps). ``slime/ray/rollout.py`` imports SGLang's memory-type constants, slime's SGLang engine
  actor (which imports SGLang's server) and wandb at module level; where they are not installed,
  inert placeholders stand in for those three modules (nothing of them is called on this path);
- ``ObjectStoreStandIn``: ``ray.put`` / ``ray.get`` as slime's two modules call them. ``put``
  serialises (pickle, as Ray does for what is not a numpy buffer), ``get`` deserialises a fresh
  copy and records who fetched which object, its serialised bytes and the bytes of the tensors in
  it: a train rank sets who it is with ``fetching_as(rank)``. Installed as the ``ray`` of ``slime.ray.rollout`` and of
  ``slime.utils.data`` by ``install``.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import itertools
import pickle
import sys
import threading
import types
from collections import Counter


def _placeholder(name: str, **attrs) -> None:
    import importlib.machinery

    module = types.ModuleType(name)
    # a spec, as an imported module has: ``importlib.util.find_spec`` raises ValueError on a module in
    # sys.modules whose __spec__ is None (accelerate probes wandb that way when transformers imports it)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attrs)
    module.__epic_placeholder__ = True
    sys.modules[name] = module


def remove_placeholders() -> list[str]:
    """Take the placeholders out of ``sys.modules`` (``slime.ray.rollout`` keeps what it bound), so
    that later ``find_spec`` / imports in this process see what is really installed."""
    names = [n for n, m in list(sys.modules.items()) if getattr(m, "__epic_placeholder__", False)]
    for name in names:
        del sys.modules[name]
    return names


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent that is a placeholder or not a package
        return False


def rollout_manager_class():
    """slime's RolloutManager class (undecorated), importing ``slime.ray.rollout`` here."""
    if "slime.ray.rollout" not in sys.modules:
        if not _installed("sglang"):
            # SGLang 0.5.15's values; slime reads them only to offload / onload engines
            _placeholder("sglang")
            _placeholder("sglang.srt")
            _placeholder(
                "sglang.srt.constants",
                GPU_MEMORY_TYPE_WEIGHTS="weights",
                GPU_MEMORY_TYPE_KV_CACHE="kv_cache",
                GPU_MEMORY_TYPE_CUDA_GRAPH="cuda_graph",
            )
            _placeholder("slime.backends.sglang_utils.sglang_engine", SGLangEngine=None)
        if not _installed("wandb"):
            _placeholder("wandb")
    import slime.ray.rollout as rollout

    return rollout.RolloutManager.__ray_actor_class__


def tensor_bytes(value) -> int:
    """The bytes of every tensor / numpy array inside ``value`` (dicts, lists, tuples walked)."""
    if hasattr(value, "nbytes") and hasattr(value, "dtype"):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


class ObjectRefStandIn:
    def __init__(self, key: int, nbytes: int):
        self.key, self.nbytes = key, nbytes

    def __repr__(self):
        return f"ObjectRefStandIn({self.key}, {self.nbytes} B)"


class ObjectStoreStandIn:
    """``ray.put`` / ``ray.get`` over pickled objects; counts what each fetcher read."""

    def __init__(self):
        self._objects: dict[int, tuple[bytes, int]] = {}  # key -> (pickle, tensor bytes)
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self._who = threading.local()
        self.fetches: list[dict] = []  # {"fetcher", "key", "bytes"} per get, in order
        self.put_bytes = 0

    def put(self, value, **kwargs) -> ObjectRefStandIn:
        if kwargs.get("_tensor_transport") not in (None, "object_store"):
            raise ValueError(f"the object store stand-in has no tensor transport {kwargs['_tensor_transport']!r}")
        blob = pickle.dumps(value, protocol=5)
        with self._lock:
            key = next(self._keys)
            self._objects[key] = (blob, tensor_bytes(value))
            self.put_bytes += len(blob)
        return ObjectRefStandIn(key, len(blob))

    def get(self, ref, timeout=None):
        if isinstance(ref, list):
            return [self.get(r) for r in ref]
        if not isinstance(ref, ObjectRefStandIn):
            raise TypeError(f"ray.get stand-in takes an ObjectRefStandIn or a list of them, got {type(ref).__name__}")
        with self._lock:
            blob, tensors = self._objects[ref.key]
            self.fetches.append(
                {
                    "fetcher": getattr(self._who, "name", None),
                    "key": ref.key,
                    "bytes": len(blob),
                    "tensor_bytes": tensors,
                }
            )
        return pickle.loads(blob)

    @contextlib.contextmanager
    def fetching_as(self, name):
        before = getattr(self._who, "name", None)
        self._who.name = name
        try:
            yield
        finally:
            self._who.name = before

    def bytes_by_fetcher(self) -> Counter:
        with self._lock:
            out = Counter()
            for f in self.fetches:
                out[f["fetcher"]] += f["bytes"]
            return out

    def drop(self, refs) -> None:
        """Free objects no one fetches again (Ray frees an object when its refs go)."""
        with self._lock:
            for ref in refs:
                self._objects.pop(ref.key, None)


def install(store: ObjectStoreStandIn) -> None:
    """``store`` as the ``ray`` that slime's split (``ray.put``) and per-rank fetch (``ray.get``)
    call; the rest of either module is untouched."""
    rollout_manager_class()
    import slime.ray.rollout as rollout
    import slime.utils.data as data

    rollout.ray = types.SimpleNamespace(put=store.put)
    data.ray = types.SimpleNamespace(get=store.get)
