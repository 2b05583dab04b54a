"""epic_slime.integrations.verl against verl's own registry, agg_loss and worker-side imports (verl 0.9.x).

CI installs verl without its dependencies (.ci/run: its full set pins another transformers and pulls
a GPU stack); the registry, agg_loss and the configs need only the few packages listed there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl", reason="verl is not installed (CI installs it: .ci/run, pip install --no-deps verl)")

from verl.trainer.ppo import core_algos  # noqa: E402

from epic_slime.integrations import PARAMS_ENV, VERL_OWN_MODES, exported_modes, verl_loss_name  # noqa: E402
from epic_slime.integrations import verl as adapter  # noqa: E402
from epic_slime.losses import AGGREGATIONS, LOSS_MODES, PolicyLossInputError, compute_policy_loss  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]


def random_batch(seed: int, batch: int = 5, length: int = 9, dtype=torch.float64):
    """Behaviour and current log-probs a little apart (so clipping happens), a ragged mask with one
    empty response, NaN on padded positions of the current log-probs (what a padded forward may leave)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g, dtype=dtype) * 3 - 0.01
    new = (old + torch.randn(batch, length, generator=g, dtype=dtype) * 0.05).clamp(max=-1e-3)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[1] = 0
    mask = torch.arange(length)[None, :] < lengths[:, None]
    new = torch.where(mask, new, torch.nan)
    advantages = torch.randn(batch, generator=g, dtype=dtype)[:, None].expand(batch, length).clone()
    return old, new.requires_grad_(), advantages, mask


def test_verl_registry_returns_the_adapter_for_every_exported_mode():
    assert adapter.SKIPPED == []
    for mode in exported_modes():
        fn = core_algos.get_policy_loss_fn(verl_loss_name(mode))
        assert fn.epic_slime_mode == mode
    assert core_algos.get_policy_loss_fn("epic").epic_slime_mode == "epic"
    # verl's own modes of the same name stay verl's; ours sit beside them under a prefix
    for mode in VERL_OWN_MODES:
        assert not hasattr(core_algos.get_policy_loss_fn(mode), "epic_slime_mode"), mode
        assert core_algos.get_policy_loss_fn("epic_slime_" + mode).epic_slime_mode == mode
    # the Top-K modes need inputs verl's loss call does not carry
    assert {m for m, s in LOSS_MODES.items() if s.needs_topk}.isdisjoint(adapter.REGISTERED.values())


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("mode", exported_modes())
def test_loss_and_gradient_equal_the_core(mode, aggregation):
    old, new, advantages, mask = random_batch(seed=10 * exported_modes().index(mode) + AGGREGATIONS.index(aggregation))
    loss, metrics = core_algos.get_policy_loss_fn(verl_loss_name(mode))(
        old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask, loss_agg_mode=aggregation
    )
    (grad,) = torch.autograd.grad(loss, new)

    new_core = new.detach().clone().requires_grad_()
    core = compute_policy_loss(mode, new_core, old, advantages, mask, aggregation=aggregation)
    (grad_core,) = torch.autograd.grad(core.loss, new_core)
    torch.testing.assert_close(loss, core.loss, rtol=1e-7, atol=1e-12)  # verl adds 1e-8 to token counts
    torch.testing.assert_close(grad, grad_core, rtol=1e-7, atol=1e-12)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(core.metrics["clipfrac"].item(), abs=0)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(core.metrics["clipfrac_lower"].item(), abs=0)
    assert metrics["actor/policy/ratio_mean"] == pytest.approx(core.metrics["ratio_mean"].item(), abs=0)
    assert "actor/policy/clipfrac" not in metrics and "actor/policy/clipfrac_lower" not in metrics


def test_ppo_kl_is_verls_mean_of_old_minus_current():
    old, new, advantages, mask = random_batch(seed=3)
    _, metrics = core_algos.get_policy_loss_fn("epic")(old, new, advantages, mask, "token-mean")
    m = mask.numpy()
    expected = float(np.mean((old.numpy() - new.detach().numpy())[m]))
    assert metrics["actor/ppo_kl"] == pytest.approx(expected, rel=1e-12)


def test_verls_data_parallel_scaling_goes_through_its_agg_loss():
    """With global_batch_info set, as verl's worker sets it, the loss is verl's agg_loss of the core's
    per-token loss: the local sum over the global token count, times dp_size."""
    from verl.workers.config import ActorConfig

    old, new, advantages, mask = random_batch(seed=4)
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
    config.global_batch_info.update(dp_size=2, batch_num_tokens=100, global_batch_size=None)
    loss, _ = core_algos.get_policy_loss_fn("epic")(old, new, advantages, mask, "token-mean", config)
    core = compute_policy_loss("epic", new.detach(), old, advantages, mask)
    expected = core.per_token_loss.detach().sum() / 100 * 2
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-12, atol=0)


def test_rollout_correction_weights_multiply_the_per_token_loss():
    old, new, advantages, mask = random_batch(seed=5)
    weights = torch.rand(mask.shape, dtype=old.dtype, generator=torch.Generator().manual_seed(0)) + 0.5
    loss, _ = core_algos.get_policy_loss_fn("epic")(
        old, new, advantages, mask, "seq-mean-token-sum", rollout_is_weights=weights
    )
    (grad,) = torch.autograd.grad(loss, new)
    new_core = new.detach().clone().requires_grad_()
    core = compute_policy_loss("epic", new_core, old, advantages, mask)
    rows = (core.per_token_loss * weights).sum(-1)
    expected = rows[mask.any(-1)].mean()
    (grad_core,) = torch.autograd.grad(expected, new_core)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, grad_core, rtol=1e-12, atol=0)


@pytest.mark.parametrize("loss_agg_mode", ["token-sum", "seq-mean-token-sum-norm", "seq_mean"])
def test_an_aggregation_without_counterpart_is_refused_in_one_line(loss_agg_mode):
    old, new, advantages, mask = random_batch(seed=6)
    with pytest.raises(PolicyLossInputError, match=f"actor.loss_agg_mode='{loss_agg_mode}' has no counterpart"):
        core_algos.get_policy_loss_fn("epic")(old, new, advantages, mask, loss_agg_mode)


def test_every_mapped_aggregation_is_one_verl_accepts():
    old, new, advantages, mask = random_batch(seed=7)
    per_token = torch.where(mask, new.detach(), 0.0)
    for name in adapter.VERL_AGGREGATIONS:
        core_algos.agg_loss(per_token, mask, name)  # raises on a name verl does not know
    with pytest.raises(ValueError):
        core_algos.agg_loss(per_token, mask, "no-such-mode")


def test_parameters_from_the_environment(monkeypatch):
    # z_t = 0.08 on every token: beyond epic's default upper bound at t = 1 (about 0.07), inside it
    # with delta_high = 3e-3 (about 0.086)
    old = torch.full((2, 4), -0.2, dtype=torch.float64)
    new = (old + 0.08).requires_grad_()
    advantages, mask = torch.ones(2, 4, dtype=torch.float64), torch.ones(2, 4, dtype=torch.bool)
    monkeypatch.setenv(PARAMS_ENV, json.dumps({"delta_high": 3e-3, "delta_low": 1e-3}))
    loss, metrics = core_algos.get_policy_loss_fn("epic")(old, new, advantages, mask, "token-mean")
    (grad,) = torch.autograd.grad(loss, new)
    grads = {}
    for name, params in (("set", {"delta_high": 3e-3, "delta_low": 1e-3}), ("default", {})):
        leaf = new.detach().clone().requires_grad_()
        core = compute_policy_loss("epic", leaf, old, advantages, mask, aggregation="token-mean", **params)
        grads[name] = (torch.autograd.grad(core.loss, leaf)[0], core.metrics["clipfrac"].item())
    torch.testing.assert_close(grad, grads["set"][0], rtol=1e-12, atol=0)
    assert metrics["actor/pg_clipfrac"] == grads["set"][1] < grads["default"][1]  # the setting mattered
    monkeypatch.setenv(PARAMS_ENV, '{"clip_high": 0.3}')
    with pytest.raises(PolicyLossInputError, match=r"mode 'epic' has no parameter\(s\) \['clip_high'\]"):
        core_algos.get_policy_loss_fn("epic")(old, new, advantages, mask, "token-mean")
    monkeypatch.setenv(PARAMS_ENV, "delta_high=3e-3")
    with pytest.raises(PolicyLossInputError, match=f"{PARAMS_ENV}='delta_high=3e-3' is not JSON"):
        core_algos.get_policy_loss_fn("epic")(old, new, advantages, mask, "token-mean")


def test_the_environment_parameters_override_those_a_loss_was_made_with(monkeypatch):
    """EPIC_SLIME_LOSS_PARAMS is read at every call (docs/integrations.md) and is the last word: over the
    parameters given to make_policy_loss, key by key (a key it does not name keeps the made value)."""
    old = torch.full((2, 4), -0.2, dtype=torch.float64)
    new = (old + 0.08).requires_grad_()
    advantages, mask = torch.ones(2, 4, dtype=torch.float64), torch.ones(2, 4, dtype=torch.bool)
    made = adapter.make_policy_loss("epic", delta_high=1e-4, delta_low=1e-3)
    monkeypatch.setenv(PARAMS_ENV, json.dumps({"delta_high": 3e-3}))
    _, metrics = made(old, new, advantages, mask, "token-mean")
    want = compute_policy_loss(
        "epic", new, old, advantages, mask, aggregation="token-mean", delta_high=3e-3, delta_low=1e-3
    )
    made_only = compute_policy_loss(
        "epic", new, old, advantages, mask, aggregation="token-mean", delta_high=1e-4, delta_low=1e-3
    )
    assert metrics["actor/pg_clipfrac"] == want.metrics["clipfrac"].item() < made_only.metrics["clipfrac"].item()


def test_bad_parameters_are_refused_when_the_loss_is_made():
    with pytest.raises(PolicyLossInputError, match="delta_high=-1"):
        adapter.make_policy_loss("epic", delta_high=-1)


# ---- worker-side imports: what a fresh verl worker process sees ----------------------------------

_CHECK = """
import sys
{setup}
from verl.trainer.ppo.core_algos import get_policy_loss_fn
try:
    fn = get_policy_loss_fn("epic")
except ValueError as err:
    print("ABSENT", str(err)[:60]); sys.exit(0)
print("FOUND", fn.epic_slime_mode)
"""


def run_fresh_process(setup: str, extra_env: dict[str, str], extra_path: list[str] = ()) -> str:
    env = {**os.environ, **extra_env}
    env["PYTHONPATH"] = os.pathsep.join([*extra_path, str(REPO_ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", _CHECK.format(setup=textwrap.dedent(setup))],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO_ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


NO_PLUGINS = {"VERL_USE_EXTERNAL_PLUGINS": "none"}


def test_worker_import_through_external_lib(tmp_path):
    """A fresh verl process has no `epic`; building verl's HFModelConfig (actor_rollout_ref.model, as
    each worker builds it) with `external_lib` imports the adapter, and then it has."""
    from support.eval_helpers import save_tiny_checkpoint

    save_tiny_checkpoint(tmp_path / "model")
    setup = f"""
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
    assert "epic" not in POLICY_LOSS_REGISTRY, "registered before external_lib was read"
    from verl.workers.config import HFModelConfig
    HFModelConfig(path={str(tmp_path / "model")!r}, external_lib="epic_slime.integrations.verl")
    """
    assert run_fresh_process(setup, NO_PLUGINS) == "FOUND epic"


def test_worker_import_through_the_entry_point_pyproject_declares(tmp_path):
    """verl loads every `verl.plugins` entry point on `import verl`; the one pyproject.toml declares
    (installed here as a bare distribution, as `pip install` writes it) registers the modes."""
    import tomllib

    points = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["verl.plugins"]
    dist = tmp_path / "epic_slime_entry_point-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: epic-slime-entry-point\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(
        "[verl.plugins]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
    )
    assert run_fresh_process("import verl", {"VERL_USE_EXTERNAL_PLUGINS": "auto"}, [str(tmp_path)]) == "FOUND epic"


def test_through_verls_worker_side_ppo_loss():
    """verl's own actor loss (verl/workers/utils/losses.py `ppo_loss`, what its engine workers call):
    it unpads the model's flat log-probs, sets global_batch_info from the batch, picks the loss by
    `policy_loss.loss_mode` from verl's registry and reports its metrics. Loss and gradient are the core's."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import ActorConfig, PolicyLossConfig
    from verl.workers.utils.losses import ppo_loss

    prompt_len, lengths = 2, torch.tensor([4, 2, 3])
    old, new, advantages, _ = random_batch(seed=11, batch=3, length=4)
    new = torch.where(torch.isnan(new), old, new).detach().requires_grad_()
    mask = torch.arange(4)[None] < lengths[:, None]
    # the model's output as verl's engines return it: one flat row of every token's log-prob, the log-prob
    # of response token k at position prompt_len - 1 + k of its sequence
    flat = torch.cat(
        [
            piece
            for i in range(3)
            for piece in (
                torch.zeros(prompt_len - 1, dtype=old.dtype),
                new[i, : lengths[i]],
                torch.zeros(1, dtype=old.dtype),
            )
        ]
    )
    data = TensorDict(
        {
            "prompts": torch.ones(3, prompt_len, dtype=torch.long),
            "responses": torch.ones(3, 4, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(3, prompt_len, dtype=torch.long), mask.long()], 1),
            "response_mask": mask.long(),
            "old_log_probs": old,
            "advantages": advantages,
        },
        batch_size=[3],
    )
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=3)
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=PolicyLossConfig(loss_mode="epic"),
        loss_agg_mode="seq-mean-token-mean",
    )
    loss, metrics = ppo_loss(config, {"log_probs": flat}, data)
    (grad,) = torch.autograd.grad(loss, new)

    leaf = new.detach().clone().requires_grad_()
    core = compute_policy_loss("epic", leaf, old, advantages, mask)
    (grad_core,) = torch.autograd.grad(core.loss, leaf)
    torch.testing.assert_close(loss, core.loss, rtol=1e-7, atol=1e-12)
    torch.testing.assert_close(grad, grad_core, rtol=1e-7, atol=1e-12)
    assert {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/policy/ratio_mean"} <= set(metrics)
