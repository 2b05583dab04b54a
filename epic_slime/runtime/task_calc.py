"""The embedded runtime's agent task (issue 44 item 4): products of two-digit numbers, which the tiny
policy cannot compute itself but can get from the ``calc`` tool.

Prompt  : <bos>47*83=
Response: 47*83=    | 3901;    | Answer:3901<eos>
          model     | tool     | model
          (a call)  | (mask 0) |

The vocabulary is the runtime's 19 tokens, so a call needs no new token: a turn that ends with ``=``
is a call, its text (without the ``=``) is ``calc``'s input, and the result comes back as its digits
and ``;`` (a refused input as a bare ``;``). Those tokens join the response with loss mask 0 and a
behaviour log-prob of 0.0, a placeholder the trainer never reads (``trainer.loss_mask_rows``). A turn
that ends with <eos> ends the trajectory. The response-length cap counts tool tokens; past it or past
the turn cap the trajectory is truncated (reward 0, as every unfinished answer).

The reward is the runtime's exact verifier (``task.answer_reward``): 1 iff the response ends with
``Answer:<product><eos>``. Chance, a uniform guess over the products the task can ask for, is
``1 / len(distinct_answers())``; without the tool the model would have to multiply in its head.

Problems are a pure function of (seed, index); the held-out split is fixed by a hash of the prompt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random

from epic_slime.tools.calc import CalcError, calc

from .task import ANSWER, Problem, Tokenizer

NAME = "calc"
LOW, HIGH = 10, 99  # both factors
CALL_TOKEN = "="
EVAL_FRACTION = 0.1


def _problem(a: int, b: int) -> Problem:
    return Problem(prompt=f"{a}*{b}=", solution=f"{a}*{b}={a * b};{ANSWER}{a * b}", answer=a * b)


def is_heldout(a: int, b: int) -> bool:
    h = int.from_bytes(hashlib.sha256(f"{NAME}/{a}*{b}".encode()).digest()[:8], "big")
    return (h % 10_000) < EVAL_FRACTION * 10_000


def train_problem(index: int, seed: int) -> Problem:
    """The index-th training problem of a seed (never a held-out one)."""
    rng = random.Random(f"{NAME}/train/{seed}/{index}")
    while True:
        a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        if not is_heldout(a, b):
            return _problem(a, b)


def eval_problems(count: int) -> list[Problem]:
    """The first ``count`` held-out problems in a fixed (seed-independent) order."""
    pairs = [(a, b) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1) if is_heldout(a, b)]
    random.Random(f"{NAME}/heldout").shuffle(pairs)
    if count > len(pairs):
        raise ValueError(f"calc task: {count} held-out prompts asked, {len(pairs)} exist")
    return [_problem(a, b) for a, b in pairs[:count]]


def distinct_answers() -> set[int]:
    return {a * b for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1)}


def chance() -> float:
    """A uniform guess over the products the task can ask for."""
    return 1.0 / len(distinct_answers())


def tool_observation(call_text: str) -> str:
    """What the tool answers a call: the value and ``;``, or a bare ``;`` for a refused input (or a
    value the vocabulary cannot spell). Model text goes through ``calc``, never ``eval``."""
    try:
        value = calc(call_text)
    except CalcError:
        return ";"
    return f"{value};" if value.lstrip("-").isdigit() else ";"


def solution_segments(problem: Problem) -> list[tuple[str, int]]:
    """The warm start's target: (text, loss mask) segments, the tool's output with mask 0."""
    value = problem.answer
    a_times_b = problem.prompt[:-1]
    return [(f"{a_times_b}{CALL_TOKEN}", 1), (f"{value};", 0), (f"{ANSWER}{value}", 1)]


def warm_start_batch(problems) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """prompt ids, response ids (with <eos>) and loss masks of the solutions (tool output mask 0)."""
    tok = Tokenizer()
    prompts, responses, masks = [], [], []
    for p in problems:
        ids, mask = [], []
        for text, m in solution_segments(p):
            part = tok.encode(text)
            ids += part
            mask += [m] * len(part)
        prompts.append([tok.bos_id] + tok.encode(p.prompt))
        responses.append(ids + [tok.eos_id])
        masks.append(mask + [1])
    return prompts, responses, masks


def supervised_warm_start(model_cfg, *, steps: int, batch_size: int, lr: float, seed: int, on_step=None) -> dict:
    """The warm start that teaches the call format: cross-entropy on the model's tokens of correct
    trajectories; the tool's digits carry no loss, so it cannot teach the products. One function for
    ``agent_train`` and the runtime (``tasks.Task.supervised_warm_start``). on_step(step, loss)."""
    import torch

    from .model import build_policy, response_log_probs

    torch.manual_seed(seed)
    tok = Tokenizer()
    model = build_policy(model_cfg, tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(steps):
        problems = [train_problem(step * batch_size + j, seed) for j in range(batch_size)]
        prompts, responses, masks = warm_start_batch(problems)
        lp, valid = response_log_probs(model, prompts, responses, 1.0, tok.pad_id)
        weight = torch.zeros_like(lp)
        for i, m in enumerate(masks):
            weight[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
        loss = -(lp * weight * valid).sum() / weight.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if on_step is not None:
            on_step(step + 1, float(loss.detach()))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@dataclasses.dataclass(frozen=True)
class AgentSampling:
    tool: bool = True  # False: the same sampler with no tool (the no-tool baseline): '=' is a token
    max_turns: int = 3
    max_new_tokens: int = 24  # the whole response, tool tokens included
    temperature: float = 1.0
    top_p: float = 1.0


def new_trajectory(problem: Problem, tok: Tokenizer) -> dict:
    """A trajectory before its first turn. ``token_versions``: the weight version of each model token,
    None on tool tokens (a trajectory whose turns span pushes holds several versions)."""
    return {
        "problem": problem,
        "prompt_ids": [tok.bos_id] + tok.encode(problem.prompt),
        "response_ids": [],
        "behavior_log_probs": [],
        "sampling_log_probs": [],
        "loss_mask": [],
        "token_versions": [],
        "turns": 0,
        "tool_calls": 0,
        "tool_errors": 0,
        "stop_reason": None,
    }


def sample(*args, **kwargs):
    """The runtime's sampler (``model.sample``), imported when first used: the task registry imports
    this module, and parsing a config must not import torch."""
    from .model import sample as model_sample

    return model_sample(*args, **kwargs)


def advance_turn(model, states: list[dict], cfg: AgentSampling, generator, version: int = 0) -> None:
    """One model turn for every unfinished trajectory of ``states`` (sampled by ``model`` at weight
    ``version``), then each turn's call and its observation. A trajectory stops (``stop_reason``) when
    it answers, at the turn cap or at the length cap; the others wait for their next turn."""
    tok = Tokenizer()
    call_id = tok.token_to_id[CALL_TOKEN]
    active = [s for s in states if s["stop_reason"] is None]
    if not active:
        return
    rooms = [cfg.max_new_tokens - len(s["response_ids"]) for s in active]
    results = sample(
        model,
        [s["prompt_ids"] + s["response_ids"] for s in active],
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_new_tokens=max(rooms),
        eos_id=tok.eos_id,
        pad_id=tok.pad_id,
        generator=generator,
        stop_ids=(call_id,) if cfg.tool else (),
    )
    for s, room, r in zip(active, rooms, results):
        ids = r["response_ids"][:room]
        s["response_ids"] += ids
        s["behavior_log_probs"] += r["behavior_log_probs"][:room]
        s["sampling_log_probs"] += r["sampling_log_probs"][:room]
        s["loss_mask"] += [1] * len(ids)
        s["token_versions"] += [version] * len(ids)
        s["turns"] += 1
        if not ids or ids[-1] == tok.eos_id:
            s["stop_reason"] = "answered"
        elif not cfg.tool or ids[-1] != call_id:  # ('=' stops a turn: a last '=' is the call's)
            s["stop_reason"] = "length_cap"
        elif s["turns"] >= cfg.max_turns:
            s["stop_reason"] = "turn_cap"
        else:
            _run_call(s, ids, tok, cfg)


def finish_trajectory(s: dict) -> dict:
    """A stopped trajectory scored: reward (the exact verifier), label, and the runtime's status."""
    from .task import answer_reward

    assert s["stop_reason"] is not None, "an unfinished trajectory is never scored"
    problem = s.pop("problem")
    s["reward"] = answer_reward(s["response_ids"], problem.answer, Tokenizer())
    s["label"] = problem.answer
    s["status"] = "completed" if s["stop_reason"] == "answered" else "truncated"
    return s


def sample_with_tool(model, problems: list[Problem], n: int, cfg: AgentSampling, generator) -> list[dict]:
    """``n`` trajectories per problem, every turn on the same weights. Per sample: prompt_ids,
    response_ids, behavior_log_probs (0.0 on tool tokens), loss_mask (0 on tool tokens), reward,
    turns, tool_calls, tool_errors, stop_reason."""
    tok = Tokenizer()
    states = [new_trajectory(p, tok) for p in problems for _ in range(n)]
    while any(s["stop_reason"] is None for s in states):
        advance_turn(model, states, cfg, generator)
    return [finish_trajectory(s) for s in states]


def _run_call(s: dict, turn_ids: list[int], tok: Tokenizer, cfg: AgentSampling) -> None:
    """Run the turn's call and append the observation (mask 0); truncate at the length cap."""
    call_text = tok.decode(turn_ids[:-1], stop_at_eos=False)
    observation = tool_observation(call_text)
    s["tool_calls"] += 1
    s["tool_errors"] += observation == ";"
    obs_ids = tok.encode(observation)
    room = cfg.max_new_tokens - len(s["response_ids"])
    kept = obs_ids[:room]
    s["response_ids"] += kept
    s["behavior_log_probs"] += [0.0] * len(kept)
    s["sampling_log_probs"] += [0.0] * len(kept)
    s["loss_mask"] += [0] * len(kept)
    s["token_versions"] += [None] * len(kept)
    if len(kept) < len(obs_ids) or len(s["response_ids"]) >= cfg.max_new_tokens:
        s["stop_reason"] = "length_cap"


def request_generator(seed: int, tag: str):
    """A torch.Generator for (seed, tag)."""
    from .seeding import generator_for

    return generator_for(f"{NAME}/{tag}/{seed}")
