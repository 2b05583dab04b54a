"""slime's own `MegatronTrainRayActor` on CPU (issue 45 item 5), one process per rank, Ray left out:
`python tests/support/megatron_actor.py PHASE TP OUT.json WORKDIR` (PHASE `train`: init from the HF
checkpoint, train rollouts 0 and 1, save; `load`: a fresh actor's init from that save).

Every step is slime's (`init`, `train`, `save_model`, a fresh actor's `init` from the saved
checkpoint); what had to be stood in for, each at its interface, is listed in `STANDINS` and the
result names the step reached and the first error past it, so a blocker is reported exactly.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

# what the actor cannot meet on this CPU machine, each stood in for at the interface named
STANDINS = {
    "sglang_import": "slime/utils/arguments.py:10 imports slime.backends.sglang_utils.arguments, whose line 4 "
    "imports sglang.srt.server_args (SGLang lives in its own venv): placeholder modules for the two imports; "
    "the parse runs with --debug-train-only, so sglang_parse_args is never called",
    "sglang_tensor_updater": "slime/backends/megatron_utils/actor.py:51 imports the colocated updater, whose "
    "slime/backends/megatron_utils/sglang.py:13-22 imports SGLang's serializer and tensor bucket: placeholders "
    "(the distributed updater used here never reaches them)",
    "local_names": "slime's HF <-> Megatron name maps know TransformerEngine's names only (local experts and "
    "the input norm are named otherwise without TE): the loader and the converter see the TE names "
    "(tests/support/megatron_push.py)",
    "ray_gpu_ids": "slime/ray/train_actor.py:22 get_local_gpu_id reads ray.get_gpu_ids()[0] (no GPU, no Ray "
    "here): LOCAL_RANK 0",
    "numpy_1x": "slime/backends/megatron_utils/initialize.py:66 asserts numpy 1.x (Megatron-LM issue 1563); "
    "the project's venv has numpy 2 (scipy, pyarrow, transformers): the assert's numpy reports 1.x",
}


def _paths() -> None:
    for p in (str(REPO), str(TESTS), os.environ.get("SLIME_PATH", "")):
        if p and p not in sys.path:
            sys.path.insert(0, p)


def slime_spec(args, config, vp_stage):
    """`--spec support.megatron_actor slime_spec`: the harness's CPU layer spec (THD core attention)."""
    from support.megatron_cpu import layer_spec

    return layer_spec(config.num_layers)


def _placeholders() -> None:
    """Placeholders for the SGLang modules slime's parser and actor import (none is called here);
    slime's rollout module's are support.slime_store's. Nothing when SGLang is installed."""
    import importlib.util

    from support.slime_store import _placeholder, rollout_manager_class

    if "sglang" not in sys.modules and importlib.util.find_spec("sglang") is not None:
        return
    rollout_manager_class()  # its placeholders first (sglang, sglang.srt, sglang.srt.constants)
    for name, attrs in (
        ("sglang.srt.server_args", {"ServerArgs": None}),
        ("sglang_router", {}),
        ("sglang_router.launch_router", {"RouterArgs": None}),
        # slime/backends/megatron_utils/sglang.py:13-22, for the colocated tensor updater only
        ("sglang.srt.utils", {"MultiprocessingSerializer": None}),
        ("sglang.srt.utils.patch_torch", {"monkey_patch_torch_reductions": None}),
        ("sglang.srt.weight_sync", {}),
        ("sglang.srt.weight_sync.tensor_bucket", {"FlattenedTensorBucket": None}),
    ):
        if name not in sys.modules:
            _placeholder(name, **attrs)


def _numpy_reporting_1x(numpy):
    """numpy itself for everything but the version slime's init asserts on."""
    import types

    class Numpy1x(types.ModuleType):
        def __getattr__(self, name):
            return getattr(numpy, name)

    shim = Numpy1x("numpy")
    shim.__version__ = f"1.x (numpy {numpy.__version__}, reported as 1.x for slime's assert)"
    return shim


def actor_argv(hf_dir: str, save: str, load: str, tp: int) -> list[str]:
    from epic_slime.runtime.model_config import ModelConfig

    cfg = ModelConfig()
    return [
        "actor",
        "--debug-train-only",
        "--train-backend", "megatron",
        "--hf-checkpoint", hf_dir,
        "--load", load,
        "--save", save,
        "--save-interval", "1",
        "--actor-num-nodes", "1",
        "--actor-num-gpus-per-node", str(tp),  # the train world (one process per rank)
        "--tensor-model-parallel-size", str(tp),
        *(["--sequence-parallel"] if tp > 1 else []),
        "--num-layers", str(cfg.num_layers),
        "--hidden-size", str(cfg.hidden_size),
        "--ffn-hidden-size", str(2 * cfg.hidden_size),
        "--num-attention-heads", str(cfg.num_heads),
        "--group-query-attention",
        "--num-query-groups", str(cfg.num_kv_heads),
        "--kv-channels", str(cfg.hidden_size // cfg.num_heads),
        "--num-experts", str(cfg.num_experts),
        "--moe-router-topk", str(cfg.top_k),
        "--moe-ffn-hidden-size", str(cfg.moe_intermediate_size),
        "--moe-token-dispatcher-type", "allgather",
        "--moe-router-load-balancing-type", "none",
        "--normalization", "RMSNorm",
        "--norm-epsilon", "1e-6",
        "--qk-layernorm",
        "--swiglu",
        "--disable-bias-linear",
        "--untie-embeddings-and-output-weights",  # the exported checkpoint holds lm_head as its own tensor
        # the tokenizer's 19 ids padded to the checkpoint's 20 rows (Megatron pads to a multiple of this x TP)
        "--make-vocab-size-divisible-by", str(4 // tp),
        "--position-embedding-type", "rope",
        "--rotary-base", "10000",
        "--seq-length", str(cfg.max_positions),
        "--max-position-embeddings", str(cfg.max_positions),
        "--transformer-impl", "local",
        "--spec", "support.megatron_actor", "slime_spec",
        "--use-cpu-initialization",
        "--no-gradient-accumulation-fusion",
        "--no-bias-dropout-fusion",
        "--no-masked-softmax-fusion",
        "--no-rope-fusion",
        "--no-persist-layer-norm",
        "--attention-dropout", "0",
        "--hidden-dropout", "0",
        "--inference-rng-tracker",  # Megatron's CPU-capable RNG tracker (dropout is 0)
        # that tracker has no states to save, and megatron.training's load exits on an empty set
        "--no-load-rng",
        "--micro-batch-size", "1",
        "--global-batch-size", "4",
        "--rollout-batch-size", "2",
        "--num-rollout", "2",
        "--n-samples-per-prompt", "2",
        "--lr", "1e-3",
        "--min-lr", "1e-3",
        "--lr-decay-style", "constant",
        "--clip-grad", "1.0",
        "--distributed-backend", "gloo",
        "--loss-type", "custom_loss",
        "--custom-loss-function-path", "epic_slime.slime.loss.policy_loss",
        "--policy-loss", "epic",
        "--advantage-estimator", "grpo",
        "--seed", "1234",
    ]  # fmt: skip


def parse_actor_args(argv: list[str]):
    _placeholders()
    import slime.utils.arguments as slime_arguments

    sys.argv = argv
    from epic_slime.slime.cli.flags import add_project_arguments

    return slime_arguments.parse_args(add_custom_arguments=add_project_arguments)


def rollout_samples(hf, rollout_id: int, n_prompts: int, n: int):
    """A rollout's groups as slime's `Sample`s: responses sampled from the HF model (the served policy's
    float twin) with their log-probs, 0/1 rewards that differ inside each group (GRPO's advantages)."""
    import torch
    from slime.utils.types import Sample

    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    gen = torch.Generator().manual_seed(100 + rollout_id)
    samples = []
    for p in range(n_prompts):
        pid = rollout_id * n_prompts + p
        prompt = [tok.bos_id] + tok.encode(f"{pid % 9 + 1}+{pid % 7}=")
        for j in range(n):
            tokens = list(prompt)
            with torch.no_grad():
                for _ in range(4 + j):
                    logits = hf(input_ids=torch.tensor([tokens])).logits[0, -1, : tok.vocab_size].double()
                    tokens.append(int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)))
                scores = torch.log_softmax(hf(input_ids=torch.tensor([tokens])).logits[0, :-1].double(), -1)
            response = len(tokens) - len(prompt)
            picked = scores.gather(1, torch.tensor(tokens[1:])[:, None])[:, 0][-response:]
            sample = Sample(
                group_index=pid, index=pid * n + j, prompt="", tokens=tokens, response_length=response,
                reward=float(j % 2), loss_mask=[1] * response, rollout_log_probs=[float(v) for v in picked],
                status=Sample.Status.COMPLETED, metadata={"pid": pid},
            )  # fmt: skip
            sample.rollout_id = sample.index  # one trajectory per training sample (slime: per-trajectory id)
            samples.append(sample)
    return samples


def slime_train_data(args, samples, train_parallel_config, store):
    """slime's RolloutManager conversion and per-DP split (its own methods, `self` the few fields they
    read), each rank's object put into the store stand-in: what `actor.train` fetches."""
    import types

    from support.slime_store import install, rollout_manager_class

    manager = rollout_manager_class()
    install(store)
    me = types.SimpleNamespace(
        args=args, custom_reward_post_process_func=None, custom_convert_samples_to_train_data_func=None,
        train_parallel_config=train_parallel_config,
    )  # fmt: skip
    me._post_process_rewards = types.MethodType(manager._post_process_rewards, me)
    data = manager._convert_samples_to_train_data(me, samples)
    return manager._split_train_data_by_dp(me, data)


def _logged_steps() -> list[dict]:
    """slime's per-step training metrics as its model.py logs them ("step N: {...}", our own process's
    log line), filled in as the steps run."""
    import ast
    import logging

    steps: list[dict] = []

    class Steps(logging.Handler):
        def emit(self, record):
            text = record.getMessage()
            if text.startswith("step ") and ": {" in text:
                steps.append(ast.literal_eval(text.split(": ", 1)[1]))

    logging.getLogger("slime.backends.megatron_utils.model").addHandler(Steps())
    return steps


def weight_digest(actor) -> dict[str, list[float]]:
    """Per parameter (slime's global names): sum and sum of squares, float64."""
    from slime.backends.megatron_utils.update_weight.common import named_params_and_buffers

    return {
        n: [float(t.double().sum()), float(t.double().square().sum())]
        for n, t in named_params_and_buffers(actor.args, actor.model)
    }


def main(argv: list[str]) -> int:
    _paths()
    phase, tp, out, workdir = argv[0], int(argv[1]), Path(argv[2]), Path(argv[3])
    result = {"reached": [], "standins": STANDINS}
    try:
        from support.megatron_cpu import apply_patches, install_cpu_accelerator

        result["patches"] = apply_patches()
        install_cpu_accelerator()
        from epic_slime.runtime.hf_export import export_checkpoint
        from support.megatron_qwen import hf_policy

        hf_dir = export_checkpoint(hf_policy(), workdir / f"hf-{os.getpid()}", dtype="float32")
        result["reached"].append("hf_export")
        ckpt = workdir / "ckpt"
        args = parse_actor_args(actor_argv(str(hf_dir), str(ckpt), str(hf_dir if phase == "train" else ckpt), tp))
        result["reached"].append("parse_args")

        import numpy

        import slime.backends.megatron_utils.initialize as slime_init
        import slime.ray.train_actor as train_actor
        from slime.backends.megatron_utils.actor import MegatronTrainRayActor

        from support.megatron_push import install_local_name_loader

        install_local_name_loader()
        train_actor.get_local_gpu_id = lambda: 0
        slime_init.np = _numpy_reporting_1x(numpy)
        actor = MegatronTrainRayActor(1, 0, "127.0.0.1", int(os.environ.get("EPIC_ACTOR_PORT", "29533")))
        result["reached"].append("constructed")
        start = actor.init(args, "actor")
        result["start_rollout_id"] = start
        result["reached"].append("init")
        result["digest_at_init"] = weight_digest(actor)
        if phase == "train":
            from support.slime_store import ObjectStoreStandIn

            result["steps"] = _logged_steps()

            store = ObjectStoreStandIn()
            hf = hf_policy()
            result["trained"] = []
            for rollout_id in range(2):
                samples = rollout_samples(hf, rollout_id, args.rollout_batch_size, args.n_samples_per_prompt)
                refs = slime_train_data(args, samples, actor.train_parallel_config, store)
                actor.train(rollout_id, refs)
                result["trained"].append({"rollout_id": rollout_id, "indices": [s.index for s in samples]})
                result["reached"].append(f"train {rollout_id}")
            actor.save_model(1, force_sync=True)
            result["reached"].append("save")
            result["digest_saved"] = weight_digest(actor)
    except BaseException as exc:  # noqa: BLE001 - the blocker is the result
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-6000:]
    out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
