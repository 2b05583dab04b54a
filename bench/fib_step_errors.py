"""Probe: where a `fib` warm start goes wrong. Samples responses on the test prompts and checks every step
`a op b=c;` against the chain so far: a copy error (operands or operator not the previous step's), an
arithmetic error (c not a op b mod 10, given the model's own operands), a step out of format; and the
arithmetic errors per tenth of the chain. Found why the mechanism study's first long warm start sat at
chance (docs/study/mechanism/README.md, "Revision"):

    python bench/fib_step_errors.py docs/study/mechanism/warm_start/ec18549b0012e911.pt --steps 100
"""

from __future__ import annotations

import argparse
import json
import re

import torch

from epic_slime.runtime.model import ModelConfig, build_policy, sample
from epic_slime.runtime.task import TaskConfig, Tokenizer
from epic_slime.runtime.tasks import split_problems

STEP = re.compile(r"(\d)([+-])(\d)=(\d)")


def check_chain(prompt: str, response: str, steps: int) -> dict:
    """Per-step verdicts of one response against its own chain (an error is judged from the values the
    response itself carried, so one slip is counted once, not at every later step)."""
    x, op, y = int(prompt[0]), prompt[1], int(prompt[2])
    out = {"steps": 0, "copy": 0, "arith": 0, "format": 0, "arith_at": []}
    for k, part in enumerate(response.split(";")[:steps]):
        m = STEP.fullmatch(part)
        if not m:
            out["format"] += 1
            break
        out["steps"] += 1
        a, o, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
        out["copy"] += (a, o, b) != (x, op, y)
        right = (a + b) % 10 if o == "+" else (a - b) % 10
        if c != right:
            out["arith"] += 1
            out["arith_at"].append(k)
        x, y = b, c
    return out


def probe(weights: str, steps: int, prompts: int, samples: int, seed: int) -> dict:
    tok = Tokenizer()
    model_cfg = ModelConfig(
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        num_experts=4,
        top_k=2,
        moe_intermediate_size=64,
        max_positions=max(96, 6 * steps + 32),
    )
    model = build_policy(model_cfg, tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed)
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    model.eval()
    task = TaskConfig(
        min_operands=steps,
        max_operands=steps,
        max_operand=9,
        ops="+-",
        eval_num_prompts=prompts,
        eval_fraction=0.1,
        name="fib",
    )
    problems = split_problems("test", task)[:prompts] * samples
    outs = sample(
        model,
        [[tok.bos_id] + tok.encode(p.prompt) for p in problems],
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=6 * steps + 16,
        eos_id=tok.eos_id,
        pad_id=tok.pad_id,
        generator=torch.Generator().manual_seed(seed),
    )
    total = {"steps": 0, "copy": 0, "arith": 0, "format": 0}
    tenths, right, clean = [0] * 10, 0, 0
    for problem, o in zip(problems, outs):
        text = tok.decode([t for t in o["response_ids"] if t != tok.eos_id])
        verdict = check_chain(problem.prompt, text, steps)
        for k in total:
            total[k] += verdict[k]
        for k in verdict["arith_at"]:
            tenths[k * 10 // steps] += 1
        found = re.search(r"Answer:(\d+)", text)
        right += bool(found and int(found[1]) == problem.answer)
        clean += verdict["steps"] == steps and not verdict["arith"] and not verdict["copy"]
    n = len(outs)
    return {
        "responses": n,
        "accuracy": right / n,
        "all_steps_right": clean / n,
        "steps_checked": total["steps"],
        "arith_error_rate": total["arith"] / max(1, total["steps"]),
        "copy_error_rate": total["copy"] / max(1, total["steps"]),
        "out_of_format": total["format"],
        "arith_errors_by_tenth": tenths,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("weights")
    p.add_argument("--steps", type=int, default=100, help="chain length N (6N + 3 response tokens)")
    p.add_argument("--prompts", type=int, default=32, help="test prompts")
    p.add_argument("--samples", type=int, default=2, help="samples per prompt")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(1)
    print(json.dumps(probe(a.weights, a.steps, a.prompts, a.samples, a.seed)))


if __name__ == "__main__":
    main()
