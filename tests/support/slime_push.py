"""slime's distributed weight push on CPU: slime 624b824a's own
``UpdateWeightFromDistributed.update_weights`` (and the push-mode hook wrapped around it, when
installed) drives the SGLang stand-in over HTTP. Used by the e2e harness and the push-mode tests.

Stand-ins, at the interface slime's updater calls:

- ``EngineActorStandIn``: slime's ``SGLangEngine`` Ray actor (``slime/backends/sglang_utils/
  sglang_engine.py``; it imports SGLang, so it cannot load here) as the updater sees it: each
  method's ``.remote(...)`` returns a future, and makes the HTTP call the actor makes:
  ``pause_generation`` posts ``{}``, ``flush_cache`` GETs ``/flush_cache`` until it answers 200
  (slime: 60 tries a second apart, then TimeoutError), ``_make_request(endpoint, payload)`` posts
  and raises on an HTTP error, ``update_weights_from_distributed`` posts the bucket's metadata with
  ``flush_cache`` false, ``continue_generation`` posts ``{}``;
- ``RayStandIn``: ``ray.get`` / ``ray.put`` over those futures, set as the ``ray`` of slime's
  updater module (``use_ray_stand_in``);
- ``CpuDistributedUpdater``: slime's class with the two parts that need Megatron replaced:
  ``connect_rollout_engines`` (a gloo group with the stand-ins) and ``_send_weights`` (the tiny
  model's parameters in buckets, metadata through the engine actor, tensors by broadcast).
"""

from __future__ import annotations

import concurrent.futures
import socket
import time
from datetime import timedelta

import torch

GROUP_NAME = "epic_e2e_update"


class OneRankDist:
    """``torch.distributed`` as slime's updater uses it on rank 0 of a one-rank train group."""

    @staticmethod
    def get_rank():
        return 0

    @staticmethod
    def barrier(group=None):
        return None


def _session():
    import requests

    s = requests.Session()
    s.trust_env = False
    return s


class _Method:
    def __init__(self, pool, fn):
        self.pool, self.fn = pool, fn

    def remote(self, *args, **kwargs):
        return self.pool.submit(self.fn, *args, **kwargs)


class EngineActorStandIn:
    """One SGLang engine actor (node rank 0) at ``url``; calls are counted in ``calls``."""

    METHODS = (
        "pause_generation",
        "flush_cache",
        "_make_request",
        "update_weights_from_distributed",
        "continue_generation",
        "init_weights_update_group",
        "destroy_weights_update_group",
        "update_weights_from_disk",
    )

    def __init__(self, url: str, flush_tries: int = 60, flush_retry_s: float = 0.2):
        self.url, self.flush_tries, self.flush_retry_s = url, flush_tries, flush_retry_s
        self.calls: list[str] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="engine-actor")
        for name in self.METHODS:
            setattr(
                self, name, _Method(self._pool, getattr(self, f"_do{name}" if name.startswith("_") else f"_do_{name}"))
            )

    def _post(self, endpoint: str, payload: dict) -> dict:
        reply = _session().post(f"{self.url}/{endpoint}", json=payload, timeout=300)
        reply.raise_for_status()
        return reply.json()

    def _do_make_request(self, endpoint: str, payload: dict | None = None) -> dict:
        self.calls.append(f"{endpoint} {payload or {}}")
        return self._post(endpoint, payload or {})

    def _do_pause_generation(self):
        self.calls.append("pause_generation {}")
        return self._post("pause_generation", {})

    def _do_continue_generation(self):
        self.calls.append("continue_generation {}")
        return self._post("continue_generation", {})

    def _do_flush_cache(self):
        self.calls.append("flush_cache")
        for _ in range(self.flush_tries):
            if _session().get(f"{self.url}/flush_cache", timeout=60).status_code == 200:
                return None
            time.sleep(self.flush_retry_s)
        raise TimeoutError("Timeout while flushing cache.")

    def _do_update_weights_from_distributed(
        self, names, dtypes, shapes, group_name, flush_cache=False, weight_version=None, load_format=None
    ):
        payload = {
            "names": names,
            "dtypes": [str(d).replace("torch.", "") for d in dtypes],
            "shapes": [list(s) for s in shapes],
            "group_name": group_name,
            "flush_cache": flush_cache,
        }
        if weight_version is not None:
            payload["weight_version"] = weight_version
        self.calls.append("update_weights_from_distributed")
        answer = self._post("update_weights_from_distributed", payload)
        if not answer.get("success"):
            raise RuntimeError(f"update_weights_from_distributed failed: {answer}")
        return answer

    def _do_update_weights_from_disk(self, model_path, load_format=None, weight_version=None):
        """slime's: the path, the format and version when given, no ``flush_cache`` (SGLang's default: true)."""
        payload = {"model_path": model_path}
        if load_format is not None:
            payload["load_format"] = load_format
        if weight_version is not None:
            payload["weight_version"] = weight_version
        return self._do_make_request("update_weights_from_disk", payload)

    def _do_init_weights_update_group(self, **payload):
        self.calls.append("init_weights_update_group")
        return self._post("init_weights_update_group", payload)

    def _do_destroy_weights_update_group(self, group_name):
        """slime's: an HTTP error (no such group: 400) is swallowed, the answer is then None."""
        import requests

        try:
            return self._post("destroy_weights_update_group", {"group_name": group_name})
        except requests.RequestException:
            return None


class RayStandIn:
    """What slime's updater module uses of ``ray``: ``get`` (a future or a list of them), ``put``."""

    @staticmethod
    def get(refs, timeout=None):
        if isinstance(refs, list):
            return [RayStandIn.get(r, timeout) for r in refs]
        return refs.result(timeout) if isinstance(refs, concurrent.futures.Future) else refs

    @staticmethod
    def put(value):
        done = concurrent.futures.Future()
        done.set_result(value)
        return done


def updater_module():
    from slime.backends.megatron_utils.update_weight import update_weight_from_distributed

    return update_weight_from_distributed


def use_ray_stand_in() -> None:
    """Point slime's updater module at ``RayStandIn`` (this process has no Ray cluster)."""
    updater_module().ray = RayStandIn


def make_updater(args, model: torch.nn.Module, engines: list, buckets: int = 3, after_tensor=None):
    """A ``CpuDistributedUpdater`` over ``engines`` for ``model`` (slime's class, imported here). It pushes
    the checkpoint's names and layout (``hf_export.checkpoint_tensors``: per-expert weights,
    ``lm_head.weight`` untied), as the real SGLang server and the stand-in map them. ``after_tensor``
    (optional): called as ``after_tensor(bucket, index, of)`` after each tensor's broadcast (a fault
    test kills the driver there, between two tensors of a bucket)."""
    base = updater_module().UpdateWeightFromDistributed

    class CpuDistributedUpdater(base):
        def connect_rollout_engines(self, rollout_engines, rollout_engine_lock, **kwargs):
            """slime's connect, one GPU per engine: the trainer is rank 0, engine i rank i + 1, over gloo."""
            self.rollout_engines, self.rollout_engine_lock = rollout_engines, rollout_engine_lock
            self._is_pp_src_rank, self._group_name = True, GROUP_NAME
            world = len(rollout_engines) + 1
            # the project's reset before slime's connect (epic_slime.slime.stream.push_recovery): a driver killed
            # mid-push left its group on the engines, and a group of the same name cannot be made again
            from epic_slime.slime.stream.push_recovery import clear_stale_update_group

            self.stale_group_answers = clear_stale_update_group(rollout_engines, GROUP_NAME, RayStandIn.get)
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            joined = [
                e.init_weights_update_group.remote(
                    master_address="127.0.0.1",
                    master_port=port,
                    rank_offset=i + 1,
                    world_size=world,
                    group_name=GROUP_NAME,
                    backend="gloo",
                )
                for i, e in enumerate(rollout_engines)
            ]
            # slime's own group set-up (slime.utils.distributed_utils), whose store keys match the engine side as
            # SGLang builds it: a bare ProcessGroupGloo never connects to a real server (or to the stand-in)
            import torch.distributed.distributed_c10d as c10d
            from slime.utils.distributed_utils import init_process_group

            for group, name in list(c10d._world.pg_names.items()):  # an earlier updater's group in this process:
                if name == GROUP_NAME:  # torch refuses to register the name twice
                    c10d.destroy_process_group(group)
            self._model_update_groups = init_process_group(
                backend="gloo",
                init_method=f"tcp://127.0.0.1:{port}",
                world_size=world,
                rank=0,
                group_name=GROUP_NAME,
                timeout=timedelta(seconds=120),
            )
            RayStandIn.get(joined)

        def _send_weights(self, pbar) -> None:
            """Every parameter in ``buckets`` buckets: metadata through each engine actor (while it
            waits for the tensors), the tensors by broadcast from rank 0."""
            import torch.distributed as dist

            from epic_slime.runtime.hf_export import checkpoint_tensors

            # the checkpoint's names, experts one by one and the output head (as slime's converter sends
            # them): SGLang skips transformers 5's fused in-memory expert names and keeps its own head
            named = list(checkpoint_tensors(self.model[0]).items())
            size = -(-len(named) // buckets)
            for bucket, chunk in enumerate(named[i : i + size] for i in range(0, len(named), size)):
                refs = [
                    e.update_weights_from_distributed.remote(
                        names=[n for n, _ in chunk],
                        dtypes=[p.dtype for _, p in chunk],
                        shapes=[p.shape for _, p in chunk],
                        group_name=self._group_name,
                        weight_version=str(self.weight_version),
                    )
                    for e in self.rollout_engines
                ]
                for index, (_, param) in enumerate(chunk):
                    opts = dist.BroadcastOptions()
                    opts.rootRank, opts.rootTensor = 0, 0
                    self._model_update_groups.broadcast([param.detach().contiguous()], opts).wait()
                    if after_tensor is not None:
                        after_tensor(bucket, index, len(chunk))
                RayStandIn.get(refs)

    updater = CpuDistributedUpdater(
        args, [model], weights_getter=lambda: {}, model_name="qwen3_moe", quantization_config=None
    )
    updater.connect_rollout_engines(engines, None)  # the lock guards slime's per-bucket path, replaced here
    return updater
