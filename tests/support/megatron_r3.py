"""R3 on real Megatron: routes recorded from the HF model's router go through the project's R3 store
(epic_slime.slime.routing: uint8 staging, per-rank row fetch around slime's
`prepare_routed_experts_for_routing_replay`) into slime's `RoutingReplay`, and Megatron's router
replays them inside slime's forward_only / train_one_step.

The bridge: megatron-core 0.16.1's router hands its top-k to `router_replay.get_replay_topk`; slime's
Docker image patches Megatron's router to route top-k through slime's
`get_routing_replay_compute_topk` and `register_routing_replay`. The bridge calls those two, slime's
own code, at that interface, and keeps the indices each call returned (what the router used).

The replayed routes differ from the natural ones on every third token (the two experts HF's router
scored lowest), so the check has teeth: Megatron's log-probs must equal HF's with the same routes
forced, and differ from HF's natural ones.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

USED_ROUTES: list[torch.Tensor] = []  # every router call's top-k indices, in call order


class SlimeReplayBridge:
    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
        from slime.utils.routing_replay import get_routing_replay_compute_topk

        def natural(s, k, num_groups=None, group_topk=None):
            return default_compute_topk(s, k, num_groups, group_topk)

        probs, top_indices = get_routing_replay_compute_topk(natural)(scores, topk, num_groups, group_topk)
        USED_ROUTES.append(top_indices.detach().clone())
        return probs, top_indices


def install_slime_routing_replay(gpt) -> None:
    from slime.utils.routing_replay import register_routing_replay

    os.environ["ENABLE_ROUTING_REPLAY"] = "1"
    for layer in gpt.decoder.layers:
        register_routing_replay(layer.mlp.router)  # one slime RoutingReplay per MoE layer, in order
        layer.mlp.router.router_replay = SlimeReplayBridge()


@torch.no_grad()
def hf_routes(hf, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-k expert ids [len - 1, layers, k] as SGLang reports them, router logits [len, layers, E])."""
    ids, logits = [], []

    def keep(module, inputs, out):  # returns None: the router's output is left as it is
        logits.append(out[0])
        ids.append(out[2])

    hooks = [layer.mlp.gate.register_forward_hook(keep) for layer in hf.model.layers]
    try:
        hf(input_ids=tokens[None], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(ids, 1)[:-1].to(torch.int32), torch.stack(logits, 1)


@contextmanager
def forced_hf_routes(hf, routes: torch.Tensor):
    """HF's router picks `routes` ([len, layers, k]) instead of its own top-k; the weights are its
    softmax renormalised over those experts (what Megatron computes from the replayed ids)."""
    originals = []
    for layer_id, layer in enumerate(hf.model.layers):
        gate = layer.mlp.gate
        originals.append(gate.forward)

        def forward(hidden, gate=gate, layer_id=layer_id):
            logits = torch.nn.functional.linear(hidden.reshape(-1, gate.weight.shape[1]), gate.weight)
            idx = routes[:, layer_id].long()
            weights = torch.softmax(logits, -1).gather(1, idx)
            return logits, weights / weights.sum(-1, keepdim=True), idx

        gate.forward = forward
    try:
        yield
    finally:
        for layer, original in zip(hf.model.layers, originals):
            layer.mlp.gate.forward = original


def _altered(routes: torch.Tensor, logits: torch.Tensor, topk: int) -> torch.Tensor:
    out = routes.clone()
    worst = logits[:-1].argsort(-1)[..., :topk].to(out.dtype)  # the experts the router scored lowest
    out[::3] = worst[::3]
    return out


def run_r3(hf, layout, build_model, _optimizer) -> dict:
    from megatron.core import mpu
    from megatron.training.global_vars import set_args
    from slime.backends.megatron_utils import cp_utils
    from slime.backends.megatron_utils import model as slime_model
    from slime.backends.megatron_utils.data import DataIterator
    from slime.backends.megatron_utils.loss import get_log_probs_and_entropy
    from slime.utils.routing_replay import RoutingReplay
    from slime.utils.types import Sample

    import megatron.training.global_vars as global_vars
    from epic_slime.runtime.model import response_log_probs
    from epic_slime.slime.routing import RoutingStore, local_routing, stage_for_training
    from support.megatron_data import TEMPERATURE, make_args, rollout_data

    cfg, gpt, ddp = build_model(hf, r3=True)
    data, natural_lp = rollout_data(hf, layout)
    routes = []
    for tokens in data["tokens"]:
        natural, logits = hf_routes(hf, tokens)
        routes.append(_altered(natural, logits, cfg.top_k))
    forced_lp = []
    for tokens, r, (p, n) in zip(data["tokens"], routes, layout):
        full = torch.cat([r, r[-1:]])  # the last token's route changes no response log-prob
        with forced_hf_routes(hf, full), torch.no_grad():
            lp, _ = response_log_probs(hf, [tokens[:p].tolist()], [tokens[p:].tolist()], TEMPERATURE, pad_id=0)
        forced_lp.append(lp[0])

    args = make_args("epic", "--use-rollout-routing-replay")
    args.use_rollout_routing_replay, args.moe_router_topk = True, cfg.top_k
    global_vars._GLOBAL_ARGS = None
    set_args(args)
    # the project's store: each sample's routing checked and held as uint8, a handle left in the sample
    samples = [
        Sample(tokens=t.tolist(), rollout_routed_experts=r.clone(), index=i)
        for i, (t, r) in enumerate(zip(data["tokens"], routes))
    ]
    store = RoutingStore()
    stage_for_training(args, [samples], rollout_id=0, store=store)
    handles = [s.rollout_routed_experts for s in samples]
    prepare_kwargs = dict(
        data_pad_size_multiplier=args.data_pad_size_multiplier,
        sequence_parallel=args.sequence_parallel,
        allgather_cp=False,
    )
    # this rank's rows via the store (epic_slime.slime.routing.local_routing, as its train hook does)
    # and via slime's own function on the int32 routes: the same layout, padding included
    via_store = local_routing(
        cp_utils.prepare_routed_experts_for_routing_replay,
        cp_utils._pad_routed_experts,
        handles,
        data["tokens"],
        store.rows,
        num_experts=cfg.num_experts,
        **prepare_kwargs,
    )
    via_slime = cp_utils.prepare_routed_experts_for_routing_replay(
        routes, data["tokens"], num_experts=cfg.num_experts, **prepare_kwargs
    )
    # slime's RoutingReplay gets each MoE layer's rows (one micro-batch)
    for layer_id, replay in enumerate(RoutingReplay.all_routing_replays):
        replay.record(via_store[:, layer_id])
    iterator = [DataIterator(data, [list(range(len(data["tokens"])))])]
    os.environ["ROUTING_REPLAY_STAGE"] = "replay_forward"
    USED_ROUTES.clear()
    forward = slime_model.forward_only(get_log_probs_and_entropy, args, [ddp], iterator, [1])
    used_forward = [bool(torch.equal(u, via_store[:, i].long())) for i, u in enumerate(USED_ROUTES)]
    consumed = [r.forward_index for r in RoutingReplay.all_routing_replays]
    RoutingReplay.clear_all_forward()
    USED_ROUTES.clear()
    opt, sched = _optimizer(ddp)
    iterator[0].reset()
    reduced, grad_norm = slime_model.train_one_step(args, 0, 0, iterator, [ddp], opt, sched, 1, len(data["tokens"]))
    used_train = [bool(torch.equal(u, via_store[:, i].long())) for i, u in enumerate(USED_ROUTES)]
    return {
        "tp_rank": mpu.get_tensor_model_parallel_rank(),
        "store_dtypes": sorted({str(a.dtype) for a in store.arrays.values()}),
        "handles": all(h.dtype == torch.int64 and h.shape[0] == 1 for h in handles),
        "local_rows": int(via_store.shape[0]),
        "store_equals_slime": bool(torch.equal(via_store.long(), via_slime.long())),
        "store_dtype_local": str(via_store.dtype),
        "used_forward": used_forward,
        "used_train": used_train,
        "consumed_forward": consumed,
        "megatron_log_probs": [lp.tolist() for lp in forward["log_probs"]],
        "hf_forced_log_probs": [lp.tolist() for lp in forced_lp],
        "hf_natural_log_probs": [lp.tolist() for lp in natural_lp],
        "altered_rows": int(
            sum((r != n).any(-1).any(-1).sum() for r, n in zip(routes, [hf_routes(hf, t)[0] for t in data["tokens"]]))
        ),
        "loss": float(reduced.get("loss", float("nan"))),
        "grad_norm": float(grad_norm),
    }
