"""Zigzag CP layout and the detached gather, against an independent description of slime's layout."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from epic_slime.slime.loss_parts.cp import (
    gather_full_responses,
    make_all_reduce_gather,
    with_live_local_entries,
    zigzag_response_positions,
    zigzag_response_ranges,
)


def _reference_positions(total, response, rank, cp):
    """Brute force from the layout's definition: pad tokens to 2*cp equal chunks, rank r owns
    chunks r and 2cp-1-r; response token j (sequence position prompt+j) is scored by the logit
    at position prompt+j-1, and the rank owning that logit position owns the token."""
    chunk = -(-total // (2 * cp))
    owned_chunks = [rank, 2 * cp - 1 - rank] if cp > 1 else [0, 1]
    prompt = total - response
    out = []
    for c in owned_chunks:  # local order: first chunk, then second chunk
        for j in range(response):
            logit_pos = prompt + j - 1
            if logit_pos // chunk == c:
                out.append(j)
    return out


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_positions_match_layout_and_partition_the_response(cp):
    for total in range(2, 40):
        for response in range(1, total):
            seen = []
            for rank in range(cp):
                got = zigzag_response_positions(total, response, rank, cp).tolist()
                assert got == _reference_positions(total, response, rank, cp), (total, response, rank)
                seen += got
            assert sorted(seen) == list(range(response))


def test_bad_lengths_are_rejected_with_the_field_name():
    with pytest.raises(ValueError, match="response_length"):
        zigzag_response_ranges(5, 5, 0, 2)
    with pytest.raises(ValueError, match="cp_rank"):
        zigzag_response_ranges(10, 5, 2, 2)


def test_live_entries_carry_gradient_only_locally():
    full = torch.arange(6, dtype=torch.float64)
    pos = torch.tensor([1, 4])
    live = torch.tensor([10.0, 40.0], dtype=torch.float64, requires_grad=True)
    row = with_live_local_entries(full, pos, live)
    assert row.tolist() == [0, 10, 2, 3, 40, 5]
    (row * torch.arange(6)).sum().backward()
    assert live.grad.tolist() == [1.0, 4.0]


def _gather_worker(rank, world, init_file, samples, result_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        positions = [zigzag_response_positions(t, r, rank, world) for t, r, _ in samples]
        local = [full[pos] for (_, _, full), pos in zip(samples, positions)]
        out = gather_full_responses(local, positions, [r for _, r, _ in samples], make_all_reduce_gather())
        torch.save(out, f"{result_file}.{rank}")
    finally:
        dist.destroy_process_group()


def test_gloo_gather_rebuilds_full_responses_exactly():
    torch.manual_seed(0)
    samples = []
    for total, response in [(9, 5), (20, 17), (7, 1), (33, 30)]:
        samples.append((total, response, torch.randn(response, 3, dtype=torch.float32)))
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        result = os.path.join(tmp, "out")
        mp.spawn(_gather_worker, args=(2, init_file, samples, result), nprocs=2, join=True)
        for rank in range(2):
            out = torch.load(f"{result}.{rank}")
            for (_, _, full), got in zip(samples, out):
                assert torch.equal(got, full)


def test_gather_without_cp_is_identity():
    full = torch.randn(5, 2)
    pos = torch.arange(5)
    (got,) = gather_full_responses([full], [pos], [5], None)
    assert torch.equal(got, full)
