"""A scripted policy for the runtime's agent task (``--task-name calc``) whose tool counts are known:
``scripted_sample`` stands in for ``task_calc.sample`` at its interface, and ``VersionedEngine`` is the
engine's interface that ``rollout_agent`` reads. Used by the runtime's agent tests and the report's
tool-use round trip."""

from __future__ import annotations

from epic_slime.runtime.task import Tokenizer

TOK = Tokenizer()


def scripted_sample(script: dict[str, list[str]]):
    """Stands in for ``model.sample`` (its interface: prompts in, one dict per prompt out): the prompt
    names the trajectory's script, and its turn is the number of calls in it so far (every earlier turn
    ended with '='). "<eos>" at a reply's end is the end-of-sequence token."""

    def fake(model, prompts, *, max_new_tokens, eos_id, stop_ids, **_):
        out = []
        for p in prompts:
            text = TOK.decode(p, stop_at_eos=False)
            reply = next(turns for key, turns in script.items() if key in text)[text.count("=") - 1]
            ids = TOK.encode(reply.removesuffix("<eos>")) + ([eos_id] if reply.endswith("<eos>") else [])
            ids = ids[:max_new_tokens]
            out.append(
                {"response_ids": ids, "behavior_log_probs": [-0.5] * len(ids), "sampling_log_probs": [-0.5] * len(ids)}
            )
        return out

    return fake


class VersionedEngine:
    """The engine's interface that ``generate_turn`` reads: a model and the version it holds."""

    def __init__(self, version: int):
        self.model, self.version = None, version
