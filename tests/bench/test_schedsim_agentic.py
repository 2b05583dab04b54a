"""bench/schedsim/agentic.py: multi-turn trajectories with tool calls in the schedule simulator (issue 44
item 7), run through the real driver loops and the real GroupStream."""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
pytest.importorskip("slime.rollout.sglang_rollout", reason="slime is not importable (SLIME_PATH)")

import schedule_sim as sim  # noqa: E402
from support.schedsim_small import small  # noqa: E402
from schedsim import agentic  # noqa: E402
from schedsim.agentic import AgentWorkload  # noqa: E402

logging.getLogger("epic_slime").setLevel(logging.WARNING)


def collecting(monkeypatch) -> list:
    """Every group the agentic stand-in returned (the objects the driver then trains or drops)."""
    seen, real = [], agentic.generate_agentic_group

    async def spy(s, group):
        out = await real(s, group)
        seen.append(out)
        return out

    monkeypatch.setattr(agentic, "generate_agentic_group", spy)
    return seen


@pytest.mark.parametrize(
    "schedule, push",
    [("async K=2", "abort"), ("async K=4", "in_place"), ("async K=2", "retract"), ("sync colocated", "abort")],
)
def test_one_turn_without_tools_is_the_single_turn_simulator(schedule, push):
    """One turn, no tool tokens, latency 0: the agentic stand-in's run is the single-turn stand-in's,
    field for field (times, staleness, aborts, re-prefilled tokens, every group's record)."""
    p = sim.split_preset(small(), 16, 8, push)
    single = sim.simulate(p, schedule, 5)
    one_turn = AgentWorkload(turns=1, tool_output_tokens=0, tool_latency_median_s=0.0, tool_latency_sigma=0.0)
    multi = sim.simulate(dataclasses.replace(p, agent=one_turn), schedule, 5)
    assert multi.pop("agent_stats")["tool_calls"] == 0 and single.pop("agent_stats") is None
    assert multi == single
    if push == "abort" and schedule != "sync colocated":
        assert single["abort_resubmits"] > 0  # the resubmission path was exercised


def hand_preset(prefix_cache) -> sim.Preset:
    """One prompt, one sample, one engine of 1 GPU: prompt 50 tokens, 300 model tokens in 3 turns of 100,
    50 tool tokens per call, decode 0.01 s per token (batch 1), prefill 100 tokens/s, tool latency 2 s fixed."""
    return sim.Preset(
        name="hand",
        rollout_batch_size=1,
        n_samples=1,
        update_depth=1,
        oversample_ratio=0.0,
        max_response_len=10_000,
        prompt_len=50,
        fixed_length=300,
        total_gpus=2,
        train_gpus_split=1,
        gpus_per_engine=1,
        c_tok=0.01,
        prefill_tok_s=100.0,
        kv_capacity_tokens=1e9,
        push_s_split=0.0,
        push_s_colocated=0.0,
        offload_s=0.0,
        train_s_fixed=1.0,
        dt=0.5,
        poll_s=0.5,
        paper_rollouts=0,
        agent=AgentWorkload(
            turns=3, tool_output_tokens=50, tool_latency_median_s=2.0, tool_latency_sigma=0.0, prefix_cache=prefix_cache
        ),
    ).derived()


@pytest.mark.parametrize(
    "prefix_cache, gen_s, reprefilled",
    [
        # turn 1: prefill 50 (0.5 s) + 100 tokens (1 s); tool 2 s; turn 2: prefill the 50 tool tokens (0.5 s)
        # + 1 s; tool 2 s; turn 3 as turn 2: 1.5 + 2 + 1.5 + 2 + 1.5
        ("hit", 8.5, 0),
        # turn 2 prefills 50 + 100 + 50 (2 s) + 1 s; turn 3 prefills 50 + 100 + 50 + 100 + 50 (3.5 s) + 1 s:
        # 1.5 + 2 + 3 + 2 + 4.5; re-prefilled: 150 + 300
        ("miss", 13.0, 450),
    ],
)
def test_a_fixed_tool_latency_gives_the_hand_computed_wall_time(monkeypatch, prefix_cache, gen_s, reprefilled):
    seen = collecting(monkeypatch)
    r = sim.simulate(hand_preset(prefix_cache), "sync split", 3)
    for batch in r["batches"].values():
        assert batch["end"] - batch["start"] == pytest.approx(gen_s, abs=1e-9)
    assert r["reprefill_tokens"] == pytest.approx(3 * reprefilled)
    (sample,) = seen[0]
    st = sample.metadata["sim_agent"]
    assert (st["tool_calls"], st["tool_s"], st["tool_tokens"], st["model_tokens"]) == (2, 4.0, 100, 300)
    assert sample.response_length == 400 and sample.status == sample.Status.COMPLETED
    assert [c["tokens"] for c in st["calls"]] == [100, 100, 100]
    # the engine is free during a tool call: each turn's call is submitted 2 s after the previous one ended
    ends = [c["end_t"] for c in st["calls"]]
    assert [c["submit_t"] - e for c, e in zip(st["calls"][1:], ends)] == pytest.approx([2.0, 2.0])
    assert r["agent_stats"]["tool_s"] == 4.0 and r["agent_stats"]["tool_tokens"] == 100


def test_the_engine_prefills_what_the_prefix_cache_misses(monkeypatch):
    """The engine's own prefill counter over one trajectory: 150 tokens with the prefix cached, 600 without."""
    from schedsim import engine

    counts = {}
    real = engine.Sim.__init__

    def keep(self, p, colocated):
        real(self, p, colocated)
        counts[p.agent.prefix_cache] = self

    monkeypatch.setattr(engine.Sim, "__init__", keep)
    for cache in ("hit", "miss", 0.5):
        sim.simulate(hand_preset(cache), "sync split", 1)
    assert [counts[c].engines[0].prefilled for c in ("hit", "miss", 0.5)] == pytest.approx([150, 600, 375])


def test_trajectories_spanning_pushes_carry_the_versions_their_tokens_came_from(monkeypatch):
    """Long tool calls at K = 2, abort: pushes land between turns and during them. Every call's first
    token carries the version of the pushes finished before it (from the push log), the versions along a
    trajectory never decrease, and the stream counts staleness from the oldest model token: its
    oldest_weight_version is the oldest call's, and the gate's lag of every trained group is the true one."""
    seen = collecting(monkeypatch)
    p = sim.split_preset(small(agent=AgentWorkload(turns=4, tool_latency_median_s=30.0)), 8, 4, "abort")
    r = sim.simulate(p, "async K=2", 6)
    push_ends = [t1 for _t0, t1 in r["pushes"]]
    spanning = between_turns = 0
    for group in seen:
        for s in group:
            if s.status not in (s.Status.COMPLETED, s.Status.TRUNCATED):
                continue
            calls = [c for c in s.metadata["sim_agent"]["calls"] if c["tokens"]]
            for c in calls:
                assert c["first_version"] == sum(t <= c["first_t"] for t in push_ends)
                assert c["version"] == c["first_version"]  # abort: a call never runs across a push
            firsts = [c["first_version"] for c in calls]
            assert firsts == sorted(firsts)
            assert s.metadata["oldest_weight_version"] == min(firsts) == s.metadata["sim_oldest_version"]
            spanning += len(set(firsts)) > 1
            between_turns += any(
                a["end_t"] < t <= b["submit_t"]
                for a, b in zip(calls, calls[1:])
                if a["turn"] != b["turn"]
                for t in push_ends
            )
    assert spanning > 0 and between_turns > 0
    trained = [g for g in r["groups"] if g["lag"] is not None]
    assert trained and all(g["lag"] == g["true_lag"] for g in trained)
    assert r["agent_stats"]["spanning_share"] > 0 and r["agent_stats"]["max_versions"] >= 2


def test_in_place_counts_from_the_submission_version_never_younger_than_the_truth(monkeypatch):
    """in place a call decodes across a push and reports the final version; the stream's oldest is the
    version known at submission, so the gate's lag is never below the true lag of the oldest model token."""
    p = sim.split_preset(small(agent=AgentWorkload(turns=3, tool_latency_median_s=10.0)), 8, 4, "in_place")
    r = sim.simulate(p, "async K=2", 6)
    trained = [g for g in r["groups"] if g["lag"] is not None]
    assert trained and all(g["lag"] >= g["true_lag"] >= 0 for g in trained)
    assert r["abort_resubmits"] == 0


@pytest.mark.parametrize("k, push", [(1, "abort"), (2, "abort"), (4, "abort"), (2, "in_place")])
def test_every_prompt_is_trained_once(k, push):
    """Each rollout trains a full batch of finished trajectories (none aborted or still generating), no
    group twice; a group is trained, dropped or still held by the stream at the end (at most what the
    budget lets run ahead), never two of these."""
    p = sim.split_preset(small(agent=AgentWorkload(turns=3, tool_latency_median_s=15.0)), 8, 4, push)
    rollouts = 6
    r = sim.simulate(p, f"async K={k}", rollouts)
    keys = [key for batch in r["trained_keys"].values() for key in batch]
    assert all(len(batch) == p.rollout_batch_size for batch in r["trained_keys"].values())
    assert len(keys) == len(set(keys)) == rollouts * p.rollout_batch_size
    assert r["trained_unfinished"] == 0
    if push == "abort" and k > 1:
        assert r["abort_resubmits"] > 0  # trajectories were cut by pushes and continued
    started = {g["key"] for g in r["groups"]}
    dropped = {g["key"] for g in r["groups"] if g["dropped"]}
    assert not dropped & set(keys) and set(keys) <= started
    held = started - set(keys) - dropped
    assert len(held) <= (k + 1) * p.rollout_batch_size


def test_bad_workloads_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="AgentWorkload.turns must be an integer >= 1, got 0"):
        AgentWorkload(turns=0)
    with pytest.raises(ValueError, match="tool_latency_median_s must be a finite number >= 0, got nan"):
        AgentWorkload(tool_latency_median_s=float("nan"))
    with pytest.raises(ValueError, match="tool_latency_sigma must be a finite number >= 0, got -1"):
        AgentWorkload(tool_latency_sigma=-1)
    with pytest.raises(ValueError, match="prefix_cache must be 'hit', 'miss' or a share in \\[0, 1\\], got 'warm'"):
        AgentWorkload(prefix_cache="warm")
    with pytest.raises(ValueError, match="got 1.5"):
        AgentWorkload(prefix_cache=1.5)


def test_turns_split_the_model_tokens_and_the_latency_is_lognormal():
    assert agentic.turn_targets(300, 3) == [100, 100, 100]
    assert agentic.turn_targets(10, 4) == [2, 2, 3, 3] and agentic.turn_targets(2, 4) == [1, 1]
    p = small(agent=AgentWorkload(tool_latency_median_s=5.0, tool_latency_sigma=1.0))
    from schedsim.engine import Sim

    s = Sim(p, False)
    draws = sorted(agentic.tool_latency(s) for _ in range(4000))
    median, p90 = draws[2000], draws[3600]
    assert median == pytest.approx(5.0, rel=0.06) and p90 / median == pytest.approx(3.60, rel=0.08)


def test_the_committed_price_is_the_presets():
    """bench/schedsim/agentic_frontier.json was made from the agentic preset as it stands: change the
    preset's workload or length and this fails until the file is made again (docs/results.md's table is
    generated from it)."""
    import json

    from schedsim import agentic_price

    made = json.loads(agentic_price.OUT.read_text())
    p = agentic_price.agentic_preset()
    assert made["workload"] == dataclasses.asdict(p.agent)
    assert (made["mean_model_tokens"], made["length_sigma"], made["max_response_len"]) == (
        p.mean_response_len,
        p.length_sigma,
        p.max_response_len,
    )
    assert made["batch"] == f"{p.rollout_batch_size}x{p.n_samples}" and made["source"] == p.source
    assert [e["k"] for e in made["frontier"]] == list(agentic_price.AGENTIC_KS)
    best = made["best_sync"]
    assert best["s_per_rollout"] == min(made["sync"].values()) == made["sync"][best["name"]]
    for e in made["frontier"]:  # every K's speedup divides the best synchronous setup by its own time
        assert e["row"]["ratio"] == pytest.approx(best["s_per_rollout"] / e["row"]["s"])
