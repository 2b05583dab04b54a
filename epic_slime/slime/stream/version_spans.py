"""Which weight version made which token of one generate call (abort mode's ``token_version_spans``).

A single-turn call makes one engine request, and slime appends the version SGLang reported to
``Sample.weight_versions``: the call's tokens all carry it. A multi-turn generate function (slime's
retool shape) makes one request per turn inside the same call, with tool output between the turns
(loss mask 0), and a push may land between two turns: the call then appended several versions. The
model turns are the runs of loss-mask-1 tokens the call added; when there is one run per reported
version, run i was made by version i (slime appends in request order), and each tool span carries the
version of the turn it answers. Otherwise (a request that produced no token, or no loss mask to split
by) the call's tokens carry the oldest version it reported: a lower bound, so staleness read from the
spans is never understated. Slime-free: lists in, lists out.
"""

from __future__ import annotations


def model_runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of 1s in a loss mask."""
    runs, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(mask)))
    return runs


def call_version_spans(new_mask: list[int] | None, new_tokens: int, versions: list[int]) -> tuple[list, bool]:
    """Run-length [[version, tokens], ...] for the ``new_tokens`` one call added, and whether each token's
    version is exact (False: the call's oldest version stands for all of them).

    ``new_mask``: the loss mask of those tokens (None: no mask, all the model's); ``versions``: the
    versions the call reported, in request order (at least one)."""
    if not versions:
        raise ValueError("call_version_spans: versions is empty (the call reported no weight version)")
    if len(versions) == 1:
        return [[versions[0], new_tokens]], True
    mask = new_mask if new_mask is not None and len(new_mask) == new_tokens else None
    runs = model_runs(mask) if mask is not None else []
    if len(runs) != len(versions):
        return [[min(versions), new_tokens]], False
    spans: list[list[int]] = []
    for i, (version, (start, _)) in enumerate(zip(versions, runs, strict=True)):
        # the run and the tool tokens after it, up to the next run; tool tokens before the first run go with it
        begin = 0 if i == 0 else start
        end = runs[i + 1][0] if i + 1 < len(runs) else new_tokens
        if spans and spans[-1][0] == version:
            spans[-1][1] += end - begin
        else:
            spans.append([version, end - begin])
    return spans, True
