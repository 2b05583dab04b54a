"""The project's tool-using generate function (``epic_slime.slime.agent_generate``) on slime 624b824a's
own ``Sample`` (issue 44, items 3 and 9).

The engine is scripted at SGLang's ``/generate`` JSON interface (what slime's ``post`` returns): each
call answers the next scripted text as tokens of a one-character-per-token tokenizer, with
``output_token_logprobs``, ``finish_reason`` and ``weight_version``, honouring ``max_new_tokens`` and
checking what the function sends (the whole sequence so far, the tools' stop strings)."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from support.preconditions import slime_or_skip

with slime_or_skip("needs slime's source (set SLIME_PATH)"):
    from slime.utils.types import Sample

from epic_slime.slime.agent_generate import make_generate, run_agent  # noqa: E402
from epic_slime.tools.agent import AgentConfig, ToolRegistry, TrajectoryLog  # noqa: E402

PROMPT = "Q: 123*456? "


class CharTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class ScriptedEngine:
    """Answers each call with the next (text, finish, version); a finish of "abort" after n tokens is
    given as ("abort", n); a version of None is left out of the answer."""

    def __init__(self, script):
        self.script = list(script)
        self.requests = []

    async def __call__(self, url, payload):
        self.requests.append(payload)
        text, finish, version = self.script.pop(0)
        room = payload["sampling_params"]["max_new_tokens"]
        if isinstance(finish, tuple):  # aborted by a push after n tokens
            text, finish = text[: finish[1]], "abort"
        elif len(text) > room:
            text, finish = text[:room], "length"
        ids = [ord(c) for c in text]
        entries = [[-0.01 * (i + 1), t, None] for i, t in enumerate(ids)]
        meta = {"output_token_logprobs": entries, "finish_reason": {"type": finish}}
        if version is not None:  # None: an engine that reports no weight version
            meta["weight_version"] = str(version)
        return {"text": text, "meta_info": meta}


def _args(**extra):
    return argparse.Namespace(sglang_router_ip="127.0.0.1", sglang_router_port=1, policy_loss="epic", **extra)


def _sample():
    tok = CharTokenizer()
    return Sample(index=0, prompt=PROMPT, tokens=tok.encode(PROMPT))


def _run(engine, sample=None, config=AgentConfig(), max_new_tokens=200, registry=None, args=None):
    sample = sample or _sample()
    registry = registry or ToolRegistry(config)
    coro = run_agent(
        args or _args(),
        sample,
        {"max_new_tokens": max_new_tokens, "temperature": 1.0},
        registry,
        tokenizer=CharTokenizer(),
        post=engine,
    )
    return asyncio.run(coro)


def _check_alignment(sample):
    """slime's fields agree with each other and with the trajectory log."""
    log = TrajectoryLog.of(sample.metadata)
    n = sample.response_length
    assert len(sample.tokens) == len(PROMPT) + n
    assert len(sample.loss_mask) == n and len(sample.rollout_log_probs) == n
    assert sample.loss_mask == log.loss_mask()
    for mask, lp in zip(sample.loss_mask, sample.rollout_log_probs):
        assert (lp == 0.0) if mask == 0 else (lp < 0)  # tool tokens: slime's 0.0 placeholder
    assert CharTokenizer().decode(sample.tokens[len(PROMPT) :]) == sample.response
    return log


def test_two_tool_calls_then_an_answer_across_a_push_between_turns():
    engine = ScriptedEngine(
        [
            ("I use <calc>123*456</calc>", "stop", 3),
            ("check <calc>56088 / 0</calc>", "stop", 3),
            ("The answer is \\boxed{56088}.", "stop", 4),  # a push landed between turns
        ]
    )
    sample = _run(engine)
    assert sample.status == Sample.Status.COMPLETED
    assert "<result>56088</result>" in sample.response and "<result>error: division by zero</result>" in sample.response
    log = _check_alignment(sample)
    assert (log.turns, log.tool_calls, log.tool_errors, log.stop_reason) == (3, 2, {"refused": 1}, "answered")
    kinds = [(kind, version) for kind, version, _ in log.spans]
    assert kinds == [("model", 3), ("tool", None), ("model", 3), ("tool", None), ("model", 4)]
    assert sample.weight_versions == ["3", "3", "4"]  # one per engine call: staleness reads the oldest
    # each call sends the whole sequence so far and stops right after a tool call
    for request in engine.requests:
        assert request["sampling_params"]["stop"] == ["</calc>"] and request["sampling_params"]["no_stop_trim"]
    assert engine.requests[1]["input_ids"] == sample.tokens[: len(engine.requests[1]["input_ids"])]
    assert len(engine.requests[2]["input_ids"]) == len(sample.tokens) - len("The answer is \\boxed{56088}.")


def test_turn_cap_truncates_after_the_last_observation():
    engine = ScriptedEngine([("<calc>1+1</calc>", "stop", 0)] * 2)
    sample = _run(engine, config=AgentConfig(max_turns=2))
    assert sample.status == Sample.Status.TRUNCATED
    log = _check_alignment(sample)
    assert (log.turns, log.tool_calls, log.stop_reason) == (2, 2, "turn_cap")
    assert sample.loss_mask[-1] == 0 and not engine.script  # ends with the tool output; no third call


def test_length_cap_counts_tool_tokens():
    # the first turn leaves room for only part of the observation: it is cut and the sample truncated
    engine = ScriptedEngine([("<calc>99*99</calc>", "stop", 0)])
    cap = len("<calc>99*99</calc>") + 5
    sample = _run(engine, max_new_tokens=cap)
    assert sample.status == Sample.Status.TRUNCATED and sample.response_length == cap
    log = _check_alignment(sample)
    assert log.stop_reason == "length_cap" and log.spans[-1] == ["tool", None, 5]
    # the engine's own length stop: the room it is given is the cap minus the response so far
    engine = ScriptedEngine([("<calc>2*3</calc>", "stop", 0), ("x" * 100, "stop", 0)])
    sample = _run(engine, max_new_tokens=40)
    assert engine.requests[1]["sampling_params"]["max_new_tokens"] == 40 - len("<calc>2*3</calc>\n<result>6</result>\n")
    assert sample.status == Sample.Status.TRUNCATED and sample.response_length == 40
    assert _check_alignment(sample).stop_reason == "length_cap"


def test_abort_mid_turn_keeps_the_finished_turns_and_continues_the_turn():
    """A push aborts the second turn after 4 tokens: the sample comes back ABORTED with everything so
    far; resubmitted (as the stream does), the turn continues on the new weights, the first tool is
    not run again, and the tokens carry the version of the call that made them."""
    calls = []

    def counting_calc(text):
        calls.append(text)
        return "42"

    registry = ToolRegistry()
    registry.tools["calc"] = counting_calc
    engine = ScriptedEngine(
        [
            ("<calc>6*7</calc>", "stop", 1),
            ("The a", ("abort", 5), 1),
            ("nswer is 42", "stop", 2),
        ]
    )
    sample = _run(engine, registry=registry)
    assert sample.status == Sample.Status.ABORTED
    assert TrajectoryLog.of(sample.metadata).turn_open
    sample = _run(engine, sample=sample, registry=registry)
    assert sample.status == Sample.Status.COMPLETED and calls == ["6*7"]
    assert sample.response.endswith("The answer is 42")
    log = _check_alignment(sample)
    assert log.turns == 2 and log.stop_reason == "answered"
    observation = len("\n<result>42</result>\n")
    assert log.spans == [["model", 1, 16], ["tool", None, observation], ["model", 1, 5], ["model", 2, 11]]
    assert engine.requests[2]["input_ids"] == sample.tokens[: -len("nswer is 42")]


def test_an_abort_that_lands_on_the_last_token_of_the_budget_ends_the_turn_at_the_cap():
    """Seen on the real server: a push aborts a turn just as it reaches the response-length cap (the
    answer's finish is "abort", with every token of the room). Resubmitted, no room is left: the open
    turn counts as a turn and ends there (truncated at the length cap), with no engine call."""
    cap = len("<calc>6*7</calc>\n<result>42</result>\n") + 5
    engine = ScriptedEngine([("<calc>6*7</calc>", "stop", 1), ("The a", ("abort", 5), 1)])
    sample = _run(engine, max_new_tokens=cap)
    assert sample.status == Sample.Status.ABORTED and sample.response_length == cap
    sample = _run(engine, sample=sample, max_new_tokens=cap)
    assert sample.status == Sample.Status.TRUNCATED and len(engine.requests) == 2
    log = _check_alignment(sample)
    assert (log.turns, log.turn_open, log.stop_reason) == (2, False, "length_cap")


def test_tool_that_hangs_or_raises_is_an_observation_and_the_trajectory_goes_on():
    async def hang(_):
        await asyncio.sleep(30)

    def boom(_):
        raise OSError("no such tool backend")

    registry = ToolRegistry(AgentConfig(tool_timeout_s=0.2))
    registry.register("hang", hang)
    registry.register("boom", boom)
    engine = ScriptedEngine([("<hang>x</hang>", "stop", 0), ("<boom>y</boom>", "stop", 0), ("done", "stop", 0)])
    sample = _run(engine, registry=registry)
    assert sample.status == Sample.Status.COMPLETED
    assert "<result>error: hang timed out after 0.2 s</result>" in sample.response
    assert "<result>error: boom failed: OSError: no such tool backend</result>" in sample.response
    assert _check_alignment(sample).tool_errors == {"timeout": 1, "raised": 1}


def test_topk_modes_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^--policy-loss dppo_topk_tv needs Top-K rows per token.*agent_generate$"):
        _run(ScriptedEngine([]), args=argparse.Namespace(policy_loss="dppo_topk_tv", policy_loss_topk=4))


def test_make_generate_has_slimes_signature():
    import inspect

    generate = make_generate(AgentConfig(max_turns=2))
    assert list(inspect.signature(generate).parameters) == ["args", "sample", "sampling_params", "evaluation"]
    assert asyncio.iscoroutinefunction(generate)


def test_an_observation_that_exactly_fills_the_room_ends_the_trajectory_without_another_call():
    """The cap met exactly by a tool's output (nothing cut): length_cap, TRUNCATED, and no engine call
    with max_new_tokens 0 (the next script entry would be taken by one)."""
    turn = "<calc>6*7</calc>"
    cap = len(turn) + len("\n<result>42</result>\n")
    engine = ScriptedEngine([(turn, "stop", 0), ("never sent", "stop", 0)])
    sample = _run(engine, max_new_tokens=cap)
    assert len(engine.requests) == 1 and sample.response_length == cap
    assert sample.status == Sample.Status.TRUNCATED
    log = _check_alignment(sample)
    assert log.stop_reason == "length_cap" and log.spans[-1] == ["tool", None, cap - len(turn)]


def test_the_runs_own_stop_strings_are_kept_beside_the_tools():
    engine = ScriptedEngine([("Answer: 7", "stop", 0)])
    params = {"max_new_tokens": 50, "temperature": 1.0, "stop": ["###"]}
    asyncio.run(run_agent(_args(), _sample(), params, ToolRegistry(), tokenizer=CharTokenizer(), post=engine))
    assert engine.requests[0]["sampling_params"]["stop"] == ["###", "</calc>"]
    assert params["stop"] == ["###"]  # the caller's dict is not changed


def test_a_call_without_a_reported_version_is_not_given_the_previous_calls():
    """An engine that reports no weight version for a call: that call's tokens have version None (unknown),
    not the version an earlier call reported."""
    engine = ScriptedEngine([("<calc>1+1</calc>", "stop", 3), ("two", "stop", None)])
    sample = _run(engine)
    assert sample.weight_versions == ["3"]
    log = _check_alignment(sample)
    assert [(kind, version) for kind, version, _ in log.spans] == [("model", 3), ("tool", None), ("model", None)]


def test_tool_errors_of_one_kind_are_counted_each_time():
    engine = ScriptedEngine([("<calc>1/0</calc>", "stop", 0), ("<calc>x</calc>", "stop", 0), ("ok", "stop", 0)])
    log = _check_alignment(_run(engine))
    assert (log.tool_calls, log.tool_errors) == (2, {"refused": 2})


class RoutingEngine(ScriptedEngine):
    """Also answers R3 rows for the whole sequence (SGLang recomputes them on each call), every row
    holding the call's number, so the rows kept tell which call computed them."""

    async def __call__(self, url, payload):
        out = await super().__call__(url, payload)
        assert payload["return_routed_experts"]
        rows = len(payload["input_ids"]) + len(out["meta_info"]["output_token_logprobs"]) - 1
        out["meta_info"]["routed_experts"] = [len(self.requests)] * (rows * 2 * 2)
        return out


def test_r3_rows_of_earlier_turns_are_kept_and_tool_rows_come_from_the_next_prefill():
    import torch

    engine = RoutingEngine([("<calc>1+2</calc>", "stop", 0), ("ok", "stop", 1)])
    args = _args(use_rollout_routing_replay=True, num_layers=2, moe_router_topk=2, num_experts=4)
    sample = _run(engine, args=args)
    rows = torch.as_tensor(sample.rollout_routed_experts)[:, 0, 0].tolist()
    first = len(PROMPT) + len("<calc>1+2</calc>") - 1
    assert len(rows) == len(sample.tokens) - 1
    assert rows[:first] == [1] * first  # turn 1's prompt and tokens: the routes turn 1 ran with
    assert rows[first:] == [2] * (len(rows) - first)  # the tool output and turn 2: turn 2's prefill
