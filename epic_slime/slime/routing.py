"""R3 (``--use-rollout-routing-replay``) within host memory, through slime's plugin points.

slime 624b824a decodes SGLang's routed experts as int32 (``[len(tokens) - 1, layers, topk]`` per
sample), puts each DP partition's whole list in one Ray object and every rank of that DP group
(all TP / CP / PP ranks) deserialises all of it, though after CP and sequence-parallel slicing a
rank replays only its own rows (upstream THUDM/slime#2384). It also asks SGLang for routing on
evaluation requests, which nothing reads. This module fixes both in the project's own code:

- ``eval_args``: the arguments for slime's eval call, without routing requests;
- ``remember_partial_routing`` / ``finish_group_routing``: a group SGLang aborted (weight push) is
  resubmitted as prompt + partial response; SGLang then returns routing for the whole sequence
  recomputed on the new weights and slime replaces the recorded rows. These keep the rows recorded
  before the push, and hold finished routing as uint8 when the model has <= 256 experts;
- ``stage_for_training`` (rollout function, RolloutManager process): moves every training sample's
  routing into a ``RoutingStore`` actor and leaves a small handle in ``Sample.rollout_routed_experts``;
- ``install_train_hook`` (``--custom-megatron-init-path``, every train rank): wraps slime's
  ``prepare_routed_experts_for_routing_replay`` so a rank fetches only the rows its CP / TP slice
  replays. slime's own function computes which rows those are (run on row ids), so the layout,
  padding included, is slime's by construction. slime's ``RoutingReplay`` keeps the uint8 rows
  pinned and casts them to int32 on the device (``pop_forward`` / ``pop_backward``).

slime is imported lazily: this module is imported by the driver, the RolloutManager and the
train actors.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

STORE_NAME = "epic_slime_r3_routing"
HOOK_PATH = "epic_slime.slime.routing.install_train_hook"
# Handles are int64 with values >= HANDLE_BASE; real routing holds expert ids < num_experts.
HANDLE_BASE = 1 << 40
# The driver asks for rollout r + 1 while r trains and for r + 2 only after r trained:
# a store holding the two latest rollouts never drops rows a rank may still fetch.
KEEP_ROLLOUTS = 2
_PREFIX_ATTR = "_epic_r3_routing_before_push"


def _r3_on(args) -> bool:
    return bool(getattr(args, "use_rollout_routing_replay", False))


def _shape(args) -> tuple[int, int, int]:
    """(layers, topk, experts) of the routing slime expects, from slime's model flags."""
    out = []
    for name in ("num_layers", "moe_router_topk", "num_experts"):
        value = getattr(args, name, None)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"R3 routing needs args.{name} as a positive int (the model's MoE shape), got {value!r}")
        out.append(value)
    return tuple(out)


def routing_dtype(num_experts: int) -> torch.dtype:
    """The dtype routing is held in: uint8 for <= 256 experts (a quarter of slime's int32)."""
    if num_experts <= 0:
        raise ValueError(f"num_experts must be positive, got {num_experts}")
    return torch.uint8 if num_experts <= 256 else torch.int32


def compact_routing(args, routing, num_tokens: int) -> torch.Tensor:
    """A sample's routing checked against its shape (``[num_tokens - 1, layers, topk]``, ids in
    ``[0, num_experts)``) and held in ``routing_dtype``."""
    layers, topk, experts = _shape(args)
    tensor = torch.as_tensor(routing)
    expected = (num_tokens - 1, layers, topk)
    if tuple(tensor.shape) != expected:
        raise ValueError(
            f"Sample.rollout_routed_experts has shape {tuple(tensor.shape)}, expected {expected} "
            f"(len(tokens) - 1, num_layers, moe_router_topk)"
        )
    if tensor.numel():
        low, high = (int(v) for v in torch.aminmax(tensor))  # one pass over the ~3.5M ids of a 9K-token sample
        if low < 0 or high >= experts:
            raise ValueError(
                f"Sample.rollout_routed_experts holds expert ids in [{low}, {high}], outside [0, num_experts={experts})"
            )
    return tensor.to(routing_dtype(experts)).contiguous()


def eval_args(args):
    """``args`` for slime's eval rollout: the same, except that SGLang is not asked for routing.

    A copy, not a toggle: training groups generate on the same event loop during evaluation and
    read ``args.use_rollout_routing_replay`` when they build their requests."""
    if not _r3_on(args):
        return args
    out = copy.copy(args)
    out.use_rollout_routing_replay = False
    return out


def _merge(before, after) -> torch.Tensor | None:
    """Rows recorded before the push, then the continued request's rows past them."""
    if before is None:
        return after
    if after is None:
        return before
    after = torch.as_tensor(after)
    return torch.cat([before.to(after.dtype), after[before.shape[0] :]], dim=0)


def remember_partial_routing(group) -> None:
    """Before an aborted group is resubmitted: keep each sample's routing recorded so far.

    Those rows are the routing its prompt and its tokens sampled before the push were computed
    with; slime replaces them with the continued request's (new-weight) routing of the whole
    sequence. An earlier abort's kept rows stay in front."""
    for sample in group:
        kept = _merge(getattr(sample, _PREFIX_ATTR, None), sample.rollout_routed_experts)
        setattr(sample, _PREFIX_ATTR, None if kept is None else torch.as_tensor(kept).clone())


def finish_group_routing(args, group) -> None:
    """A finished group: put back the rows kept over resubmissions and hold its routing compact."""
    for sample in group:
        routing = _merge(getattr(sample, _PREFIX_ATTR, None), sample.rollout_routed_experts)
        if hasattr(sample, _PREFIX_ATTR):
            delattr(sample, _PREFIX_ATTR)
        if _r3_on(args) and routing is not None:
            routing = compact_routing(args, with_trailing_tool_rows(args, sample, routing), len(sample.tokens))
        sample.rollout_routed_experts = routing


def with_trailing_tool_rows(args, sample, routing):
    """Routing rows for tool tokens no engine call ever read (a multi-turn trajectory that ends
    with a tool's output: slime's ``append_response_tokens(..., trainable=False)`` records none).

    Row p routes the trainer's forward at token p, which reaches only the logits at p and after;
    the logit at p scores token p + 1. When every token from the first missing row's successor on
    has loss mask 0, no trained log-prob depends on those rows, so any valid route replays the
    same loss: experts 0..topk-1. Otherwise the rows are missing for real: left for
    ``compact_routing`` to refuse, naming the shape."""
    routing = torch.as_tensor(routing)
    missing = len(sample.tokens) - 1 - routing.shape[0]
    if missing <= 0 or routing.dim() != 3:
        return routing
    prompt = len(sample.tokens) - sample.response_length
    first_scored = routing.shape[0] + 1 - prompt  # response index of the first token scored past the rows
    mask = sample.loss_mask if sample.loss_mask is not None else [1] * sample.response_length
    if first_scored < 0 or any(mask[max(first_scored, 0) :]):
        return routing
    _, topk, experts = _shape(args)
    fill = torch.arange(topk, dtype=routing.dtype).expand(missing, routing.shape[1], topk) % experts
    return torch.cat([routing, fill], dim=0)


class RoutingStore:
    """Routing of the latest rollouts by key; serves a rank only the rows it asks for.

    Run as a named Ray actor (``STORE_NAME``) next to the RolloutManager; tests use it in process."""

    def __init__(self, keep_rollouts: int = KEEP_ROLLOUTS):
        self.keep_rollouts = keep_rollouts
        self._keys = itertools.count(HANDLE_BASE)  # assigned here: unique even across manager restarts
        self.rollouts: dict[int, list[int]] = {}
        self.arrays: dict[int, np.ndarray] = {}
        self.bytes_served = 0
        self._lock = threading.Lock()

    def put(self, rollout_id: int, arrays: Sequence[np.ndarray]) -> list[int]:
        """Holds ``arrays`` (one per sample) for ``rollout_id``; returns their keys. Drops the
        rollouts ``keep_rollouts`` or more before it."""
        with self._lock:
            keys = [next(self._keys) for _ in arrays]
            for old in [r for r in self.rollouts if r <= rollout_id - self.keep_rollouts]:
                for key in self.rollouts.pop(old):
                    self.arrays.pop(key, None)
            self.rollouts.setdefault(rollout_id, []).extend(keys)
            self.arrays.update(zip(keys, arrays, strict=True))
        return keys

    def rows(self, requests: Sequence[tuple[int, np.ndarray]]) -> list[np.ndarray]:
        """``[array[key][rows] for key, rows in requests]``."""
        with self._lock:
            missing = [key for key, _ in requests if key not in self.arrays]
            if missing:
                raise KeyError(
                    f"RoutingStore: no routing for keys {missing[:4]} (dropped after "
                    f"{self.keep_rollouts} rollouts, or staged by another RolloutManager)"
                )
            out = [self.arrays[key][rows] for key, rows in requests]
            self.bytes_served += sum(a.nbytes for a in out)
        return out

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "samples": len(self.arrays),
                "bytes_held": sum(a.nbytes for a in self.arrays.values()),
                "bytes_served": self.bytes_served,
            }


_store = None


def _ray_store(create: bool = False):
    """The store actor: created by the RolloutManager's first ``stage_for_training``, looked up
    by name in the train ranks (same Ray job, same namespace)."""
    global _store
    if _store is None:
        import ray

        if create:
            actor = ray.remote(num_cpus=0, max_concurrency=16)(RoutingStore)
            _store = actor.options(name=STORE_NAME, get_if_exists=True).remote()
        else:
            _store = ray.get_actor(STORE_NAME)
    return _store


def stage_for_training(args, groups, rollout_id: int, store: Any = None):
    """Training groups about to be returned to slime: each sample's routing goes to the store, its
    ``rollout_routed_experts`` becomes a ``[1, layers, topk]`` handle (slime's checks and
    per-DP split then carry 3 KB per sample instead of the routing). Returns ``groups``.

    ``store``: a ``RoutingStore`` (tests); default the Ray actor."""
    if not _r3_on(args):
        return groups
    layers, topk, _ = _shape(args)
    samples = [s for group in groups for s in group]
    for sample in samples:
        if sample.rollout_routed_experts is None:
            raise ValueError(
                f"R3 is on but sample {getattr(sample, 'index', None)} has no rollout_routed_experts "
                "(SGLang needs --sglang-enable-return-routed-experts)"
            )
        finish_group_routing(args, [sample])
    arrays = [s.rollout_routed_experts.numpy() for s in samples]
    if store is None:
        import ray

        # waited for: a train rank must not ask before the rows are there
        keys = ray.get(_ray_store(create=True).put.remote(rollout_id, arrays))
    else:
        keys = store.put(rollout_id, arrays)
    for sample, key in zip(samples, keys, strict=True):
        sample.rollout_routed_experts = torch.full((1, layers, topk), key, dtype=torch.int64)
    return groups


def is_handle(value) -> bool:
    return (
        torch.is_tensor(value)
        and value.dtype == torch.int64
        and value.dim() == 3
        and value.shape[0] == 1
        and value.numel() > 0
        and int(value.reshape(-1)[0]) >= HANDLE_BASE
    )


def local_routing(
    original: Callable,
    pad: Callable,
    handles: Sequence[torch.Tensor],
    tokens: Sequence[torch.Tensor],
    fetch: Callable[[list[tuple[int, np.ndarray]]], list[np.ndarray]],
    *,
    num_experts: int,
    **kwargs,
) -> torch.Tensor:
    """This rank's routing for one micro-batch, fetching only its own rows.

    ``original``: slime's ``prepare_routed_experts_for_routing_replay``, which pads, CP-slices,
    concatenates and TP-slices the micro-batch's per-sample routing for the current rank. Run on
    row ids (``[n, 1, 1]``, real rows negative, pad rows numbered from 0 by slime's padding with
    a huge ``num_experts``) it says which sample row, or which padding row, each local row is.
    ``pad``: slime's ``_pad_routed_experts``, which makes the padding rows' values."""
    layers, topk = handles[0].shape[1:]
    lengths = [int(t.shape[0]) - 1 for t in tokens]
    starts = np.cumsum([0, *lengths])
    ids = [-(torch.arange(n, dtype=torch.int64) + int(s) + 1).reshape(n, 1, 1) for n, s in zip(lengths, starts)]
    layout = original(ids, tokens, num_experts=1 << 62, **kwargs).reshape(-1)
    real = layout < 0
    local = torch.nonzero(real).reshape(-1).numpy()  # local rows holding sample rows
    flat = (-layout[real] - 1).numpy()  # ... and which (mb-global) rows
    owner = np.searchsorted(starts, flat, side="right") - 1
    order = np.argsort(owner, kind="stable")  # one request per sample
    requests = [(int(handles[i].reshape(-1)[0]), flat[order][owner[order] == i] - starts[i]) for i in np.unique(owner)]
    parts = fetch(requests)
    dtype = torch.from_numpy(np.asarray(parts[0][:0])).dtype if parts else routing_dtype(num_experts)
    out = torch.empty((layout.numel(), layers, topk), dtype=dtype)
    if parts:
        # one copy; arrays from Ray's object store are read-only views
        out[torch.from_numpy(local[order])] = torch.from_numpy(np.concatenate(parts))
    if not bool(real.all()):
        position = layout[~real]
        # slime pads in the routing's dtype; make the values in int64 (uint8 arange wraps at 256)
        table = pad(torch.empty((0, layers, topk), dtype=torch.int64), int(position.max()) + 1, num_experts)
        out[~real] = table[position].to(dtype)
    return out


def install_train_hook(args) -> None:
    """``--custom-megatron-init-path epic_slime.slime.routing.install_train_hook``: make slime's
    R3 replay fetch only this rank's rows for staged samples (others go to slime unchanged)."""
    import slime.backends.megatron_utils.actor as actor
    from slime.backends.megatron_utils import cp_utils

    original = cp_utils.prepare_routed_experts_for_routing_replay
    if getattr(actor.prepare_routed_experts_for_routing_replay, "_epic_r3", False):
        return

    def fetch(requests):
        import ray

        return ray.get(_ray_store().rows.remote(requests))

    def prepare(rollout_routed_experts, tokens, **kwargs):
        staged = [is_handle(e) for e in rollout_routed_experts]
        if not any(staged):
            return original(rollout_routed_experts, tokens, **kwargs)
        if not all(staged):
            raise ValueError("R3: a micro-batch mixes staged routing handles and routing tensors")
        return local_routing(original, cp_utils._pad_routed_experts, rollout_routed_experts, tokens, fetch, **kwargs)

    prepare._epic_r3 = True
    actor.prepare_routed_experts_for_routing_replay = prepare


def check_r3_setup(args) -> str | None:
    """An error message when R3 runs with the project's rollout function (which stages routing)
    but the train ranks would load another ``--custom-megatron-init-path`` than the hook that
    fetches it; None when consistent (unset: the driver adds the hook, ``command_line.train_hook_flags``;
    the push-mode hook, ``epic_slime.slime.push_mode.install_train_hook``, installs this one too)."""
    from epic_slime.slime.cli.flags import PUSH_TRAIN_HOOK_PATH, ROLLOUT_FUNCTION_PATH

    if not _r3_on(args):
        return None
    if getattr(args, "rollout_function_path", None) != ROLLOUT_FUNCTION_PATH:
        return None
    hook = getattr(args, "custom_megatron_init_path", None)
    if hook not in (None, HOOK_PATH, PUSH_TRAIN_HOOK_PATH):
        return (
            f"--use-rollout-routing-replay with the project's rollout function needs "
            f"--custom-megatron-init-path {HOOK_PATH} (got {hook!r}): the rollout stages routing "
            "out of slime's per-DP data and each train rank fetches only its own rows"
        )
    return None
