"""Evaluation: eval records, mean@k / pass@k, checkpoint selection, Table 1 report."""

from epic_slime.evaluation.config import BENCHMARKS, PAPER_PROTOCOL, EvalProtocol, slime_eval_arguments
from epic_slime.evaluation.metrics import (
    BenchmarkScore,
    MethodRow,
    RunInfo,
    benchmark_pass_at_k,
    checkpoint_average,
    group_records,
    mean_and_std,
    mean_at_k,
    method_table,
    pass_at_k,
    select_best_checkpoint,
)
from epic_slime.evaluation.records import EvalRecord, RecordError, read_record_paths, read_records, write_records

__all__ = [
    "BENCHMARKS",
    "PAPER_PROTOCOL",
    "EvalProtocol",
    "slime_eval_arguments",
    "BenchmarkScore",
    "MethodRow",
    "RunInfo",
    "benchmark_pass_at_k",
    "checkpoint_average",
    "group_records",
    "mean_and_std",
    "mean_at_k",
    "method_table",
    "pass_at_k",
    "select_best_checkpoint",
    "EvalRecord",
    "RecordError",
    "read_record_paths",
    "read_records",
    "write_records",
]
