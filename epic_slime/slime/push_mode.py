"""Weight push modes (``--weight-push-mode abort | in_place | retract``): what a weight push does to the
requests SGLang is generating, installed around slime's own updater by two hooks (no fork of slime).

What SGLang 0.5.15.post1 does (paths under ``sglang/srt``):

- **abort** (slime's default: ``SGLangEngine.pause_generation`` posts ``{}``, and
  ``PauseGenerationReqInput.mode`` defaults to ``"abort"``): ``managers/tokenizer_manager.py:
  TokenizerManager.pause_generation`` aborts every request (``abort_request(abort_all=True)``)
  until none holds the model-update lock; the scheduler itself is not paused. Running requests
  return their partial output (finish_reason abort) and their KV cache is freed; new requests
  wait in ``TokenizerManager.generate_request`` (``is_pause_cond``) until ``/continue_generation``.
  slime's ``/flush_cache`` then succeeds (the scheduler is idle), the buckets load, generation
  continues; the project's stream resubmits every aborted request as prompt + partial response,
  which SGLang prefills again on the new weights.
- **in_place**: ``managers/scheduler.py:Scheduler.pause_generation`` sets ``_engine_paused`` and
  returns; the running batch, waiting queue and KV cache stay. ``Scheduler.event_loop_normal`` /
  ``event_loop_overlap`` still process control requests while paused (the weight update) but run
  no batch. A separate ``/flush_cache`` now fails: ``Scheduler.flush_cache`` resets the radix
  tree only when ``is_fully_idle`` (no running and no waiting request); otherwise
  ``entrypoints/http_server.py:flush_cache`` answers 400 "Flush cache failed." (slime's
  ``SGLangEngine.flush_cache`` retries 60 times a second, then raises TimeoutError). The update
  must carry ``flush_cache=false``: ``managers/scheduler_components/weight_updater.py:
  SchedulerWeightUpdater.flush_cache_after_weight_update`` asserts that the flush succeeded, which
  would end the scheduler. slime's ``SGLangEngine.update_weights_from_distributed`` and
  ``update_weights_from_tensor`` already send ``flush_cache=False``;
  ``managers/tokenizer_control_mixin.py:update_weights_from_distributed`` runs the update at once
  when paused and sets ``server_args.weight_version``. ``Scheduler.continue_generation``
  (``torch.cuda.empty_cache``, unpause): the running requests decode on with the new weights,
  attending to KV computed under the old ones (as PipelineRL's in-flight updates).
- **retract** (miles' default): ``Scheduler.pause_generation`` merges the last prefill into the
  running batch and ``ScheduleBatch.retract_all`` hands every running request back to the waiting
  queue (``release_req`` frees its KV without inserting it into the radix tree;
  ``Req.reset_for_retract`` keeps ``output_ids`` and the output log-probs, counts
  ``retraction_count``, answered as ``meta_info.num_retractions``). The queue is not empty, so a
  flush fails as under in_place (400; SGLang's docstring says the cache "can be flushed in this mode",
  0.5.15's ``is_fully_idle`` says no): the update must carry ``flush_cache=false``. After
  ``/continue_generation`` each retracted request is prefilled again on the new weights and decodes
  on, but only its output so far is recomputed: its prompt matches the radix tree, whose KV the old
  weights computed (measured on the real server: tests/slime_adapter/test_real_sglang_retract.py).
  Unlike in_place, no token after the push attends to old-weight KV of the output. The stream treats
  a retract-mode sample like an in-place one (versions below): ``num_retractions`` cannot refine it
  (slime's ``Sample`` does not keep it; SGLang also retracts on KV pressure, ``retract_decode``,
  without a push; a request never retracted may still reuse its group's old prompt KV).
- **versions**: ``TokenizerManager._handle_batch_output`` writes ``meta_info.weight_version =
  server_args.weight_version`` when the answer is built, so a request that spans an update
  reports only the new version (the driver must record the version a request started on: in_place
and retract, ``epic_slime.slime.stream.group_stream``).

**The radix cache under in_place and retract.** With no flush, the radix tree (``mem_cache/radix_cache.py``)
keeps prefix KV computed under older weights, and a later request whose prompt shares a prefix
with it (an evaluation prompt asked again every evaluation, the chat template's head of every
training prompt) would reuse it. SGLang 0.5.15 has a per-request knob for this:
``GenerateReqInput.extra_key`` (``managers/io_struct.py``; the SGLang router's ``GenerateRequest``
has the field too, read in its source, not run), and ``RadixCache.match_prefix`` keeps entries with different ``extra_key``
disjoint. The rollout hook gives every group submission (one call of slime's
``generate_and_rm_group``), every evaluation call (``eval_rollout``) and any other ``/generate``
request a fresh key: a request reuses only prompt KV written by the requests submitted together
with it (the n samples of its own group), never KV of an earlier group, so no new group reuses KV
computed under older weights. Cost: no prefix sharing across groups (the shared head of the prompt,
tens of tokens, is prefilled once per group instead of once per cache lifetime); the n samples of a
group still share their prompt; unreferenced old entries are evicted by the radix tree's LRU as
before. Nothing per push. Not chosen: a flush (illegal while requests run); the deferred flush
(``/flush_cache?timeout=``, ``scheduler_components/flush_wrapper.py``: waits for an idle engine,
which continuous admission never leaves); ``--sglang-disable-radix-cache`` (also safe, but every
sample prefills its own prompt: n - 1 extra prompt prefills per group).

**The hooks.**

- ``install_train_hook`` (``--custom-megatron-init-path``, every train rank; the driver adds it and
  chains the R3 train hook when R3 is on): under ``in_place`` or ``retract`` it wraps slime's
  ``UpdateWeightFromDistributed.update_weights`` so that during a push its ``rollout_engines`` are
  ``HoldingEngine`` views: ``pause_generation`` posts ``{"mode": <mode>}`` through the engine
  actor's own POST helper (``SGLangEngine._make_request``: node rank 0 only, raises on an HTTP
  error), ``flush_cache`` does nothing, every weight update is sent with ``flush_cache`` false (a disk
  update with SGLang's default flush, while a request is held in place, kills the server: tested
  against the real one), every other call is the engine's own. slime's order stays:
  version + 1, pause, barrier, buckets (``flush_cache=False``, ``weight_version``), continue.
- ``install_rollout_hook`` (RolloutManager process, called by the project's rollout function):
  under ``in_place`` or ``retract`` it wraps ``sglang_rollout.generate_and_rm_group`` and ``eval_rollout`` (a fresh
  key per call, in a context variable that the call's tasks inherit) and ``post`` (adds the key to
  every ``/generate`` payload; a fresh one when no call set it).

slime is imported lazily: the driver, the RolloutManager and the train actors import this module.
"""

from __future__ import annotations

import contextvars
import functools
import sys
import uuid
from typing import Any

from epic_slime.slime.cli.flags import (
    ABORT,
    DEFAULT_PUSH_MODE,
    HOLDING_PUSH_MODES,
    IN_PLACE,
    PUSH_MODES,
    RETRACT,
    ROLLOUT_FUNCTION_PATH,
)
from epic_slime.slime.cli.flags import PUSH_TRAIN_HOOK_PATH as TRAIN_HOOK_PATH

__all__ = [
    "ABORT",
    "HOLDING_PUSH_MODES",
    "IN_PLACE",
    "PUSH_MODES",
    "RETRACT",
    "TRAIN_HOOK_PATH",
    "check_push_setup",
    "install_rollout_hook",
    "install_train_hook",
]
KEY_PREFIX = "epic-"
_MARK = "_epic_push_mode"

# the prefix-cache key of the group submission (or evaluation call) this task belongs to
_prefix_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("epic_slime_prefix_key", default=None)


def push_mode_of(args: Any) -> str:
    return getattr(args, "weight_push_mode", None) or DEFAULT_PUSH_MODE


# ---------------------------------------------------------------- checks (driver)


def check_push_setup(args: Any) -> str | None:
    """An error message when ``--weight-push-mode`` cannot work with the other flags; None if it can.

    in_place and retract hook slime's ``UpdateWeightFromDistributed`` (the NCCL transport of separate rollout
    GPUs) and nothing else: the colocated updater (``UpdateWeightFromTensor``) and the disk
    transport (paused from the driver's actor group) would keep pausing in abort mode; the
    train ranks must load this module's init hook."""
    mode = getattr(args, "weight_push_mode", None) or DEFAULT_PUSH_MODE
    if mode not in PUSH_MODES:
        return f"--weight-push-mode must be one of {PUSH_MODES}, got {mode!r}"
    if mode not in HOLDING_PUSH_MODES:
        return None
    if getattr(args, "colocate", False):
        return (
            f"--weight-push-mode {mode} needs separate rollout GPUs (slime's distributed updater); "
            "with --colocate nothing generates during a push: use abort"
        )
    transport = getattr(args, "update_weight_transport", "nccl") or "nccl"
    if transport != "nccl":
        return (
            f"--weight-push-mode {mode} hooks slime's NCCL weight transport; --update-weight-transport "
            f"{transport} pauses the engines from the driver in abort mode"
        )
    hook = getattr(args, "custom_megatron_init_path", None)
    if hook not in (None, TRAIN_HOOK_PATH):
        return (
            f"--weight-push-mode {mode} needs --custom-megatron-init-path {TRAIN_HOOK_PATH} (got {hook!r}): "
            f"it makes slime's updater pause with mode {mode} and skip the flush"
        )
    return None


# ---------------------------------------------------------------- train side


class _Call:
    """An actor method as slime's updater calls it: ``.remote(...)`` returns what ``ray.get`` takes."""

    def __init__(self, make_ref):
        self._make_ref = make_ref

    def remote(self, *args, **kwargs):
        return self._make_ref()


class HoldingEngine:
    """An SGLang engine actor as slime's updater sees it during an in-place or retract push: pause with
    that mode, no separate flush; every other method is the engine's own."""

    def __init__(self, engine, done_ref, mode: str = IN_PLACE):
        self._engine = engine
        self._done_ref = done_ref
        self._mode = mode

    @property
    def pause_generation(self) -> _Call:
        return _Call(lambda: self._engine._make_request.remote("pause_generation", {"mode": self._mode}))

    @property
    def flush_cache(self) -> _Call:
        # SGLang refuses it while requests run (and slime would retry for a minute): skip it
        return _Call(self._done_ref)

    @property
    def update_weights_from_disk(self) -> "_NoFlushUpdate":
        # slime's SGLangEngine.update_weights_from_disk sends no flush_cache, and SGLang's default
        # (true) kills the server while a request is held in place (the flush after the load fails)
        return _NoFlushUpdate(self._engine, "update_weights_from_disk", ("model_path", "load_format", "weight_version"))

    @property
    def _make_request(self) -> "_NoFlushRequests":
        return _NoFlushRequests(self._engine)

    def __getattr__(self, name):
        return getattr(self._engine, name)


def no_flush(endpoint: str, payload: dict | None) -> dict:
    """A weight update's payload with ``flush_cache`` false (other endpoints' payloads unchanged)."""
    payload = dict(payload or {})
    if endpoint.startswith("update_weights_from"):
        payload["flush_cache"] = False
    return payload


class _NoFlushRequests:
    """The engine actor's POST helper, every weight update through it sent with ``flush_cache`` false."""

    def __init__(self, engine):
        self._engine = engine

    def remote(self, endpoint, payload=None):
        return self._engine._make_request.remote(endpoint, no_flush(endpoint, payload))


class _NoFlushUpdate:
    """An engine actor's update method (slime's keyword names, Nones left out, as slime's payload)
    posted through its POST helper with ``flush_cache`` false."""

    def __init__(self, engine, endpoint: str, names: tuple[str, ...]):
        self._engine, self._endpoint, self._names = engine, endpoint, names

    def remote(self, *args, **kwargs):
        given = {**dict(zip(self._names, args)), **kwargs}
        payload = {k: v for k, v in given.items() if v is not None}
        return self._engine._make_request.remote(self._endpoint, no_flush(self._endpoint, payload))


def holding_update_weights(update_weights, mode: str = IN_PLACE):
    """slime's ``update_weights(self)`` run with ``mode`` views (in_place, retract) of ``self.rollout_engines``."""
    if getattr(update_weights, _MARK, False):
        return update_weights
    module = sys.modules[update_weights.__module__]  # slime's updater module: its ``ray`` gets the no-flush ref

    @functools.wraps(update_weights)
    def wrapped(self, *args, **kwargs):
        engines = self.rollout_engines
        self.rollout_engines = [HoldingEngine(e, lambda: module.ray.put(None), mode) for e in engines]
        try:
            return update_weights(self, *args, **kwargs)
        finally:
            self.rollout_engines = engines

    setattr(wrapped, _MARK, True)
    return wrapped


def install_train_hook(args) -> None:
    """``--custom-megatron-init-path epic_slime.slime.push_mode.install_train_hook``: the R3 train
    hook when R3 is on (``epic_slime.slime.routing.install_train_hook``), and under
    ``--weight-push-mode in_place`` or ``retract`` slime's distributed updater pausing with that mode;
    every bucket it broadcasts is name-checked first (``served_weights.install_push_name_check``)."""
    if (
        getattr(args, "use_rollout_routing_replay", False)
        and getattr(args, "rollout_function_path", None) == ROLLOUT_FUNCTION_PATH
    ):
        from epic_slime.slime.routing import install_train_hook as install_r3

        install_r3(args)
    install_push_hook(args)
    from epic_slime.slime.stream.served_weights import install_push_name_check

    install_push_name_check()  # the server answers success to a name it does not load: refuse it here
    from epic_slime.slime.stream.push_recovery import install_stale_group_reset

    install_stale_group_reset()  # a resumed driver's connect after one killed mid-push (engines that outlived it)


def install_push_hook(args) -> bool:
    """The push half of ``install_train_hook``: under ``--weight-push-mode in_place`` or ``retract``, slime's
    ``UpdateWeightFromDistributed.update_weights`` pauses with that mode (idempotent; True when installed)."""
    mode = push_mode_of(args)
    if mode not in HOLDING_PUSH_MODES:
        return False
    from slime.backends.megatron_utils.update_weight.update_weight_from_distributed import UpdateWeightFromDistributed

    UpdateWeightFromDistributed.update_weights = holding_update_weights(
        UpdateWeightFromDistributed.update_weights, mode
    )
    return True


# ---------------------------------------------------------------- rollout side


def fresh_prefix_key() -> str:
    return KEY_PREFIX + uuid.uuid4().hex


def keyed_submission(call):
    """An async slime call (a group submission, an evaluation) whose requests get one fresh key."""
    if getattr(call, _MARK, False):
        return call

    @functools.wraps(call)
    async def wrapped(*args, **kwargs):
        token = _prefix_key.set(fresh_prefix_key())
        try:
            return await call(*args, **kwargs)
        finally:
            _prefix_key.reset(token)

    setattr(wrapped, _MARK, True)
    return wrapped


def with_prefix_key(payload: Any, url: str) -> Any:
    """The ``/generate`` payload with this submission's ``extra_key`` (a fresh one outside any)."""
    if not (isinstance(payload, dict) and str(url).rstrip("/").endswith("/generate")) or "extra_key" in payload:
        return payload
    return {**payload, "extra_key": _prefix_key.get() or fresh_prefix_key()}


def keyed_post(post):
    """slime's ``http_utils.post(url, payload, ...)`` adding the prefix-cache key to ``/generate``."""
    if getattr(post, _MARK, False):
        return post

    @functools.wraps(post)
    async def wrapped(url, payload, *args, **kwargs):
        return await post(url, with_prefix_key(payload, url), *args, **kwargs)

    setattr(wrapped, _MARK, True)
    return wrapped


def install_rollout_hook(args) -> bool:
    """Under ``--weight-push-mode in_place`` or ``retract``: every ``/generate`` request carries the
    prefix-cache key of its submission (see the module docstring). Idempotent; True when installed."""
    if push_mode_of(args) not in HOLDING_PUSH_MODES:
        return False
    from slime.rollout import sglang_rollout
    from slime.utils import http_utils

    sglang_rollout.generate_and_rm_group = keyed_submission(sglang_rollout.generate_and_rm_group)
    sglang_rollout.eval_rollout = keyed_submission(sglang_rollout.eval_rollout)
    sglang_rollout.post = keyed_post(sglang_rollout.post)
    http_utils.post = keyed_post(http_utils.post)  # for callers that import it at call time (epic_slime.slime.generate)
    return True


def installed() -> dict[str, bool]:
    """Which hooks this process holds (for tests and logs)."""
    out = {}
    rollout = sys.modules.get("slime.rollout.sglang_rollout")
    if rollout is not None:
        out["rollout"] = getattr(rollout.generate_and_rm_group, _MARK, False)
    updater = sys.modules.get("slime.backends.megatron_utils.update_weight.update_weight_from_distributed")
    if updater is not None:
        out["train"] = getattr(updater.UpdateWeightFromDistributed.update_weights, _MARK, False)
    return out
