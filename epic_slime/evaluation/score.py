"""Score generated responses into eval records (for any generator: SGLang, vLLM, transformers).

Input rows (JSONL): ``{"response": str, "label": str, "benchmark": str, "prompt_id": str,
"sample_idx": int}`` plus optional ``run``, ``method``, ``seed``, ``step`` (else taken from the
defaults given on the command line).
"""

from __future__ import annotations

import argparse
import json
import sys

from epic_slime.evaluation.records import EvalRecord, RecordError, write_records

_IDENTITY = ("run", "method", "seed", "step")


def score_rows(rows: list[dict], defaults: dict, timeout: float = 5.0) -> list[EvalRecord]:
    from epic_slime.reward import math_rewards

    for number, row in enumerate(rows):
        for key in ("response", "label", "benchmark", "prompt_id", "sample_idx"):
            if key not in row:
                raise RecordError(f"response row {number}: missing field '{key}'")
        for key in _IDENTITY:
            if key not in row and defaults.get(key) is None:
                raise RecordError(f"response row {number}: no '{key}' in the row and no --{key} default")
    rewards = math_rewards([r["response"] for r in rows], [r["label"] for r in rows], timeout=timeout)
    records = []
    for number, (row, reward) in enumerate(zip(rows, rewards)):
        data = {key: row.get(key, defaults.get(key)) for key in _IDENTITY}
        data.update(
            benchmark=row["benchmark"], prompt_id=row["prompt_id"], sample_idx=row["sample_idx"], correct=reward > 0.5
        )
        records.append(EvalRecord.from_dict(data, where=f"response row {number}"))
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="score generated responses into eval records")
    parser.add_argument("--responses", required=True, help="JSONL of responses (see module doc)")
    parser.add_argument("--out", required=True, help="eval record file (appended)")
    parser.add_argument("--run"), parser.add_argument("--method")
    parser.add_argument("--seed", type=int), parser.add_argument("--step", type=int)
    parser.add_argument("--timeout", type=float, default=5.0, help="verifier deadline per response, seconds")
    args = parser.parse_args(argv)
    try:
        with open(args.responses) as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
        records = score_rows(rows, vars(args), timeout=args.timeout)
    except (OSError, ValueError) as error:
        print(f"score: {error}", file=sys.stderr)
        return 1
    write_records(args.out, records)
    correct = sum(r.correct for r in records)
    print(f"{len(records)} records ({correct} correct) appended to {args.out}")
    return 0
