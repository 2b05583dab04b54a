"""The tool-using agent's pure parts (no slime): the tool registry, tool calls in model text, and
the turn bookkeeping that ``epic_slime.slime.agent_generate`` drives (retool's shape).

A turn is one engine call. Its text may end with a tool call, ``<calc>12*34</calc>`` (the tag is
the tool's name); the call's output comes back as an observation, ``<result>408</result>``, whose
tokens join the response with loss mask 0. A tool that raises, refuses its input or runs past its
timeout answers ``<result>error: ...</result>``: the model sees the error, the trajectory goes on.
The trajectory stops when a turn ends without a call (completed), at the turn cap, or at the
response-length cap, which counts tool tokens (truncated; ``stop_reason`` says which).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Awaitable, Callable

from epic_slime.tools.calc import CalcError, calc

Tool = Callable[[str], "str | Awaitable[str]"]

# why a trajectory stopped (Sample.metadata["agent"]["stop_reason"])
STOP_ANSWERED = "answered"  # a turn ended without a tool call
STOP_TURN_CAP = "turn_cap"
STOP_LENGTH_CAP = "length_cap"  # the engine stopped at max_new_tokens, or a tool output did not fit
STOP_REASONS = (STOP_ANSWERED, STOP_TURN_CAP, STOP_LENGTH_CAP)


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """max_turns: engine calls per trajectory. tool_timeout_s: per tool call. max_call_chars: the
    longest tool input read (longer calls are answered with an error). python: offer the sandboxed
    ``python`` tool (opt-in; ``epic_slime.tools.sandbox``)."""

    max_turns: int = 4
    tool_timeout_s: float = 5.0
    max_call_chars: int = 2000
    python: bool = False

    def __post_init__(self):
        for name in ("max_turns", "max_call_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"AgentConfig.{name} must be an int >= 1, got {value!r}")
        if not (isinstance(self.tool_timeout_s, (int, float)) and 0 < self.tool_timeout_s < 3600):
            raise ValueError(f"AgentConfig.tool_timeout_s must be in (0, 3600) seconds, got {self.tool_timeout_s!r}")


def _python_tool(code: str) -> str:
    from epic_slime.tools.sandbox import run_python

    return run_python(code)


class ToolRegistry:
    """Tools by name. ``calc`` always; ``python`` only when the config opts in."""

    def __init__(self, config: AgentConfig | None = None):
        self.config = config or AgentConfig()
        self.tools: dict[str, Tool] = {"calc": calc}
        if self.config.python:
            self.tools["python"] = _python_tool

    def register(self, name: str, tool: Tool) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", name or ""):
            raise ValueError(f"tool name {name!r} must be lower-case letters, digits or _ (a tag in model text)")
        if name in self.tools:
            raise ValueError(f"tool {name!r} is registered twice")
        self.tools[name] = tool

    def observation(self, text: str) -> str:
        """The text whose tokens join the response after a call (a registry may format its own)."""
        return format_observation(text)

    def stop_strings(self) -> list[str]:
        """The engine stops a turn right after a call: these close the call tags."""
        return [f"</{name}>" for name in self.tools]

    def find_call(self, turn_text: str) -> tuple[str, str] | None:
        """(tool, input) when the turn's text ends with a complete call (trailing blanks allowed)."""
        stripped = turn_text.rstrip()
        for name in self.tools:
            close = f"</{name}>"
            if stripped.endswith(close):
                start = stripped.rfind(f"<{name}>")
                if start >= 0:
                    return name, stripped[start + len(name) + 2 : -len(close)]
        return None

    async def run(self, name: str, argument: str) -> tuple[str, str | None]:
        """(observation text, error kind or None). Never raises for a tool's failure."""
        if len(argument) > self.config.max_call_chars:
            return f"error: tool input longer than {self.config.max_call_chars} characters", "input_too_long"
        tool = self.tools[name]
        try:
            result = await asyncio.wait_for(_call(tool, argument), timeout=self.config.tool_timeout_s)
        except asyncio.TimeoutError:
            return f"error: {name} timed out after {self.config.tool_timeout_s:g} s", "timeout"
        except CalcError as exc:
            return f"error: {exc}", "refused"
        except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's observation
            return f"error: {name} failed: {type(exc).__name__}: {_one_line(str(exc))}", "raised"
        return str(result), None


async def _call(tool: Tool, argument: str) -> str:
    if asyncio.iscoroutinefunction(tool):
        return await tool(argument)
    # a thread: a slow synchronous tool never blocks the event loop the whole rollout shares (a hung
    # one keeps its thread, but the trajectory goes on after the timeout)
    return await asyncio.to_thread(tool, argument)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def format_observation(text: str) -> str:
    return f"\n<result>{text}</result>\n"


@dataclasses.dataclass
class TrajectoryLog:
    """What the generate function records per trajectory (Sample.metadata["agent"], JSON-able).

    spans: [kind, weight version or None, tokens] in response order; kind "model" or "tool". The
    model spans carry the version the engine reported for the call that made them, so every model
    token's version is known, across turns and pushes. turns: engine calls that produced tokens.
    tool_calls / tool_errors: calls made, and those answered with an error (errors by kind).
    turn_start_chars: where the current turn's text begins in Sample.response (a turn resumed after
    an abort continues its text)."""

    spans: list = dataclasses.field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: dict = dataclasses.field(default_factory=dict)
    stop_reason: str | None = None
    turn_start_chars: int = 0
    turn_open: bool = False  # the current turn was aborted mid-way and continues on the next call

    @classmethod
    def of(cls, metadata: dict) -> TrajectoryLog:
        data = metadata.get("agent")
        return cls(**data) if data else cls()

    def save(self, metadata: dict) -> None:
        metadata["agent"] = dataclasses.asdict(self)

    def add_model_tokens(self, version, count: int) -> None:
        if count:
            self._add("model", version, count)

    def add_tool_tokens(self, count: int) -> None:
        if count:
            self._add("tool", None, count)

    def _add(self, kind, version, count) -> None:
        if self.spans and self.spans[-1][0] == kind and self.spans[-1][1] == version:
            self.spans[-1][2] += count
        else:
            self.spans.append([kind, version, count])

    def token_versions(self) -> list:
        """Per response token: the weight version that generated it (None for tool tokens)."""
        return [version for kind, version, count in self.spans for _ in range(count)]

    def loss_mask(self) -> list[int]:
        return [1 if kind == "model" else 0 for kind, _, count in self.spans for _ in range(count)]
