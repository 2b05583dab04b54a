"""What a generate function hands back, checked before anything is trained (issue 44, item 9).

A custom ``--custom-generate-function-path`` may fill ``Sample`` fields directly instead of through
slime's ``append_response_tokens`` (which keeps them aligned). A loss mask or a log-prob list of
another length than the response shifts every later token's mask and behaviour log-prob; slime's
batch code would train on the shifted values or fail far from the cause. ``check_sample_alignment``
raises one line naming the sample, the field and both lengths. Slime-free (reads attributes only).
"""

from __future__ import annotations

from typing import Any


class SampleAlignmentError(ValueError):
    """A sample's per-token fields disagree with its tokens."""


def check_sample_alignment(sample: Any) -> None:
    index = getattr(sample, "index", None)
    where = f"sample {index} (generate function output)"
    response = int(getattr(sample, "response_length", 0) or 0)
    tokens = getattr(sample, "tokens", None) or []
    if response < 0 or (response and len(tokens) <= response):
        raise SampleAlignmentError(
            f"{where}: tokens has {len(tokens)} entries for response_length={response} (needs at least one prompt token)"
        )
    for field in ("loss_mask", "rollout_log_probs"):
        values = getattr(sample, field, None)
        if values is not None and len(values) != response:
            raise SampleAlignmentError(
                f"{where}: {field} has {len(values)} entries, response_length is {response} "
                f"(tokens {len(tokens)}, prompt {len(tokens) - response})"
            )
    mask = getattr(sample, "loss_mask", None)
    if mask is not None:
        bad = next((m for m in mask if m not in (0, 1)), None)
        if bad is not None:
            raise SampleAlignmentError(f"{where}: loss_mask holds {bad!r}; it must be 0 or 1 per response token")


def check_groups_alignment(groups) -> None:
    for group in groups:
        for sample in group:
            check_sample_alignment(sample)
