"""The paper's oversampling ratio (Table 2: 0.1) on the slime path (pure functions, no slime import).

What the authors' code does (their verl fork, ``LiChengxi666/verl``, recipes
``..._oversample0p1...``, ``actor_rollout_ref.rollout.over_sample_rate = 0.1``): for a batch of
N sample requests it starts ``ceil(N / (1 - rate))`` requests (the extra ones re-draw samples of
the same batch, uniformly with replacement), keeps the first N that finish and cancels the rest:
the slowest ~10% of generations never hold up a synchronous step.

slime's streaming rollout has no synchronous step to hold up: its ``GroupStream``
(``epic_slime.slime.rollout``) starts groups by the admission budget
(``epic_slime.admission.AdmissionBudget``, live groups < (g + K) * B) and takes every batch in
start order, so no group is left out of a batch for being slow (that would be the length bias the
budget removes). The ratio therefore only caps how many groups the stream holds (generating, or
finished and not yet taken): ``ceil(rollout_batch_size / (1 - rate))`` (64 -> 72 at the paper's
scale), passed as ``--async-groups-in-flight``, on top of the budget. Nothing is cancelled (that
would discard consumed prompts). The fork counts samples (512 -> 569 requests), slime counts groups
of ``n_samples_per_prompt`` (64 -> 72 groups = 576 samples).
"""

from __future__ import annotations

from fractions import Fraction


class OversamplingError(ValueError):
    """An oversampling ratio or count that cannot be used."""


def check_ratio(ratio: float) -> Fraction:
    """The ratio as an exact fraction of its decimal spelling; must be in [0, 1)."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        raise OversamplingError(f"--oversample-ratio must be a number in [0, 1), got {ratio!r}")
    if not 0 <= ratio < 1:
        raise OversamplingError(f"--oversample-ratio must be in [0, 1), got {ratio}")
    return Fraction(repr(float(ratio)))


def oversampled_count(target: int, ratio: float) -> int:
    """Requests to start so that ``target`` of them are kept: the smallest m with m (1 - ratio) >= target.

    The fork's ``ceil(target / (1 - rate))``, in exact arithmetic (floats can land one above an
    exact multiple: 9 / (1 - 0.1) is 10.000000000000002).
    """
    if isinstance(target, bool) or not isinstance(target, int) or target < 1:
        raise OversamplingError(f"the number of results to keep must be an int >= 1, got {target!r}")
    keep = 1 - check_ratio(ratio)
    quotient = Fraction(target) / keep
    return int(-(-quotient.numerator // quotient.denominator))


def groups_in_flight(rollout_batch_size: int, ratio: float, explicit: int | None = None) -> int:
    """The cap on groups the stream holds: ``--async-groups-in-flight`` when given, else the
    oversampled batch (the batch itself at ratio 0)."""
    if explicit is not None:
        if ratio:
            raise OversamplingError(
                f"--oversample-ratio {ratio} sets the groups in flight to "
                f"{oversampled_count(rollout_batch_size, ratio)}; drop --async-groups-in-flight {explicit} "
                "or the ratio"
            )
        return explicit
    return oversampled_count(rollout_batch_size, ratio)
