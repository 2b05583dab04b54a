"""The calc tool (a whitelisted expression tree, never eval) and the tool registry (issue 44, item 3)."""

from __future__ import annotations

import asyncio
import time

import pytest

from epic_slime.tools.agent import AgentConfig, ToolRegistry, TrajectoryLog
from epic_slime.tools.calc import MAX_CHARS, MAX_INT_BITS, CalcError, calc, evaluate


@pytest.mark.parametrize(
    "text, want",
    [
        ("12*34", 12 * 34),
        ("  (1+2)*3 - -4 ", 13),
        ("7/2", 3.5),
        ("7//2", 3),
        ("-7 % 3", 2),
        ("2**10", 1024),
        ("2**-1", 0.5),
        ("123456789*987654321", 123456789 * 987654321),
        ("1_000 + 1", 1001),
        ("2**255", 2**255),
        ("1.5e3*2", 3000.0),
    ],
)
def test_arithmetic_values(text, want):
    assert evaluate(text) == want


def test_formatting():
    assert calc("12*34") == "408"
    assert calc("7/2") == "3.5"
    assert calc("6/3") == "2"
    assert calc("1/3") == "0.333333333333"


@pytest.mark.parametrize(
    "text, reason",
    [
        ("__import__('os').system('id')", "Call is not allowed"),
        ("open('/etc/passwd')", "Call is not allowed"),
        ("x + 1", "Name is not allowed"),
        ("(1).__class__", "Attribute is not allowed"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1j * 2", "only numbers"),
        ("[1, 2][0]", "Subscript is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("1 if 1 else 2", "IfExp is not allowed"),
        ("1 < 2", "Compare is not allowed"),
        ("1 << 400", "operator LShift is not allowed"),
        ("9**9**9", "exponent"),
        ("10**80", "too large"),
        ("2**256", "too large"),
        ("1" * 80, "too large"),
        ("1e308 * 10", "not a finite number"),
        ("10.0**400", "exponent"),
        ("1/0", "division by zero"),
        ("(-8)**0.5", "fractional power"),
        ("1+" * 40 + "1", "more than 64 parts"),
        ("1" + " " * MAX_CHARS + "+1", "longer than"),
        ("", "empty"),
        ("1 +", "not an expression"),
        ("import os", "not an expression"),
    ],
)
def test_refused_inputs_name_their_reason_quickly(text, reason):
    start = time.perf_counter()
    with pytest.raises(CalcError, match=reason):
        evaluate(text)
    assert time.perf_counter() - start < 0.05


def test_the_bit_limit_is_a_boundary():
    assert evaluate(f"{2**MAX_INT_BITS - 1} + 0") == 2**MAX_INT_BITS - 1
    with pytest.raises(CalcError, match="too large"):
        evaluate(f"{2**MAX_INT_BITS - 1} + 1")


def _run(coro):
    return asyncio.run(coro)


def test_registry_finds_calls_only_at_the_end_of_a_turn():
    registry = ToolRegistry()
    assert registry.find_call("Let me compute <calc>12*34</calc>\n") == ("calc", "12*34")
    assert registry.find_call("<calc>1+1</calc> then more text") is None
    assert registry.find_call("no call") is None
    assert registry.find_call("<python>print(1)</python>") is None  # not offered unless opted in
    assert ToolRegistry(AgentConfig(python=True)).find_call("<python>print(1)</python>") == ("python", "print(1)")
    assert registry.stop_strings() == ["</calc>"]


def test_tool_failures_come_back_as_observations():
    registry = ToolRegistry(AgentConfig(tool_timeout_s=0.2, max_call_chars=50))

    def raising(_):
        raise RuntimeError("disk on fire\nsecond line")

    async def hanging(_):
        await asyncio.sleep(10)

    registry.register("boom", raising)
    registry.register("hang", hanging)
    assert _run(registry.run("calc", "2*21")) == ("42", None)
    assert _run(registry.run("calc", "x")) == (
        "error: Name is not allowed (numbers and + - * / // % ** only)",
        "refused",
    )
    assert _run(registry.run("boom", "")) == ("error: boom failed: RuntimeError: disk on fire second line", "raised")
    start = time.perf_counter()
    assert _run(registry.run("hang", "")) == ("error: hang timed out after 0.2 s", "timeout")
    assert time.perf_counter() - start < 2
    assert _run(registry.run("calc", "1+" * 30 + "1"))[1] == "input_too_long"


def test_registry_and_config_refuse_bad_settings():
    with pytest.raises(ValueError, match="max_turns must be an int >= 1"):
        AgentConfig(max_turns=0)
    with pytest.raises(ValueError, match="tool_timeout_s"):
        AgentConfig(tool_timeout_s=0)
    registry = ToolRegistry()
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("calc", str)
    with pytest.raises(ValueError, match="must be lower-case"):
        registry.register("Bad Name", str)


def test_trajectory_log_round_trips_and_merges_spans():
    log = TrajectoryLog()
    log.add_model_tokens(3, 4)
    log.add_model_tokens(3, 2)
    log.add_tool_tokens(5)
    log.add_model_tokens(4, 1)
    log.add_model_tokens(4, 0)
    assert log.spans == [["model", 3, 6], ["tool", None, 5], ["model", 4, 1]]
    assert log.loss_mask() == [1] * 6 + [0] * 5 + [1]
    assert log.token_versions() == [3] * 6 + [None] * 5 + [4]
    metadata = {}
    log.save(metadata)
    assert TrajectoryLog.of(metadata) == log
