"""``epic-slime evaluate``: a checkpoint's k samples per prompt on the prepared eval sets, scored
into eval records (the same records as training-time evaluation, read by ``epic-slime report``).

    epic-slime evaluate --model CKPT --data DATA_DIR --out records.jsonl --run R --method M --seed 1 \\
        --step 0 [--engine sglang --tp-size 8 | --engine transformers --device cpu]

Defaults are the paper's sampling (8 samples, temperature 1.0, top-p 0.7); ``--reeval-protocol``
takes the authors' 32 samples per prompt (run it once per top-p: 0.7 and 1.0, into separate files).
``--engine sglang`` drives SGLang's offline engine (``sglang.Engine``, tensor parallel; GPUs, or its
CPU engine with ``--device cpu``), imported in this process (SGLang must be installed beside the project);
``--engine transformers`` is the CPU fallback for small models.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from epic_slime.evaluation.config import BENCHMARKS, PAPER_PROTOCOL, REEVAL_SAMPLES_PER_PROMPT
from epic_slime.evaluation.engines import ENGINES, EngineError, Sampling, SGLangEngine, TransformersEngine, prompt_text
from epic_slime.evaluation.records import RecordError, write_records
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


def response_rows(prompts: list[dict], responses: list[list[str]]) -> list[dict]:
    """Prompt rows x their k responses -> score_rows input (sample_idx 0..k-1 in generation order)."""
    if len(responses) != len(prompts):
        raise EngineError(f"engine returned responses for {len(responses)} of {len(prompts)} prompts")
    return [
        {
            "response": text,
            "label": row["label"],
            "benchmark": row["metadata"]["benchmark"],
            "prompt_id": row["metadata"]["problem_id"],
            "sample_idx": j,
        }
        for row, texts in zip(prompts, responses)
        for j, text in enumerate(texts)
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epic-slime evaluate", description="evaluate a checkpoint into eval records")
    parser.add_argument("--model", required=True, help="Hugging Face checkpoint folder (or hub id when online)")
    parser.add_argument("--data", required=True, help="folder written by `epic-slime prepare-data`")
    parser.add_argument("--out", required=True, help="eval record file (appended)")
    parser.add_argument("--run", required=True)
    parser.add_argument("--method", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--step", type=int, required=True)
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="sglang (GPUs, tensor parallel) or transformers (CPU fallback); default: sglang when "
        "importable, else transformers",
    )
    parser.add_argument("--benchmarks", nargs="+", default=list(BENCHMARKS))
    parser.add_argument(
        "--samples-per-prompt",
        type=int,
        default=None,
        help=f"default {PAPER_PROTOCOL.samples_per_prompt} (paper), {REEVAL_SAMPLES_PER_PROMPT} with --reeval-protocol",
    )
    parser.add_argument(
        "--reeval-protocol",
        action="store_true",
        help=f"the authors' re-evaluation: {REEVAL_SAMPLES_PER_PROMPT} samples per prompt",
    )
    parser.add_argument("--temperature", type=float, default=PAPER_PROTOCOL.temperature)
    parser.add_argument("--top-p", type=float, default=PAPER_PROTOCOL.top_p)
    parser.add_argument("--max-new-tokens", type=int, default=8192, help="the training runs' max response length")
    parser.add_argument("--max-prompts", type=int, default=None, help="first N prompts per benchmark (smoke tests)")
    sglang = parser.add_argument_group("sglang engine")
    sglang.add_argument("--tp-size", type=int, default=1, help="tensor-parallel GPUs of the engine")
    sglang.add_argument("--mem-fraction-static", type=float, default=None)
    sglang.add_argument("--context-length", type=int, default=None)
    hf = parser.add_argument_group("transformers engine")
    hf.add_argument("--batch-size", type=int, default=4, help="prompts per generate call")
    parser.add_argument(
        "--device",
        default=None,
        help="transformers: default cuda when available, else cpu; sglang: default the GPUs, "
        "cpu runs SGLang's CPU engine (small models; see docs/evaluation.md)",
    )
    return parser


def check_args(args) -> None:
    for name in ("samples_per_prompt", "max_new_tokens", "tp_size", "batch_size", "max_prompts"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p}")
    if not args.temperature > 0:
        raise ValueError(f"--temperature must be > 0 (sampling), got {args.temperature}")


def default_engine() -> str:
    import importlib.util

    return "sglang" if importlib.util.find_spec("sglang") is not None else "transformers"


def open_engine(args, tokenizer):
    if args.engine == "sglang":
        return SGLangEngine(
            args.model,
            tp_size=args.tp_size,
            seed=args.seed,
            device=args.device,
            mem_fraction_static=args.mem_fraction_static,
            context_length=args.context_length,
        )
    return TransformersEngine(
        args.model, tokenizer, device=args.device or _default_device(), seed=args.seed, batch_size=args.batch_size
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.samples_per_prompt is None:
        args.samples_per_prompt = (
            REEVAL_SAMPLES_PER_PROMPT if args.reeval_protocol else PAPER_PROTOCOL.samples_per_prompt
        )
    args.engine = args.engine or default_engine()
    try:
        check_args(args)
        prompts = load_eval_prompts(args.data, args.benchmarks, args.max_prompts)
    except (ValueError, FileNotFoundError) as error:
        print(f"epic-slime evaluate: error: {error}", file=sys.stderr)
        return 2  # bad input (a flag, missing data), as every other epic-slime command
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    texts = [prompt_text(tokenizer, row["prompt"]) for row in prompts]
    sampling = Sampling(args.samples_per_prompt, args.temperature, args.top_p, args.max_new_tokens)
    print(
        f"evaluate: {len(prompts)} prompts x {sampling.samples_per_prompt} samples on {args.engine} "
        f"(temperature {sampling.temperature}, top-p {sampling.top_p})"
    )
    try:
        engine = open_engine(args, tokenizer)
        try:
            responses = engine.generate(texts, sampling)
        finally:
            engine.close()  # SGLang keeps GPU processes until shut down
        records = score_rows(
            response_rows(prompts, responses),
            {"run": args.run, "method": args.method, "seed": args.seed, "step": args.step},
        )
    except (EngineError, RecordError) as error:
        print(f"evaluate: {error}", file=sys.stderr)
        return 1
    write_records(args.out, records)
    print(f"{len(records)} records ({sum(r.correct for r in records)} correct) appended to {args.out}")
    return 0


def _default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"
