"""A weight push whose trainer died mid-way leaves its update group on every engine that outlived it;
the next driver's connect must not trip over it (issue 35 item 4).

Measured on the real SGLang 0.5.15.post1 server (``tests/support/fault_probes.py``): when the trainer side of
``update_weights_from_distributed`` dies between two tensors, the server's gloo receive fails at once
("Connection reset by peer"), the call answers 400 ("partially updated, discard the whole weights")
within 0.1 s and the server keeps serving. But it keeps the group: a new ``init_weights_update_group`` of
the same name answers 400 ("The specified group name has already been created"), and the trainer side of
slime's connect (``connect_rollout_engines_from_distributed``: ``init_process_group`` before it waits for the
engines' answers) then waits for a rank that never joins, until its timeout (torch's default: 30 min).
After ``/destroy_weights_update_group`` of that name a new group and a full push work.

Engines outlive the driver when they are not the driver's Ray actors (``--rollout-external``; the e2e
harness's servers): slime's own engines die with the job and start clean. ``clear_stale_update_group``
destroys the group of that name on each engine before the connect (an engine without one answers 400,
which slime's ``destroy_weights_update_group`` swallows); ``install_stale_group_reset`` puts it in front of
slime's ``connect_rollout_engines_from_distributed`` (idempotent). The resumed run's first push then
replaces every tensor before any generation (slime pushes the whole model), so no engine keeps the torn
push's weights.

slime is imported lazily (this module is imported by the driver's train hook).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

_MARK = "_epic_stale_group_reset"


def clear_stale_update_group(engines: Sequence[Any], group_name: str, get: Callable[[Any], Any]) -> list:
    """Ask each engine actor to destroy its update group ``group_name`` (a leftover of a driver that died
    mid-push); ``get`` resolves the actors' futures (``ray.get``). Returns the engines' answers."""
    answers = get([engine.destroy_weights_update_group.remote(group_name=group_name) for engine in engines])
    cleared = sum(1 for a in answers if isinstance(a, dict) and a.get("success"))
    if cleared:
        logger.warning(
            "destroyed a leftover weight-update group %r on %d of %d engines (a driver died mid-push)",
            group_name,
            cleared,
            len(answers),
        )
    return answers


def stale_group_reset(connect: Callable) -> Callable:
    """``connect(args, group_name, rollout_engines, ...)`` preceded by ``clear_stale_update_group``."""
    if getattr(connect, _MARK, False):
        return connect

    @functools.wraps(connect)
    def wrapped(args, group_name, rollout_engines, *rest, **kwargs):
        import ray

        clear_stale_update_group(rollout_engines, group_name, ray.get)
        return connect(args, group_name, rollout_engines, *rest, **kwargs)

    setattr(wrapped, _MARK, True)
    return wrapped


def install_stale_group_reset() -> None:
    """Put ``clear_stale_update_group`` in front of slime's distributed connect (idempotent)."""
    from slime.backends.megatron_utils.update_weight import update_weight_from_distributed as module

    module.connect_rollout_engines_from_distributed = stale_group_reset(module.connect_rollout_engines_from_distributed)
