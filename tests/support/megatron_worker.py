"""A Megatron test's own process: `python tests/support/megatron_worker.py SCENARIO TP OUT.json`.

Spawns TP gloo ranks (the harness's patches act on the whole process, so never in pytest's). Every
rank builds the runtime's tiny Qwen3-MoE in Hugging Face and, with the same weights, as a Megatron
GPTModel under DDP and Megatron's optimizer, then runs slime's own `forward_only`
(get_log_probs_and_entropy) and `train_one_step` (DataIterator -> get_batch -> the model ->
loss_function with the project's loss hook -> backward -> optimizer step). Rank 0 writes JSON.

Scenarios: `smoke` (one EPIC step; the patch tests run it with a patch left out), `modes` (every loss
mode without Top-K, fresh weights each), `r3` (routing replay of routes recorded from the HF router).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def _paths() -> None:
    for p in (str(REPO), str(TESTS), os.environ.get("SLIME_PATH", "")):
        if p and p not in sys.path:
            sys.path.insert(0, p)


_paths()

import torch  # noqa: E402

from support.megatron_data import (  # noqa: E402
    make_args,
    rollout_data,
    sample_layout,
)


def _setup(tp: int):
    from megatron.core import parallel_state, tensor_parallel

    from support.megatron_cpu import apply_patches, install_cpu_accelerator

    applied = apply_patches()
    install_cpu_accelerator()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    # CPU RNG tracker (no patch): Megatron's default one reads torch.cuda's RNG state
    tensor_parallel.model_parallel_cuda_manual_seed(1234, inference_rng_tracker=True)
    return applied


def _model(hf, r3: bool = False):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

    from epic_slime.runtime.model_config import ModelConfig
    from support.megatron_qwen import build_gpt, load_hf_weights, transformer_config

    cfg = ModelConfig()
    config = transformer_config(cfg, torch.distributed.get_world_size(), hf.config)
    if r3:
        from support.megatron_r3 import install_slime_routing_replay

        gpt = build_gpt(config, cfg, hf.config)
        install_slime_routing_replay(gpt)
    else:
        gpt = build_gpt(config, cfg, hf.config)
    load_hf_weights(gpt, hf, cfg)
    from megatron.core import tensor_parallel

    for param in gpt.parameters():  # as megatron.training's get_model does (slime's weight sync reads them)
        tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
    config.finalize_model_grads_func = finalize_model_grads
    ddp = DistributedDataParallel(
        config, DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False), gpt
    )
    return cfg, gpt, ddp


def _optimizer(ddp):
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-3, weight_decay=0.0, clip_grad=1.0, params_dtype=torch.float32),
        [ddp],
    )
    sched = OptimizerParamScheduler(
        opt,
        init_lr=1e-3,
        max_lr=1e-3,
        min_lr=1e-3,
        lr_warmup_steps=0,
        lr_decay_steps=1,
        lr_decay_style="constant",
        start_wd=0.0,
        end_wd=0.0,
        wd_incr_steps=1,
        wd_incr_style="constant",
    )
    return opt, sched


def _train_step(args, ddp, gpt, data, record_grads: bool):
    """slime's forward_only (log-probs) then train_one_step; returns what each saw."""
    from megatron.training.global_vars import set_args
    from slime.backends.megatron_utils import model as slime_model
    from slime.backends.megatron_utils.data import DataIterator
    from slime.backends.megatron_utils.loss import get_log_probs_and_entropy

    from support.megatron_qwen import gather_full

    import megatron.training.global_vars as global_vars

    global_vars._GLOBAL_ARGS = None
    set_args(args)
    iterator = [DataIterator(data, [list(range(len(data["tokens"])))])]
    forward = slime_model.forward_only(get_log_probs_and_entropy, args, [ddp], iterator, [1])
    opt, sched = _optimizer(ddp)
    seen = {}
    real_loss_function = slime_model.loss_function

    def observed_loss_function(*a, **k):  # the real one; the test reads its output
        scaled, normalizer, log = real_loss_function(*a, **k)
        seen.update(scaled=float(scaled), normalizer=float(normalizer), keys=list(log["keys"]))
        seen["values"] = log["values"].tolist()
        return scaled, normalizer, log

    real_step = opt.step

    def observed_step():
        if record_grads:
            seen["grads"] = {k: v.tolist() for k, v in gather_full(gpt).items()}
        return real_step()

    slime_model.loss_function, opt.step = observed_loss_function, observed_step
    try:
        iterator[0].reset()
        reduced, grad_norm = slime_model.train_one_step(args, 0, 0, iterator, [ddp], opt, sched, 1, len(data["tokens"]))
    finally:
        slime_model.loss_function = real_loss_function
    seen["grad_norm"] = float(grad_norm)
    seen["reduced"] = {k: float(v) for k, v in reduced.items()}
    seen["log_probs"] = [lp.tolist() for lp in forward["log_probs"]]
    return seen


def _rank(rank: int, world: int, scenario: str, init_file: str, out: str) -> None:
    _paths()
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        applied = _setup(world)
        from support.megatron_qwen import hf_policy

        hf = hf_policy()
        layout = sample_layout()
        result = {"applied": applied, "tp": world}
        if scenario == "r3":
            from support.megatron_r3 import run_r3

            mine = run_r3(hf, layout, _model, _optimizer)
            ranks = [None] * world
            dist.all_gather_object(ranks, mine)  # each TP rank replays its own sequence shard under SP
            result["ranks"] = ranks
        elif scenario == "convert":
            from support.megatron_push import probe_ids, run_convert

            result.update(run_convert(hf, probe_ids(), _model, _optimizer, _train_step))
        else:
            cfg, gpt, ddp = _model(hf)
            from epic_slime.losses import LOSS_MODES
            from support.megatron_qwen import load_hf_weights

            modes = ["epic"] if scenario == "smoke" else [m for m, spec in LOSS_MODES.items() if not spec.needs_topk]
            data, hf_lp = rollout_data(hf, layout)
            result["hf_log_probs"] = [lp.tolist() for lp in hf_lp]
            result["data"] = {
                k: [v.tolist() for v in data[k]] for k in ("advantages", "rollout_log_probs", "loss_masks")
            }
            result["modes"] = {}
            for mode in modes:
                load_hf_weights(gpt, hf, cfg)  # fresh weights for every mode
                result["modes"][mode] = _train_step(make_args(mode), ddp, gpt, data, record_grads=scenario != "smoke")
        if rank == 0 and out.endswith(".pt"):
            torch.save(result, out)  # tensors (the converted weights)
        elif rank == 0:
            Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    import torch.multiprocessing as mp

    scenario, tp, out = argv[0], int(argv[1]), argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(tp, scenario, os.path.join(tmp, "init"), out), nprocs=tp, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
