"""``--custom-generate-function-path epic_slime.slime.agent_generate.generate``: a tool-using,
multi-turn generate function with slime's signature and retool's shape (issue 44).

Per trajectory: one SGLang ``/generate`` call per turn, stopped right after a tool call (the tools'
closing tags are stop strings, kept in the text); the call runs (``epic_slime.tools.agent``) and its
observation joins the response through slime's ``Sample.append_response_tokens(..., trainable=False)``:
loss mask 0, rollout log-prob 0.0 (a placeholder no loss reads; tests/losses/test_tool_spans.py).
Caps: ``AgentConfig.max_turns`` engine calls, and the run's ``max_new_tokens`` (slime's
``--rollout-max-response-len``) for the whole response, tool tokens included.

Across weight pushes: each call's tokens carry the version SGLang reported for that call (slime appends
it to ``Sample.weight_versions``; ``Sample.metadata["agent"]["spans"]`` keeps it per span), so the
oldest model token's version is what the stream's staleness reads. A push that aborts a turn
(``--weight-push-mode abort``) leaves the sample ABORTED with its finished turns and the partial turn;
the stream resubmits it and this function continues that turn on the new weights (nothing is
regenerated; a tool already run is not run again). R3 routing rows recorded by earlier calls are kept
(SGLang's answer to a later call recomputes the whole sequence's rows on the weights of that call).

Not supported: the Top-K modes (their per-token top-k rows are recorded by
``epic_slime.slime.generate`` for single-turn generation only), refused with one line; multimodal prompts.
Build another configuration with ``make_generate(AgentConfig(...), registry_factory)``. slime is imported
lazily: this module runs inside slime's RolloutManager actor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epic_slime.tools.agent import (
    STOP_ANSWERED,
    STOP_LENGTH_CAP,
    STOP_TURN_CAP,
    AgentConfig,
    ToolRegistry,
    TrajectoryLog,
)

URL_TEMPLATE = "http://{ip}:{port}/generate"


def _refuse_topk(args: Any) -> None:
    from epic_slime.slime.generate import topk_for_args

    if topk_for_args(args) is not None:
        raise ValueError(
            f"--policy-loss {args.policy_loss} needs Top-K rows per token, which the agent generate function "
            "does not record: use a non-Top-K mode with epic_slime.slime.agent_generate"
        )


def _version(sample: Any, calls_before: int):
    from epic_slime.slime.stream.gate import parse_weight_version

    if len(sample.weight_versions) > calls_before:
        return parse_weight_version(sample.weight_versions[-1])
    return None


def _keep_earlier_routing(sample: Any, before) -> None:
    """slime replaced the rows by the last call's whole-sequence rows: put the earlier ones back."""
    from epic_slime.slime.routing import _merge

    if before is not None and sample.rollout_routed_experts is not None:
        sample.rollout_routed_experts = _merge(before, sample.rollout_routed_experts)


async def run_agent(
    args: Any,
    sample: Any,
    sampling_params: dict,
    registry: ToolRegistry,
    *,
    tokenizer: Any = None,
    post: Callable | None = None,
) -> Any:
    """The turn loop on one sample (``tokenizer`` / ``post``: slime's by default)."""
    from slime.utils.types import Sample

    _refuse_topk(args)
    if sample.status not in (Sample.Status.PENDING, Sample.Status.ABORTED):
        raise ValueError(f"agent generate: sample {sample.index} has status {sample.status}, expected PENDING/ABORTED")
    if sample.multimodal_inputs and any(v is not None for v in sample.multimodal_inputs.values()):
        raise ValueError("agent generate: text prompts only")
    if tokenizer is None:
        from slime.rollout import sglang_rollout

        tokenizer = sglang_rollout.GenerateState(args).tokenizer
    if post is None:
        from slime.utils.http_utils import post
    if not sample.tokens:
        sample.tokens = tokenizer.encode(sample.prompt, add_special_tokens=False)
    log = TrajectoryLog.of(sample.metadata)
    cap = int(sampling_params["max_new_tokens"])
    url = URL_TEMPLATE.format(ip=args.sglang_router_ip, port=args.sglang_router_port)
    r3 = bool(getattr(args, "use_rollout_routing_replay", False))
    while True:
        room = cap - sample.response_length
        if room <= 0:
            if log.turn_open:  # a turn aborted on the budget's last token ends here
                log.turn_open = False
                log.turns += 1
            log.stop_reason = STOP_LENGTH_CAP
            sample.status = Sample.Status.TRUNCATED
            break
        if not log.turn_open:
            if log.turns >= registry.config.max_turns:
                log.stop_reason = STOP_TURN_CAP
                sample.status = Sample.Status.TRUNCATED
                break
            log.turn_start_chars = len(sample.response)
        params = dict(sampling_params, max_new_tokens=room, no_stop_trim=True)
        params["stop"] = list(params.get("stop") or []) + registry.stop_strings()
        payload = {"input_ids": list(sample.tokens), "sampling_params": params, "return_logprob": True}
        if r3:
            payload["return_routed_experts"] = True
        routing_before = sample.rollout_routed_experts
        output = await post(url, payload)
        calls_before = len(sample.weight_versions)
        from epic_slime.slime.generate import parse_generated_tokens

        meta = output["meta_info"]
        tokens, log_probs = parse_generated_tokens(meta)
        sample.append_response_tokens(
            args, tokens=tokens, log_probs=log_probs, trainable=True, meta_info=meta, text=output.get("text", "")
        )
        _keep_earlier_routing(sample, routing_before)
        log.add_model_tokens(_version(sample, calls_before), len(tokens))
        finish = meta["finish_reason"]["type"]
        if finish == "abort":  # a push: the stream resubmits, and the turn continues on the new weights
            log.turn_open = True
            log.save(sample.metadata)
            return sample
        log.turn_open = False
        log.turns += 1
        if finish == "length":
            log.stop_reason = STOP_LENGTH_CAP
            break
        call = registry.find_call(sample.response[log.turn_start_chars :])
        if call is None:
            log.stop_reason = STOP_ANSWERED
            break
        log.tool_calls += 1
        observation, error = await registry.run(*call)
        if error is not None:
            log.tool_errors[error] = log.tool_errors.get(error, 0) + 1
        obs_tokens = tokenizer.encode(registry.observation(observation), add_special_tokens=False)
        room = cap - sample.response_length
        cut = len(obs_tokens) > room
        obs_tokens = obs_tokens[:room]
        if obs_tokens:
            sample.append_response_tokens(args, tokens=obs_tokens, trainable=False, text=tokenizer.decode(obs_tokens))
            log.add_tool_tokens(len(obs_tokens))
        if cut:
            log.stop_reason = STOP_LENGTH_CAP
            sample.status = Sample.Status.TRUNCATED
            break
    log.save(sample.metadata)
    return sample


def make_generate(config: AgentConfig | None = None, registry_factory: Callable[[], ToolRegistry] | None = None):
    """A generate function (slime's signature) for ``config``; ``registry_factory`` adds your tools."""
    make_registry = registry_factory or (lambda: ToolRegistry(config))

    async def generate(args: Any, sample: Any, sampling_params: dict, evaluation: bool = False) -> Any:
        return await run_agent(args, sample, sampling_params, make_registry())

    return generate


generate = make_generate(AgentConfig())
