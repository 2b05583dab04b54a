"""A multi-turn, tool-using generate function for the e2e harness (issue 44, item 1): the project's own
``epic_slime.slime.agent_generate`` turn loop with a registry the tiny model can use.

The tiny model's 19-token vocabulary holds no tags, so this registry calls its tool at the end of every
turn the model ends by itself (end of sequence or stop token) and formats the observation as the
tool's bare output (tokens of that vocabulary): trajectories of up to ``MAX_TURNS`` engine calls with
tool spans between them, through slime's ``generate_and_rm`` and the project's stream, unchanged."""

from __future__ import annotations

from epic_slime.slime.agent_generate import make_generate
from epic_slime.tools.agent import AgentConfig, ToolRegistry

MAX_TURNS = 3
TOOL_OUTPUT = "7;"  # two tokens of the tiny vocabulary


class EveryTurnRegistry(ToolRegistry):
    def __init__(self):
        super().__init__(AgentConfig(max_turns=MAX_TURNS))
        self.register("digits", lambda _: TOOL_OUTPUT)

    def find_call(self, turn_text: str):
        return ("digits", turn_text)

    def observation(self, text: str) -> str:
        return text


generate = make_generate(registry_factory=EveryTurnRegistry)
