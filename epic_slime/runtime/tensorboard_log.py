"""TensorBoard for the embedded runtime (``--use-tensorboard``): every numeric value of a metrics
line, under the shared names of ``epic_slime.metric_names`` (the slime path logs the same names
with slime's own ``--use-tensorboard``)."""

from __future__ import annotations

import math
import numbers
from pathlib import Path


def open_tensorboard(use: bool, log_dir: str, output_dir: str):
    """A SummaryWriter at ``log_dir`` (default ``<output_dir>/tensorboard``), or None when off."""
    if not use:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise RuntimeError(
            "--use-tensorboard needs the tensorboard package: pip install tensorboard "
            "(or drop --use-tensorboard; metrics.jsonl is always written)"
        ) from None
    return SummaryWriter(log_dir=log_dir or str(Path(output_dir) / "tensorboard"))


def log_scalars(writer, line: dict, step: int) -> int:
    """Write the finite numbers of ``line`` at ``step``; returns how many (others are in metrics.jsonl only)."""
    written = 0
    for name, value in line.items():
        if name == "step" or isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        if math.isfinite(value):
            writer.add_scalar(name, float(value), global_step=step)
            written += 1
    writer.flush()
    return written
