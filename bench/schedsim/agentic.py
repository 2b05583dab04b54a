"""Multi-turn, tool-using trajectories in the simulator (issue 44 item 7): the retool shape of
``epic_slime.slime.agent_generate``, on the simulated engines and clock.

A trajectory is ``turns`` generation calls with a tool call between two calls. Its model tokens (drawn
as the single-turn simulator draws a response: lognormal, capped) are split evenly over its turns
(assumed). After each turn but the last a tool runs for a latency drawn per call,
``median x exp(sigma x N(0, 1))`` (lognormal; sigma 0: always the median). Its
``tool_output_tokens`` join the response (they count toward the response-length cap and are trained
over, with loss mask 0 as ``Sample.append_response_tokens(..., trainable=False)`` gives them) but are
never generated: the engine prefills them with the next turn.

The engine between turns. As in slime's retool example (and the project's agent_generate) every turn is
a new ``/generate`` request: the request leaves the batch when its turn ends, and the engine serves
others while the tool runs. Its KV leaves the running batch (it is not counted against the KV capacity
during the tool call); what the next turn prefills is the model's choice, ``prefix_cache``:
- ``"hit"`` (default): SGLang's radix cache still holds the trajectory's prefix, so the next turn
  prefills only the tool's tokens (the cached KV is evictable: the simulator assumes it is not evicted);
- ``"miss"``: the cache was evicted; the next turn prefills the whole context again (counted as
  re-prefilled tokens).
A number in [0, 1] is the share of the prefix that hits (an expected value, no draw).

A weight push. ``abort``: the call in progress returns ABORTED with its finished turns and its partial
turn; the stream resubmits the group and the trajectory continues that turn on the new weights (the KV
was freed: the whole context is prefilled again, as for a single-turn resubmission). A trajectory in a
tool call at the push is not touched: its next turn starts on the new weights. ``in_place`` /
``retract``: the call decodes on across the push. So a trajectory spans versions: every call appends
the version SGLang reports for it (slime's convention), and the stream counts staleness from the oldest
model token. The simulator keeps each call's true first-token version and time beside it
(``metadata["sim_agent"]["calls"]``) for the report and the tests.
"""

from __future__ import annotations

import dataclasses
import math
import random

PREFIX_CACHE = {"hit": 1.0, "miss": 0.0}


@dataclasses.dataclass(frozen=True)
class AgentWorkload:
    """turns: generation calls per trajectory (a tool call between two); tool_output_tokens: tokens each
    tool call appends; tool_latency_median_s / tool_latency_sigma: the lognormal tool latency per call;
    prefix_cache: "hit", "miss" or the share of the prefix the radix cache holds at the next turn."""

    turns: int = 4
    tool_output_tokens: int = 200
    tool_latency_median_s: float = 2.0
    tool_latency_sigma: float = 1.0
    prefix_cache: str | float = "hit"

    def __post_init__(self):
        if not (isinstance(self.turns, int) and self.turns >= 1):
            raise ValueError(f"AgentWorkload.turns must be an integer >= 1, got {self.turns!r}")
        if not (isinstance(self.tool_output_tokens, int) and self.tool_output_tokens >= 0):
            raise ValueError(
                f"AgentWorkload.tool_output_tokens must be an integer >= 0, got {self.tool_output_tokens!r}"
            )
        for name in ("tool_latency_median_s", "tool_latency_sigma"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"AgentWorkload.{name} must be a finite number >= 0, got {value!r}")
        self.cache_hit()  # validates prefix_cache

    def cache_hit(self) -> float:
        value = PREFIX_CACHE.get(self.prefix_cache, self.prefix_cache)
        if isinstance(value, str) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise ValueError(
                f"AgentWorkload.prefix_cache must be 'hit', 'miss' or a share in [0, 1], got {self.prefix_cache!r}"
            )
        return float(value)

    def text(self) -> str:
        return (
            f"{self.turns} turns, {self.tool_output_tokens} tool tokens per call, tool latency lognormal median "
            f"{self.tool_latency_median_s:g} s sigma {self.tool_latency_sigma:g}, prefix cache {self.prefix_cache}"
        )


def turn_targets(total: int, turns: int) -> list[int]:
    """``total`` model tokens over at most ``turns`` turns of at least one token, as evenly as integers
    allow (the last turns take the remainder)."""
    n = max(1, min(turns, total))
    base, extra = divmod(total, n)
    return [base + (1 if i >= n - extra else 0) for i in range(n)]


def tool_latency(sim) -> float:
    """One tool call's latency. Its own random stream, so that the response lengths are drawn as in the
    single-turn simulator."""
    a = sim.p.agent
    rng = getattr(sim, "tool_rng", None)
    if rng is None:
        rng = sim.tool_rng = random.Random(sim.p.seed + 104_729)
    if a.tool_latency_sigma == 0:
        return float(a.tool_latency_median_s)
    return a.tool_latency_median_s * math.exp(a.tool_latency_sigma * rng.gauss(0.0, 1.0))


async def generate_agentic_group(sim, group):
    """slime's ``generate_and_rm_group`` with a multi-turn generate function: each unfinished trajectory
    of the group runs its turns; the group returns when every trajectory finished or was aborted.

    Each trajectory is driven by callbacks on its engine calls and tool timers (no task per trajectory),
    and the group awaits the trajectories in order: with one turn the events are the single-turn
    stand-in's, in its order (``test_one_turn_without_tools_is_the_single_turn_simulator``)."""
    from slime.utils.types import Sample

    pending = [s for s in group if s.status not in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)]
    finished = []
    for s in pending:
        done = sim.loop.create_future()
        _call(sim, s, Sample, done)
        finished.append(done)
    for done in finished:
        await done
    return group


def _state(sim, s) -> dict:
    m = s.metadata
    if "sim_agent" not in m:
        m["sim_agent"] = dict(
            targets=turn_targets(m["sim_target"], sim.p.agent.turns),
            turn=0,
            turn_done=0,  # model tokens of the current turn so far
            model_tokens=0,
            tool_tokens=0,
            tool_calls=0,
            tool_s=0.0,
            kv="prompt",  # what the next call prefills: "prompt", "turn" (after a tool call), "freed" (after an abort)
            calls=[],
        )
    return m["sim_agent"]


def _submission(sim, s, st: dict) -> dict:
    """The next engine call's context, prefill and cached prefix, by what the engine still holds."""
    p = sim.p
    ctx = p.prompt_len + s.response_length
    if st["kv"] == "turn":  # a new request after a tool call: the radix cache holds a share of the prefix
        prefix = ctx - st["last_tool_tokens"]
        hit = p.agent.cache_hit()
        missed = (1.0 - hit) * prefix
        return dict(ctx=ctx, prefill=st["last_tool_tokens"] + missed, partial=missed, cached=hit * prefix)
    # the first call (the prompt), or a resubmission after an abort (its KV freed: prompt + response again)
    return dict(ctx=ctx, prefill=None, partial=s.response_length, cached=None)


def _call(sim, s, Sample, done) -> None:
    """Submits the trajectory's next engine call (the rest of its current turn)."""
    st = _state(sim, s)
    cap = sim.p.max_response_len
    want = st["targets"][st["turn"]] - st["turn_done"]
    sub = _submission(sim, s, st)
    engine = min(sim.engines, key=lambda e: e.load())
    record = dict(turn=st["turn"], submit_t=sim.now())
    fut = engine.submit(
        sub["ctx"],
        min(want, cap - s.response_length),
        cap - s.response_length,
        partial=sub["partial"],
        prefill=sub["prefill"],
        cached=sub["cached"],
        record=record,
    )
    fut.add_done_callback(lambda f: _guarded(done, _answered, sim, s, Sample, done, record, f.result()))


def _guarded(done, fn, *args) -> None:
    """A callback's failure fails the trajectory's future (the group raises it), never the loop's log."""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - handed to the awaiting group
        if not done.done():
            done.set_exception(exc)


def _finish(s, status, done) -> None:
    s.status = status
    if not done.done():
        done.set_result(None)


def _answered(sim, s, Sample, done, record: dict, result) -> None:
    """An engine call returned: its tokens join the response; then the trajectory ends, or a tool runs."""
    p, st = sim.p, _state(sim, s)
    tokens, version, aborted, oldest = result
    s.response_length += tokens
    st["turn_done"] += tokens
    st["model_tokens"] += tokens
    s.tokens = range(max(1, p.prompt_len) + s.response_length)
    s.weight_versions.append(str(version))  # SGLang's weight_version of this call, at response time
    if tokens and oldest is not None:
        s.metadata["sim_oldest_version"] = min(oldest, s.metadata.get("sim_oldest_version", oldest))
    record.update(version=version, tokens=tokens, aborted=aborted, end_t=sim.now())
    st["calls"].append(record)
    if aborted:
        st["kv"] = "freed"
        return _finish(s, Sample.Status.ABORTED, done)
    if s.response_length >= p.max_response_len:
        return _finish(s, Sample.Status.TRUNCATED, done)
    if st["turn"] + 1 >= len(st["targets"]):
        return _finish(s, Sample.Status.COMPLETED, done)
    # the turn ended in a tool call: the request left the engine; the tool runs on its own clock
    latency = tool_latency(sim)
    st["tool_calls"] += 1
    st["tool_s"] += latency
    sim.loop.call_later(latency, _guarded, done, _tool_returned, sim, s, Sample, done)


def _tool_returned(sim, s, Sample, done) -> None:
    """The tool's output joins the response (loss mask 0: trained over, never generated); next turn."""
    if done.done():  # the group was cancelled (the run ended)
        return
    p, st = sim.p, _state(sim, s)
    appended = min(p.agent.tool_output_tokens, p.max_response_len - s.response_length)
    s.response_length += appended
    st["tool_tokens"] += appended
    st["last_tool_tokens"] = appended
    s.tokens = range(max(1, p.prompt_len) + s.response_length)
    st["turn"] += 1
    st["turn_done"] = 0
    st["kv"] = "turn"
    if s.response_length >= p.max_response_len:  # the tool's output filled the response-length cap
        return _finish(s, Sample.Status.TRUNCATED, done)
    _call(sim, s, Sample, done)
