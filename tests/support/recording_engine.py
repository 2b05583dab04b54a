"""An engine injected at ``GroupStream``'s ``generate_group`` seam that records what each call was given:
each group's calls, their start times and the response length the group already had. It answers one
two-token response carrying ``version(key, call)`` as its weight version, or raises ``ConnectionError``
while ``raises(key, call)``. Needs slime's ``Sample`` (the groups it is handed). ``OneTokenEngine``: the
same seam with a one-token answer and no timing record. ``settle`` waits for the stream's generations to
end, as the stream tests do between steps."""

from __future__ import annotations

import argparse
import asyncio
import time


class RecordingEngine:
    def __init__(self, version=lambda key, call: "1", raises=lambda key, call: False):
        self.calls: list[int] = []
        self.starts: dict[int, list[float]] = {}
        self.lengths_given: dict[int, list[int]] = {}
        self.version, self.raises = version, raises

    async def generate(self, args, group, sampling_params, evaluation=False):
        key = group[0].group_index
        call = self.calls.count(key)
        self.calls.append(key)
        self.starts.setdefault(key, []).append(time.monotonic())
        self.lengths_given.setdefault(key, []).append(sum(s.response_length for s in group))
        await asyncio.sleep(0.001)
        if self.raises(key, call):
            raise ConnectionError(f"engine lost while generating group {key}")
        for sample in group:
            if not sample.tokens:  # the prompt's tokens, as slime's generate sets them on a first call
                sample.tokens = [1]
            sample.append_response_tokens(
                argparse.Namespace(partial_rollout=False),
                tokens=[7, 8],
                log_probs=[-0.1, -0.2],
                meta_info={"weight_version": self.version(key, call), "finish_reason": {"type": "stop"}},
            )
        return group


async def settle(stream, timeout: float = 30.0, poll_s: float = 0.005) -> None:
    """Wait until ``stream`` has no generation running, or ``timeout`` seconds (a hang fails the test's
    own assertions instead of waiting forever)."""
    deadline = time.monotonic() + timeout
    while stream.active and time.monotonic() < deadline:
        await asyncio.sleep(poll_s)


class OneTokenEngine:
    """Answers each call with one token carrying ``version(key, call)``; raises ``ConnectionError`` while
    ``raises(key, call)``. Records the keys of its calls in order."""

    def __init__(self, version=lambda key, call: "1", raises=lambda key, call: False):
        self.calls: list[int] = []
        self.version, self.raises = version, raises

    async def generate(self, args, group, sampling_params, evaluation=False):
        key = group[0].group_index
        call = self.calls.count(key)
        self.calls.append(key)
        await asyncio.sleep(0.001)
        if self.raises(key, call):
            raise ConnectionError(f"engine lost while generating group {key}")
        for sample in group:
            sample.append_response_tokens(
                argparse.Namespace(partial_rollout=False),
                tokens=[7],
                log_probs=[-0.1],
                meta_info={"weight_version": self.version(key, call), "finish_reason": {"type": "stop"}},
            )
        return group
