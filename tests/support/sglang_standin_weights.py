"""The SGLang stand-in's weight loads (``sglang_standin_engine.Engine`` mixes this in), as SGLang
0.5.15.post1 answers them (checked against the real server by tests/slime_adapter/
test_sglang_conformance*.py):

- ``/update_weights_from_disk``: ``model_path`` is a Hugging Face folder (``*.safetensors``, the
  real server's format; bf16 files are cast to the stand-in's float32). A torch state-dict file
  is also taken, a stand-in extension the real server refuses (the e2e harness's stress push). A
  path that is neither answers 400 with the reason, as the real server does;
- ``/update_weights_from_distributed``: one bucket by broadcast over the gloo group joined at
  ``/init_weights_update_group``. A ``group_name`` never joined is an assertion in SGLang's
  scheduler (``ModelRunner.update_weights_from_distributed``) and the real server dies: so does
  the stand-in;
- ``/update_weights_from_tensor``: ``serialized_named_tensors`` (one base64 string per TP rank)
  of a ``ForkingPickler`` pickle of ``[(name, tensor), ...]``. Names the model does not have are
  skipped and the answer is still ``success: true`` (the real server's model ``load_weights``
  skips them); a payload whose tensors cannot be rebuilt (torch's default ``file_descriptor``
  sharing from another process: ``AuthenticationError``) kills the real server's scheduler, and the
  stand-in exits likewise.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re

import torch


# a per-expert weight of the checkpoint (the names SGLang's Qwen3-MoE loads); transformers 5 holds
# them fused in memory (experts.gate_up_proj [E, 2I, H] = gate over up, experts.down_proj [E, H, I])
EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
FUSED = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


class ServerDies(Exception):
    """SGLang's scheduler raised: the HTTP server answers 500 and the process exits."""


def read_hf_folder(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"model_path {path!r}: no *.safetensors file in the folder")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(os.path.join(path, name)))
    return state


class WeightLoads:
    """The weight-update endpoints' engine side; needs ``model``, ``pool``, ``groups``, ``stats``,
    ``running``, ``weights`` and ``batch_logits``.

    A request that is running when weights load (paused in place) keeps the KV its positions so far
    were computed with, as SGLang does: the loaded weights decode on over it. The stand-in keeps a
    copy of the weights each such segment was computed by and recomputes the request through them
    (``last_logits``); every other request is one batched forward of its whole sequence. A prefix-cache
    hit on KV that older weights computed (a push without a flush) is read the same way, as the
    oldest weights along the prefix computed all of it. (Routed experts of such requests are not
    recorded.)"""

    def keep_running_kv(self) -> None:
        """Before a load: the running requests' computed positions, and the cached prefixes, stay on
        the current weights (a copy of them is kept while either may still be read)."""
        import copy

        if not self.running and not self.cache.trees:
            return
        snapshots = self.__dict__.setdefault("snapshots", {})
        snapshots.setdefault(self.weights, copy.deepcopy(self.model))
        for r in self.running:
            r.kv_segments.append((self.weights, len(r.input_ids) + len(r.tokens) - 1))

    def last_logits(self, batch) -> torch.Tensor:
        plain = [r for r in batch if not r.kv_segments]
        rows = dict(zip(map(id, plain), self.batch_logits(plain))) if plain else {}
        for r in batch:
            if r.kv_segments:
                rows[id(r)] = self._spliced_logits(r)
        return torch.stack([rows[id(r)] for r in batch])

    def _spliced_logits(self, req) -> torch.Tensor:
        seq = torch.tensor([req.input_ids + req.tokens])
        cache, start = None, 0
        for weights, upto in req.kv_segments:
            if upto > start:
                cache = self.snapshots[weights](
                    input_ids=seq[:, start:upto], past_key_values=cache, use_cache=True
                ).past_key_values
                start = upto
        return self.model(input_ids=seq[:, start:], past_key_values=cache, use_cache=True).logits[0, -1].float()

    def _target(self, params: dict, name: str):
        """The parameter (or expert slice) a checkpoint name loads into; None for a name SGLang's
        Qwen3-MoE cannot map (it skips those, fused in-memory expert names among them)."""
        m = EXPERT.match(name)
        if m:
            prefix, e, part = m.group(1), int(m.group(2)), m.group(3)
            if part == "down_proj":
                return params[prefix + ".down_proj"][e]
            fused = params[prefix + ".gate_up_proj"][e]
            half = fused.shape[0] // 2
            return fused[:half] if part == "gate_proj" else fused[half:]
        if name.endswith(FUSED):
            return None
        return params.get(name)

    def _copy_named(self, named) -> int:
        """Copy checkpoint-named tensors into the model, cast to its dtype; returns how many loaded."""
        params = dict(self.model.named_parameters())
        loaded = 0
        with torch.no_grad():
            for name, tensor in named:
                target = self._target(params, name)
                if target is not None:
                    target.copy_(tensor.to(target.dtype))
                    loaded += 1
        return loaded

    async def load_weights(self, payload: dict) -> None:
        path = str(payload.get("model_path", ""))
        if os.path.isdir(path):
            state = read_hf_folder(path)
            load = lambda: self._copy_named(state.items())  # noqa: E731
        elif os.path.isfile(path):
            state = torch.load(path, weights_only=True)
            load = lambda: self.model.load_state_dict(state)  # noqa: E731
        else:
            raise ValueError(f"model_path {path!r}: no such folder or file")
        await asyncio.get_running_loop().run_in_executor(self.pool, load)
        self.stats["weight_loads"] += 1

    async def load_tensors(self, payload: dict) -> None:
        import pickle

        import torch.multiprocessing  # noqa: F401 - registers the reductions that rebuild shared tensors

        blobs = payload.get("serialized_named_tensors") or []
        if not blobs:
            raise ValueError("serialized_named_tensors is empty")
        try:
            named = pickle.loads(base64.b64decode(blobs[0]))
        except Exception as exc:  # noqa: BLE001 - SGLang's scheduler dies on it
            raise ServerDies(f"could not rebuild the tensors: {type(exc).__name__}: {exc}") from exc
        loaded = await asyncio.get_running_loop().run_in_executor(self.pool, self._copy_named, named)
        self.stats["tensor_loads"] += 1
        self.stats["tensors_skipped"] += len(named) - loaded

    async def join_update_group(self, payload: dict) -> None:
        """slime's ``connect_rollout_engines_from_distributed``, the engine side: rank
        ``rank_offset`` of a gloo group whose rank 0 is the trainer (NCCL on a cluster)."""

        def join():  # as SGLang's init_custom_process_group: a trainer group built otherwise never connects
            from sglang_group import sglang_process_group  # this folder is sys.path[0]

            return sglang_process_group(
                payload["master_address"],
                int(payload["master_port"]),
                int(payload["rank_offset"]),
                int(payload["world_size"]),
                payload["group_name"],
            )

        if payload.get("backend") not in (None, "gloo", "nccl"):
            raise ValueError(f"backend {payload.get('backend')!r}: the stand-in joins with gloo")
        self.groups[payload["group_name"]] = await asyncio.get_running_loop().run_in_executor(None, join)
        self.stats["update_groups"] += 1

    async def receive_bucket(self, payload: dict) -> None:
        """One bucket of ``update_weights_from_distributed``: tensors by broadcast from rank 0, in
        the order of ``names``, loaded into the model."""
        import torch.distributed as dist

        group_name = payload.get("group_name", "weight_update_group")
        group = self.groups.get(group_name)
        if group is None:
            raise ServerDies(
                f"Group {group_name} not in {sorted(self.groups)}. Please call `init_weights_update_group` first."
            )
        params = dict(self.model.named_parameters())

        def receive():
            for name, dtype, shape in zip(payload["names"], payload["dtypes"], payload["shapes"], strict=True):
                tensor = torch.empty(shape, dtype=getattr(torch, dtype))
                opts = dist.BroadcastOptions()
                opts.rootRank, opts.rootTensor = 0, 0
                group.broadcast([tensor], opts).wait()
                target = self._target(params, name)
                if target is None:  # SGLang's load_weights skips it, and the answer is still success
                    self.stats["tensors_skipped"] += 1
                    continue
                with torch.no_grad():
                    target.copy_(tensor.to(target.dtype))

        await asyncio.get_running_loop().run_in_executor(self.pool, receive)
        self.stats["weight_buckets"] += 1
