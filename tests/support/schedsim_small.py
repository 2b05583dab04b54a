"""The schedule simulator's paper preset made small for tests: a quarter of the batch (16 prompts x 8;
18 groups in flight) and shorter responses. The test puts ``bench/`` on ``sys.path`` first."""

from __future__ import annotations


def small(**kw):
    import schedule_sim

    return schedule_sim.paper_preset(
        **(dict(rollout_batch_size=16, mean_response_len=3000.0, max_response_len=6000) | kw)
    )
