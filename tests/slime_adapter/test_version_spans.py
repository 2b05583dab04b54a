"""``call_version_spans``: which version made which token of one generate call, checked against a
per-token reference built turn by turn (independent of the run-length code)."""

from __future__ import annotations

import random

import pytest

from epic_slime.slime.stream.version_spans import call_version_spans, model_runs


def _expand(spans):
    return [v for v, n in spans for _ in range(n)]


def _reference(turns):
    """turns: [(version, model tokens, tool tokens after it)]: per-token versions and the loss mask."""
    versions, mask = [], []
    for version, model, tool in turns:
        versions += [version] * (model + tool)
        mask += [1] * model + [0] * tool
    return versions, mask


def test_one_version_covers_the_whole_call_as_before():
    assert call_version_spans([1, 1, 0, 1], 4, [3]) == ([[3, 4]], True)
    assert call_version_spans(None, 5, [2]) == ([[2, 5]], True)


def test_random_multi_turn_calls_match_the_per_token_reference():
    rng = random.Random(7)
    for _ in range(300):
        n_turns = rng.randint(1, 5)
        version = rng.randint(0, 3)
        turns = []
        for _ in range(n_turns):
            version += rng.choice([0, 0, 1, 2])  # a push may land between turns, or not
            turns.append((version, rng.randint(1, 6), rng.randint(0, 4)))
        if turns[-1][2] and rng.random() < 0.5:
            turns[-1] = (turns[-1][0], turns[-1][1], 0)
        per_token, mask = _reference(turns)
        spans, exact = call_version_spans(mask, len(mask), [t[0] for t in turns])
        runs_in_mask = len(model_runs(mask))
        assert exact == (runs_in_mask == n_turns or n_turns == 1)
        if exact:
            assert _expand(spans) == per_token
            assert all(a[0] != b[0] for a, b in zip(spans, spans[1:]))  # merged run-length
        else:
            assert spans == [[min(t[0] for t in turns), len(mask)]]


def test_tool_tokens_before_the_first_turn_go_with_it():
    # a call resumed after an abort may begin with the tool output of a turn finished earlier
    assert call_version_spans([0, 0, 1, 1, 0, 1], 6, [4, 5]) == ([[4, 5], [5, 1]], True)


def test_a_request_that_made_no_token_falls_back_to_the_oldest_version():
    # three versions reported, two model runs: which request made which run is unknown
    assert call_version_spans([1, 1, 0, 1], 4, [2, 3, 4]) == ([[2, 4]], False)
    # a mask of another length than the call's tokens is not used to split
    assert call_version_spans([1, 0, 1], 4, [2, 3]) == ([[2, 4]], False)


def test_no_version_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="versions is empty"):
        call_version_spans([1], 1, [])


@pytest.mark.parametrize("mask,runs", [([], []), ([0, 0], []), ([1], [(0, 1)]), ([1, 0, 1, 1, 0], [(0, 1), (2, 4)])])
def test_model_runs_at_the_edges(mask, runs):
    assert model_runs(mask) == runs
