"""The agent task's rollouts in the runtime (``--task-name calc``): one model turn per request.

A rollout worker runs ONE turn (and its tool call) for every trajectory of a request, then hands the
groups back. A group whose trajectories have all stopped is finished; the others go back to the pool
(``RolloutPool.continuing``) and their next turn is requested like any other work, so it runs on the
weights the worker holds then. Weights pushed between two turns therefore land inside a trajectory:
it spans versions. Each model token carries the version that generated it (``token_versions``, None
on tool tokens), and a group's version is its OLDEST model token's: the staleness rule of
``docs/runtime.md`` (lag = trainer version - oldest model token version), the same version the
admission budget charged when the group's first turn was requested.

Evaluation runs whole trajectories on one version (``evaluate``): mean@k with the tool allowed
(``agent_eval_tool``) and the tool's counts per response.
"""

from __future__ import annotations

import statistics

from . import task_calc
from .batches import Group
from .seeding import request_generator
from .task import Problem, Tokenizer


def oldest_model_version(samples: list[dict]) -> int | None:
    """The version of the oldest model token of ``samples`` (None: no model token)."""
    versions = [v for s in samples for v, m in zip(s["token_versions"], s["loss_mask"]) if m]
    return min(versions) if versions else None


def generate_turn(
    engine,
    requests: list,
    *,
    n_samples: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int,
    max_turns: int,
    topk: int = 0,
) -> list[Group]:
    """One turn of every trajectory in ``requests``: (group_id, Problem) pairs start new groups,
    unfinished ``Group`` objects continue. Returns every group, ``unfinished`` set on those that go on."""
    if topk:
        raise ValueError(f"the agent task's sampler records no Top-K sets (topk={topk})")
    if not requests:
        return []
    tok = Tokenizer()
    groups = []
    for item in requests:
        if isinstance(item, Group):
            groups.append(item)
        else:
            group_id, problem = item
            assert isinstance(problem, Problem), item
            samples = [task_calc.new_trajectory(problem, tok) for _ in range(n_samples)]
            groups.append(Group(group_id=group_id, version=engine.version, samples=samples, unfinished=True))
    cfg = task_calc.AgentSampling(
        tool=True, max_turns=max_turns, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p
    )
    # seeded by (run seed, first group, its turn): a turn's samples do not depend on the worker
    first = groups[0]
    turn = max(s["turns"] for s in first.samples)
    gen = request_generator(seed, f"agent/turn{turn}", first.group_id)
    states = [s for g in groups for s in g.samples]
    task_calc.advance_turn(engine.model, states, cfg, gen, version=engine.version)
    for g in groups:
        if any(s["stop_reason"] is None for s in g.samples):
            continue
        oldest = oldest_model_version(g.samples)
        g.version = g.version if oldest is None else oldest
        for j, s in enumerate(g.samples):
            task_calc.finish_trajectory(s)
            s.update(group_id=g.group_id, sample_idx=j, version=g.version)
        g.unfinished = False
    return groups


def tool_counts(sample: dict) -> dict:
    """One trajectory's counts, as its eval record carries them (``EvalRecord.tool_calls`` ...)."""
    return {name: int(sample[name]) for name in ("tool_calls", "tool_errors", "turns")}


def tool_stats(samples: list[dict]) -> dict:
    """The tool's counts per response (``eval/heldout/*`` and ``rollout/*`` metrics)."""
    return {
        "tool_calls_per_response": statistics.fmean(s["tool_calls"] for s in samples),
        "tool_errors_per_response": statistics.fmean(s["tool_errors"] for s in samples),
        "turns_per_response": statistics.fmean(s["turns"] for s in samples),
    }


def evaluate(
    engine,
    problems: list[Problem],
    *,
    k: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    seed: int,
    max_turns: int,
    tool: bool,
) -> tuple[list[list[bool]], dict, list[list[dict]]]:
    """correct[prompt][sample] for k whole trajectories per held-out prompt (seeded by version), the
    tool's counts per response over all of them, and each trajectory's counts [prompt][sample]."""
    cfg = task_calc.AgentSampling(
        tool=tool, max_turns=max_turns, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p
    )
    gen = request_generator(seed, "agent/eval", engine.version)
    samples = task_calc.sample_with_tool(engine.model, problems, k, cfg, gen)
    correct = [[samples[i * k + j]["reward"] == 1.0 for j in range(k)] for i in range(len(problems))]
    counts = [[tool_counts(samples[i * k + j]) for j in range(k)] for i in range(len(problems))]
    return correct, tool_stats(samples), counts
