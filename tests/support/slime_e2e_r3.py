"""R3 (``--use-rollout-routing-replay``) in the e2e harness: SGLang's routed experts from the
stand-in (``sglang_standin_routing.py``), slime's decoding into ``Sample.rollout_routed_experts``,
the project's staging into its ``RoutingStore`` (a named actor on a local Ray instance, as on a
cluster), slime's conversion and per-DP split carrying the handles, and on each train rank the
project's hook around slime's ``prepare_routed_experts_for_routing_replay`` fetching that rank's
rows, as slime's ``fill_routing_replay`` calls it per micro-batch.

slime's actor module (``slime/backends/megatron_utils/actor.py``) imports CUDA-only packages, so a
module holding what the hook rebinds (the name it imports from ``cp_utils``) stands in for it.
The tiny HF model cannot replay routing in its forward: the harness compares the replayed rows with
the routing the trainer's model computes itself, at the first training step, whose weights are the
ones the rollout was generated with.
"""

from __future__ import annotations

import sys
import types

import torch


def start(args) -> None:
    """A local Ray instance (the store actor) and slime's ``--custom-megatron-init-path`` as each
    train rank runs it (the driver sets the project's hook)."""
    import ray
    from slime.backends.megatron_utils import cp_utils
    from slime.utils.misc import load_function

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    actor = types.ModuleType("slime.backends.megatron_utils.actor")
    actor.prepare_routed_experts_for_routing_replay = cp_utils.prepare_routed_experts_for_routing_replay
    actor.__epic_placeholder__ = True
    sys.modules["slime.backends.megatron_utils.actor"] = actor
    if not args.custom_megatron_init_path:
        raise ValueError("R3 e2e: the driver should have set --custom-megatron-init-path (the project's train hook)")
    load_function(args.custom_megatron_init_path)(args)
    if actor.prepare_routed_experts_for_routing_replay is cp_utils.prepare_routed_experts_for_routing_replay:
        raise RuntimeError(f"{args.custom_megatron_init_path} did not install the R3 hook")


def stop() -> None:
    import ray

    ray.shutdown()


def _replay_kwargs(args) -> dict:
    return dict(
        num_experts=args.num_experts,
        data_pad_size_multiplier=args.data_pad_size_multiplier,
        sequence_parallel=args.sequence_parallel,
        allgather_cp=args.allgather_cp,
    )


def bytes_served() -> int:
    import ray

    from epic_slime.slime import routing

    return ray.get(routing._ray_store().stats.remote())["bytes_served"]


def replay(args, data, rows) -> torch.Tensor:
    """One micro-batch's routing as slime's actor prepares it (through the installed hook)."""
    actor = sys.modules["slime.backends.megatron_utils.actor"]
    return actor.prepare_routed_experts_for_routing_replay(
        [data["rollout_routed_experts"][i] for i in rows], [data["tokens"][i] for i in rows], **_replay_kwargs(args)
    )


@torch.no_grad()
def own_routing(args, model, data, rows) -> torch.Tensor:
    """The same micro-batch laid out by slime from the trainer model's own routing of each sample."""
    from slime.backends.megatron_utils import cp_utils

    topk = model.config.num_experts_per_tok
    per_sample = []
    for i in rows:
        ids = torch.as_tensor(data["tokens"][i])[:-1][None]
        logits = model(input_ids=ids, use_cache=False, output_router_logits=True).router_logits
        per_sample.append(torch.stack([lg.topk(topk, dim=-1).indices for lg in logits], dim=1).to(torch.int32))
    return cp_utils.prepare_routed_experts_for_routing_replay(
        per_sample, [data["tokens"][i] for i in rows], **_replay_kwargs(args)
    )


def agreement(replayed: torch.Tensor, own: torch.Tensor) -> float:
    """The fraction of (row, layer) whose expert sets agree (top-k order aside)."""
    if replayed.shape != own.shape:
        raise ValueError(f"replayed routing {tuple(replayed.shape)} vs own {tuple(own.shape)}")
    a = replayed.to(torch.int64).sort(-1).values
    b = own.to(torch.int64).sort(-1).values
    return float((a == b).all(-1).float().mean())
