"""R3 (rollout routing replay) on real Megatron-core, at TP = 1 and TP = 2 (+ SP): routes recorded
from the HF model's router (SGLang cannot capture routes on CPU), a third of them replaced by the two
experts the router scored lowest, go through the project's R3 store (epic_slime.slime.routing:
uint8 staging, handles in the samples, per-rank row fetch) into slime's RoutingReplay, and slime's
forward_only / train_one_step run with them (tests/support/megatron_r3.py).

- Megatron's router used exactly the replayed experts, per MoE layer, in the log-prob pass and in
  the training step (each TP rank its own sequence shard);
- Megatron's log-probs equal HF's with the same routes forced (1e-5, as in test_megatron_loss.py;
  measured 4.8e-7) and differ from HF's natural ones (the replay changed the computation);
- the store round-trips: uint8 held, handles in the samples, and the rows a rank fetches equal
  slime's own `prepare_routed_experts_for_routing_replay` on the int32 routes, padding included.
"""

from __future__ import annotations

import pytest
import torch

from support.megatron_run import finish_all, skip_reason, start

pytestmark = pytest.mark.slow
if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("megatron_r3")
    outs = {tp: tmp / f"r3_tp{tp}.json" for tp in (1, 2)}
    done = finish_all({tp: start("r3", tp, outs[tp]) for tp in (1, 2)}, outs, timeout=900)
    for tp, (rc, log, result) in done.items():
        assert rc == 0 and result is not None, f"R3 TP={tp} worker exited {rc}:\n{log}"
    return {tp: result["ranks"] for tp, (_, _, result) in done.items()}


@pytest.mark.parametrize("tp", [1, 2])
def test_megatrons_router_used_exactly_the_replayed_experts(runs, tp):
    ranks = runs[tp]
    assert [r["tp_rank"] for r in ranks] == list(range(tp))
    for r in ranks:
        assert r["used_forward"] == [True, True], "log-prob pass: each MoE layer's router used the replayed ids"
        assert r["used_train"] == [True, True], "training step: the same"
        assert r["consumed_forward"] == [1, 1]
        assert r["altered_rows"] > 0
    # under SP each rank replays its own half of the stream, padded by slime to TP x its multiplier (8)
    rows = [r["local_rows"] for r in ranks]
    assert len(set(rows)) == 1 and sum(rows) % (8 * tp) == 0 and sum(rows) >= runs[1][0]["local_rows"]


@pytest.mark.parametrize("tp", [1, 2])
def test_replayed_log_probs_equal_hfs_with_the_same_routes(runs, tp):
    for r in runs[tp]:
        gap_to_natural = 0.0
        for mine, forced, natural in zip(r["megatron_log_probs"], r["hf_forced_log_probs"], r["hf_natural_log_probs"]):
            mine, forced, natural = torch.tensor(mine), torch.tensor(forced), torch.tensor(natural)
            torch.testing.assert_close(mine, forced, rtol=0, atol=1e-5)
            gap_to_natural = max(gap_to_natural, float((mine - natural).abs().max()))
        assert gap_to_natural > 1e-3, "the replayed routes must change the log-probs"


@pytest.mark.parametrize("tp", [1, 2])
def test_the_projects_r3_store_round_trips(runs, tp):
    for r in runs[tp]:
        assert r["store_dtypes"] == ["uint8"] and r["store_dtype_local"] == "torch.uint8"
        assert r["handles"]
        assert r["store_equals_slime"]
    assert runs[2][0]["loss"] == pytest.approx(runs[1][0]["loss"], rel=1e-6)
