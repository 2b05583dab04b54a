"""slime reward hook: ``--custom-rm-path epic_slime.reward.slime_rm.reward``.

slime awaits ``reward(args, sample)`` per sample (or ``reward(args, samples)`` with
``--group-rm``). The verifier blocks (up to its deadline), so it runs in a thread to keep
slime's event loop serving other generations. No slime import is needed: only
``sample.response`` and ``sample.label`` are read.

Optional ``args`` attribute (e.g. from ``--custom-config-path``): ``epic_reward_timeout``
(seconds, default 5).
"""

from __future__ import annotations

import asyncio

from epic_slime.reward import DEFAULT_TIMEOUT_S, math_reward, math_rewards


def _timeout(args) -> float:
    return float(getattr(args, "epic_reward_timeout", None) or DEFAULT_TIMEOUT_S)


async def reward(args, sample, **kwargs):
    """1.0 / 0.0 for one sample; a list of rewards for a list of samples (group RM)."""
    timeout = _timeout(args)
    if isinstance(sample, (list, tuple)):
        responses = [s.response for s in sample]
        labels = [s.label for s in sample]
        return await asyncio.to_thread(math_rewards, responses, labels, timeout)
    return await asyncio.to_thread(math_reward, sample.response, sample.label, timeout)
