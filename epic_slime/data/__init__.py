"""Data preparation: DAPO-Math-17k (training) and the four eval sets as slime-ready JSONL."""

from epic_slime.data.convert import ConversionReport, RowError, canonical_answer, convert_rows
from epic_slime.data.hub import DataUnavailableError
from epic_slime.data.sources import ALL, BY_NAME, EVAL_SETS, TRAIN, DatasetSpec
from epic_slime.data.templates import DAPO_PREFIX, DAPO_SUFFIX, dapo_chat_prompt, strip_dapo_template

__all__ = [
    "ALL",
    "BY_NAME",
    "EVAL_SETS",
    "TRAIN",
    "DatasetSpec",
    "ConversionReport",
    "RowError",
    "DataUnavailableError",
    "canonical_answer",
    "convert_rows",
    "dapo_chat_prompt",
    "strip_dapo_template",
    "DAPO_PREFIX",
    "DAPO_SUFFIX",
]
