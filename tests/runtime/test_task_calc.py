"""The embedded runtime's agent task (issue 44 item 4, ``epic_slime.runtime.task_calc``): problems, the
tool's observation, and the multi-turn sampler that emits tool spans (loss mask 0, placeholder 0.0).

The sampler is checked two ways: against a scripted engine (every exit: answered, a refused call, the
turn cap, the length cap inside a model turn, inside an observation and right after a call) and with
the tiny model itself, whose behaviour log-probs of every model token must equal a teacher-forced
forward over the whole response, tool output in context.
"""

from __future__ import annotations

import pytest
import torch

from epic_slime.runtime import task_calc
from epic_slime.runtime.model import ModelConfig, build_policy, response_log_probs
from epic_slime.runtime.task import Tokenizer

TOK = Tokenizer()


def test_problems_split_and_chance():
    train = [task_calc.train_problem(i, 5) for i in range(300)]
    assert train == [task_calc.train_problem(i, 5) for i in range(300)]  # a pure function of (seed, index)
    held = task_calc.eval_problems(64)
    assert len({p.prompt for p in held}) == 64 and held == task_calc.eval_problems(64)
    for p in train + held:
        a, b = (int(x) for x in p.prompt[:-1].split("*"))
        assert task_calc.LOW <= a <= task_calc.HIGH and task_calc.LOW <= b <= task_calc.HIGH and p.answer == a * b
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    products = {a * b for a in range(10, 100) for b in range(10, 100)}
    assert task_calc.chance() == 1 / len(products)
    with pytest.raises(ValueError, match="held-out prompts asked"):
        task_calc.eval_problems(10_000)


@pytest.mark.parametrize(
    "text, observation",
    [("47*83", "3901;"), ("9-12", "-3;"), ("4*", ";"), ("", ";"), ("Answer:12", ";"), ("7/2", ";"), ("8/2", "4;")],
)
def test_the_tool_answers_digits_or_a_bare_separator(text, observation):
    assert task_calc.tool_observation(text) == observation


def test_the_warm_start_target_masks_the_tool_output():
    segments = task_calc.solution_segments(task_calc._problem(47, 83))
    assert segments == [("47*83=", 1), ("3901;", 0), ("Answer:3901", 1)]


def _scripted(turns: list[str]):
    """Stands in for ``model.sample``: each call answers the next scripted turn ("<eos>" at its end: the
    end-of-sequence token) and records the prefix it was given, which must hold every earlier turn and
    observation."""
    prefixes = []

    def fake(model, prompts, *, max_new_tokens, eos_id, stop_ids, **_):
        assert len(prompts) == 1
        prefixes.append(TOK.decode(prompts[0], stop_at_eos=False))
        text = turns.pop(0)
        ids = TOK.encode(text.removesuffix("<eos>")) + ([eos_id] if text.endswith("<eos>") else [])
        assert not set(ids[:-1]) & set(stop_ids)  # as the engine: a stop token ends the turn
        ids = ids[:max_new_tokens]
        return [
            {
                "response_ids": ids,
                "behavior_log_probs": [-0.5] * len(ids),
                "sampling_log_probs": [-0.5] * len(ids),
                "status": "x",
            }
        ]

    return fake, prefixes


def _run(monkeypatch, turns, max_turns=3, max_new=24, tool=True):
    fake, prefixes = _scripted(list(turns))
    monkeypatch.setattr(task_calc, "sample", fake)
    cfg = task_calc.AgentSampling(tool=tool, max_turns=max_turns, max_new_tokens=max_new)
    (s,) = task_calc.sample_with_tool(None, [task_calc._problem(47, 83)], 1, cfg, None)
    assert len(s["response_ids"]) == len(s["loss_mask"]) == len(s["behavior_log_probs"]) <= max_new
    for m, lp in zip(s["loss_mask"], s["behavior_log_probs"]):
        assert lp == (-0.5 if m else 0.0)
    return s, prefixes


def _spans(s) -> list[tuple[str, int]]:
    """The response as (text, loss mask) runs."""
    out = []
    for tid, m in zip(s["response_ids"], s["loss_mask"]):
        if out and out[-1][1] == m:
            out[-1][0] += TOK.vocab[tid]
        else:
            out.append([TOK.vocab[tid], m])
    return [(t, m) for t, m in out]


def test_a_call_its_observation_and_the_answer(monkeypatch):
    s, prefixes = _run(monkeypatch, ["47*83=", "Answer:3901<eos>"])
    assert _spans(s) == [("47*83=", 1), ("3901;", 0), ("Answer:3901<eos>", 1)]
    assert prefixes == ["47*83=", "47*83=47*83=3901;"]  # turn 2 sees the observation
    assert (s["reward"], s["turns"], s["tool_calls"], s["tool_errors"], s["stop_reason"]) == (1.0, 2, 1, 0, "answered")


def test_a_refused_call_is_an_observation_and_counted(monkeypatch):
    s, _ = _run(monkeypatch, ["47*=", "Answer:3901<eos>"])
    assert _spans(s) == [("47*=", 1), (";", 0), ("Answer:3901<eos>", 1)]
    assert (s["reward"], s["tool_calls"], s["tool_errors"]) == (1.0, 1, 1)


def test_the_turn_cap_truncates_after_a_call(monkeypatch):
    s, _ = _run(monkeypatch, ["1*1=", "2*2=", "3*3="], max_turns=3)
    assert _spans(s)[-1] == ("3*3=", 1) and s["stop_reason"] == "turn_cap" and s["tool_calls"] == 2
    assert s["reward"] == 0.0 and s["turns"] == 3


def test_the_length_cap_counts_tool_tokens(monkeypatch):
    # inside the observation: "3901;" cut to "39"
    s, _ = _run(monkeypatch, ["47*83="], max_new=8)
    assert _spans(s) == [("47*83=", 1), ("39", 0)] and s["stop_reason"] == "length_cap"
    # the call is the budget's last token: no room for any observation
    s, _ = _run(monkeypatch, ["47*83="], max_new=6)
    assert _spans(s) == [("47*83=", 1)] and s["stop_reason"] == "length_cap" and s["tool_calls"] == 1
    # the budget ends inside a model turn, after an observation
    s, _ = _run(monkeypatch, ["47*83=", "Answer:3901<eos>"], max_new=13)
    assert _spans(s) == [("47*83=", 1), ("3901;", 0), ("Answer:3", 1)]  # Answer: is one token
    assert s["stop_reason"] == "length_cap" and s["reward"] == 0.0 and len(s["response_ids"]) == 13


def test_without_the_tool_there_is_one_turn_and_no_span(monkeypatch):
    s, prefixes = _run(monkeypatch, ["47*83=3901;Answer:3901<eos>"], tool=False)
    assert s["loss_mask"] == [1] * len(s["response_ids"]) and s["tool_calls"] == 0 and s["turns"] == 1
    assert s["reward"] == 1.0 and len(prefixes) == 1


def test_the_tiny_models_log_probs_hold_across_turns():
    """Sampled with the tool by the tiny model (untrained: about 3 responses in 4 hold an '=', a call):
    every model token's behaviour log-prob is the model's own, recomputed in one forward over prompt +
    the whole response (earlier turns and the tool's output in context); tool tokens are 0.0, mask 0."""
    model = build_policy(ModelConfig(), TOK.vocab_size, TOK.pad_id, TOK.bos_id, TOK.eos_id, seed=0).eval()
    cfg = task_calc.AgentSampling(max_turns=3, max_new_tokens=24)
    problems = [task_calc.train_problem(i, 9) for i in range(6)]
    with torch.no_grad():
        samples = task_calc.sample_with_tool(model, problems, 2, cfg, task_calc.request_generator(0, "test"))
        lp, _ = response_log_probs(
            model, [s["prompt_ids"] for s in samples], [s["response_ids"] for s in samples], 1.0, TOK.pad_id
        )
    calls = multi_turn = 0
    for i, s in enumerate(samples):
        mask = torch.tensor(s["loss_mask"], dtype=torch.bool)
        behaviour = torch.tensor(s["behavior_log_probs"])
        n = len(s["response_ids"])
        assert torch.allclose(behaviour[mask], lp[i, :n][mask], atol=2e-5)
        assert (behaviour[~mask] == 0.0).all()
        calls += s["tool_calls"]
        spans = _spans(s)
        multi_turn += len(spans) > 2  # a model turn after an observation
        if len(spans) > 1:  # the first observation is the tool's answer to the first turn (or its cut)
            (turn, m1), (observation, m0) = spans[:2]
            assert (m1, m0) == (1, 0) and turn.endswith("=")
            assert task_calc.tool_observation(turn[:-1]).startswith(observation)
    assert calls >= 4 and multi_turn >= 2, (calls, multi_turn)
