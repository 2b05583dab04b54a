"""The datasets the project uses: where they come from and what they are called locally."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetSpec:
    name: str  # benchmark / dataset key, also the output file stem
    split: str  # "train" or "eval"
    hf_id: str  # Hugging Face dataset repository
    local_files: tuple[str, ...]  # accepted file names for --from-local, in order of preference
    expected_prompts: int | None  # unique prompts after de-duplication (None: not checked)
    display: str  # column title in Table 1
    revision: str = "main"  # Hub revision (branch, tag or commit); `--revision NAME=REV` overrides it
    sample_files: tuple[str, ...] = ()  # local_files that hold only a few rows (the test fixtures' copy)


TRAIN = DatasetSpec(
    "dapo_math_17k",
    "train",
    "BytedTsinghua-SIA/DAPO-Math-17k",
    ("dapo_math_17k.jsonl", "dapo_math_17k.parquet", "dapo-math-17k.parquet", "dapo_math_sample.jsonl"),
    None,
    "DAPO-Math-17k",
    sample_files=("dapo_math_sample.jsonl",),
)
EVAL_SETS = (
    DatasetSpec(
        "aime_2024",
        "eval",
        "BytedTsinghua-SIA/AIME-2024",
        ("aime_2024.jsonl", "aime_2024.parquet", "aime_2024_dapo_format.jsonl"),
        30,
        "AIME 24",
    ),
    DatasetSpec("aime_2025", "eval", "math-ai/aime25", ("aime_2025.jsonl", "aime_2025.parquet"), 30, "AIME 25"),
    DatasetSpec("amc_2023", "eval", "math-ai/amc23", ("amc_2023.jsonl", "amc_2023.parquet"), 40, "AMC 23"),
    DatasetSpec(
        "hmmt_feb_2025",
        "eval",
        "MathArena/hmmt_feb_2025",
        ("hmmt_feb_2025.jsonl", "hmmt_feb_2025.parquet"),
        30,
        "HMMT 25",
    ),
)
ALL = (TRAIN,) + EVAL_SETS
BY_NAME = {spec.name: spec for spec in ALL}
