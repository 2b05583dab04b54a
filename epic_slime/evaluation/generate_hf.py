"""Evaluate a Hugging Face checkpoint with transformers: k samples per prompt, scored into
eval records. For small models and local checks; on the cluster slime's SGLang eval does this.

    python eval/evaluate.py --model PATH --data DATA_DIR --out records.jsonl \\
        --run qwen-base --method base --seed 1 --step 0
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from epic_slime.evaluation.config import BENCHMARKS, PAPER_PROTOCOL
from epic_slime.evaluation.records import write_records
from epic_slime.evaluation.score import score_rows


def load_eval_prompts(data_dir: str, benchmarks, max_prompts: int | None) -> list[dict]:
    rows = []
    for benchmark in benchmarks:
        path = os.path.join(data_dir, "eval", f"{benchmark}.jsonl")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} not found: run `epic-slime prepare-data --out {data_dir}` first")
        with open(path) as handle:
            records = [json.loads(line) for line in handle if line.strip()]
        rows += records[:max_prompts] if max_prompts else records
    return rows


def _prompt_text(tokenizer, chat: list[dict]) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return "\n".join(m["content"] for m in chat) + "\n"


def generate_responses(model, tokenizer, prompts: list[dict], samples_per_prompt: int, temperature: float,
                       top_p: float, max_new_tokens: int, batch_size: int) -> list[dict]:
    import torch

    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    out = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        texts = [_prompt_text(tokenizer, row["prompt"]) for row in batch]
        inputs = tokenizer(texts, return_tensors="pt", padding=True).to(model.device)
        with torch.no_grad():
            generated = model.generate(
                **inputs, do_sample=True, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                num_return_sequences=samples_per_prompt, pad_token_id=tokenizer.pad_token_id)
        new_tokens = generated[:, inputs["input_ids"].shape[1] :]
        decoded = tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        for i, row in enumerate(batch):
            for j in range(samples_per_prompt):
                out.append({"response": decoded[i * samples_per_prompt + j], "label": row["label"],
                            "benchmark": row["metadata"]["benchmark"], "prompt_id": row["metadata"]["problem_id"],
                            "sample_idx": j})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="evaluate a Hugging Face checkpoint into eval records")
    parser.add_argument("--model", required=True, help="local model folder (or hub id when online)")
    parser.add_argument("--data", required=True, help="folder written by `epic-slime prepare-data`")
    parser.add_argument("--out", required=True, help="eval record file (appended)")
    parser.add_argument("--run", required=True), parser.add_argument("--method", required=True)
    parser.add_argument("--seed", type=int, required=True), parser.add_argument("--step", type=int, required=True)
    parser.add_argument("--benchmarks", nargs="+", default=list(BENCHMARKS))
    parser.add_argument("--samples-per-prompt", type=int, default=PAPER_PROTOCOL.samples_per_prompt)
    parser.add_argument("--temperature", type=float, default=PAPER_PROTOCOL.temperature)
    parser.add_argument("--top-p", type=float, default=PAPER_PROTOCOL.top_p)
    parser.add_argument("--max-new-tokens", type=int, default=2048)
    parser.add_argument("--max-prompts", type=int, default=None, help="first N prompts per benchmark (smoke tests)")
    parser.add_argument("--batch-size", type=int, default=4, help="prompts per generate call")
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu")
    args = parser.parse_args(argv)
    try:
        prompts = load_eval_prompts(args.data, args.benchmarks, args.max_prompts)
    except FileNotFoundError as error:
        print(f"evaluate: {error}", file=sys.stderr)
        return 1
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).to(args.device).eval()
    rows = generate_responses(model, tokenizer, prompts, args.samples_per_prompt, args.temperature, args.top_p,
                              args.max_new_tokens, args.batch_size)
    records = score_rows(rows, {"run": args.run, "method": args.method, "seed": args.seed, "step": args.step})
    write_records(args.out, records)
    print(f"{len(records)} records ({sum(r.correct for r in records)} correct) appended to {args.out}")
    return 0


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False
