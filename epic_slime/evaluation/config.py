"""Evaluation defaults (the paper's protocol) and the benchmark suite."""

from __future__ import annotations

from dataclasses import dataclass

# Table 1 columns, in order: record benchmark name -> column title.
BENCHMARKS: dict[str, str] = {
    "aime_2024": "AIME 24",
    "aime_2025": "AIME 25",
    "amc_2023": "AMC 23",
    "hmmt_feb_2025": "HMMT 25",
}


@dataclass(frozen=True)
class EvalProtocol:
    samples_per_prompt: int = 8  # mean@8
    temperature: float = 1.0
    top_p: float = 0.7
    interval_steps: int = 5  # evaluate every 5 training steps (rollouts)


PAPER_PROTOCOL = EvalProtocol()

# The EPIC authors' re-evaluation of finished runs: 32 samples per prompt (temperature 1.0, top-p 0.7
# and 1.0); AIME scored over all 32 samples, AMC and HMMT over the first 16 (`report --reeval-protocol`).
REEVAL_SAMPLES_PER_PROMPT = 32
REEVAL_K: dict[str, int] = {"aime_2024": 32, "aime_2025": 32, "amc_2023": 16, "hmmt_feb_2025": 16}


def slime_eval_arguments(data_dir: str, protocol: EvalProtocol = PAPER_PROTOCOL) -> list[str]:
    """slime CLI flags for the paper's evaluation on the prepared data in ``data_dir``.

    Records are written by ``epic_slime.slime.eval_hooks.log_eval_rollout``; set
    ``epic_eval_records_path`` (and ``epic_run_name``, ``epic_method``) through
    ``--custom-config-path``.
    """
    prompt_data: list[str] = []
    for name in BENCHMARKS:
        prompt_data += [name, f"{data_dir.rstrip('/')}/eval/{name}.jsonl"]
    return [
        "--eval-interval",
        str(protocol.interval_steps),
        "--eval-prompt-data",
        *prompt_data,
        "--n-samples-per-eval-prompt",
        str(protocol.samples_per_prompt),
        "--eval-temperature",
        str(protocol.temperature),
        "--eval-top-p",
        str(protocol.top_p),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--metadata-key",
        "metadata",
        "--apply-chat-template",
        "--custom-rm-path",
        "epic_slime.reward.slime_rm.reward",
        "--custom-eval-rollout-log-function-path",
        "epic_slime.slime.eval_hooks.log_eval_rollout",
    ]
