"""A multi-turn, tool-using generate function for the e2e harness (issue 44, item 1): the project's own
``epic_slime.slime.agent_generate`` turn loop with a registry the tiny model can use.

The tiny model's 19-token vocabulary holds no tags, so this registry calls its tool at the end of every
turn the model ends by itself (end of sequence or stop token) and formats the observation as the
tool's bare output (tokens of that vocabulary): trajectories of up to ``MAX_TURNS`` engine calls with
tool spans between them, through slime's ``generate_and_rm`` and the project's stream, unchanged.

``generate_slow_tool``: the same with a tool that takes ``SLOW_TOOL_S`` (a real tool's latency); a call
while a train step runs, after the next batch is collected, parks until that step's push, and the harness
holds such a push until a call is parked: on the real server, where the stand-in's held requests do not
exist, a push lands between two turns of a trajectory that a later batch trains."""

from __future__ import annotations

import asyncio
import time

from epic_slime.slime.agent_generate import make_generate
from epic_slime.tools.agent import AgentConfig, ToolRegistry

MAX_TURNS = 3
TOOL_OUTPUT = "7;"  # two tokens of the tiny vocabulary
SLOW_TOOL_S = 1.0
SPAN_WAIT_S = 120.0


async def _slow_tool(_: str) -> str:
    """A tool with latency. A call that answers while a train step runs, after the next batch is
    collected, parks until that step's push (at most ``SPAN_WAIT_S``); the harness holds that push until a
    call is parked (``slime_e2e_train.TRAIN_WINDOW``), so the push lands between two turns."""
    from support.slime_e2e_train import TRAIN_WINDOW

    TRAIN_WINDOW["hold_pushes"] = True
    await asyncio.sleep(SLOW_TOOL_S)
    if TRAIN_WINDOW["training"] and not TRAIN_WINDOW["collecting"]:
        seen, deadline = TRAIN_WINDOW["pushes"], time.monotonic() + SPAN_WAIT_S
        TRAIN_WINDOW["parked"] += 1
        try:
            while TRAIN_WINDOW["pushes"] == seen and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            TRAIN_WINDOW["parked"] -= 1
    return TOOL_OUTPUT


class EveryTurnRegistry(ToolRegistry):
    def __init__(self, slow: bool = False):
        # the slow tool's wait stays within its timeout (an error observation's letters are not in this vocabulary)
        timeout = SLOW_TOOL_S + SPAN_WAIT_S + 10 if slow else AgentConfig().tool_timeout_s
        super().__init__(AgentConfig(max_turns=MAX_TURNS, tool_timeout_s=timeout))
        self.register("digits", _slow_tool if slow else (lambda _: TOOL_OUTPUT))

    def find_call(self, turn_text: str):
        return ("digits", turn_text)

    def observation(self, text: str) -> str:
        return text


generate = make_generate(registry_factory=EveryTurnRegistry)
generate_slow_tool = make_generate(registry_factory=lambda: EveryTurnRegistry(slow=True))
