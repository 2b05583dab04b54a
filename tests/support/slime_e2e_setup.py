"""The e2e harness's workdir: the tokenizer, the prompts, the reward, the initial weights, the run's
config and the driver command line at the issue's scale (used by ``slime_e2e_harness.py``)."""

from __future__ import annotations

import json
import os

import torch

ROLLOUT_MAX_RESPONSE_LEN = 24
HOLD_MAX_SECONDS = 3.0  # a held request of the batch being collected decodes after this long
EVAL_MAX_RESPONSE_LEN = 10  # differs from the rollout's, so the stand-in's hold never takes an eval request
# the response-length spread: about one prompt in 3 must answer with at least 20 tokens (most
# untrained answers stop within a few): those groups are overtaken by the others
LONG_EVERY, LONG_MIN_NEW_TOKENS = 3, 20
# oversampling on: 3 groups in flight for a batch of 2
GROUPS_IN_FLIGHT = 3


def write_tokenizer(out_dir: str) -> str:
    """An HF tokenizer folder for the runtime's 19-token vocabulary (slime loads it with AutoTokenizer)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from epic_slime.runtime.task import BOS, EOS, PAD, VOCAB

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("Answer:|<bos>|<eos>|<pad>|."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)
    fast.save_pretrained(out_dir)
    return out_dir


def write_prompts(path: str, count: int, seed: int, first_pid: int = 0) -> None:
    """Synthetic-task prompts as slime reads them (--input-key prompt --label-key label
    --metadata-key metadata); metadata.pid identifies a prompt across runs."""
    from epic_slime.runtime.task import BOS, TaskConfig
    from epic_slime.runtime.tasks import train_problem

    with open(path, "w") as f:
        for i in range(count):
            p = train_problem(first_pid + i, seed, TaskConfig())
            f.write(
                json.dumps({"prompt": BOS + p.prompt, "label": str(p.answer), "metadata": {"pid": first_pid + i}})
                + "\n"
            )


async def reward(args, sample) -> float:
    """``--custom-rm-path``: 1 when the response emits the ``Answer:`` token (about half of the
    untrained model's samples do, so GRPO advantages are non-zero), plus 1 for the right answer."""
    text = sample.response or ""
    if "Answer:" not in text:
        return 0.0
    answer = text.split("Answer:")[-1].replace("<eos>", "")
    return 1.0 + float(answer == str(sample.label))


def init_weights(path: str) -> str:
    from epic_slime.runtime.model import ModelConfig, build_policy
    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    torch.save(
        build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=0).state_dict(), path
    )
    return path


def standard_argv(
    workdir: str,
    *,
    num_rollout: int,
    save_interval: int | None,
    load: str | None = None,
    extra: list[str] = (),
    max_staleness: int = 2,
    engines: int = 1,
) -> list[str]:
    """The issue's scale: 12 permits (--sglang-server-concurrency 12, one engine), 2 groups x 4
    samples = 8 training samples in flight, 10 eval prompts x 4 = 40 eval samples every rollout.
    ``engines``: engines behind the router (``--rollout-num-gpus``, one GPU each; 12 permits each)."""
    argv = [
        "--hf-checkpoint",
        os.path.join(workdir, "tokenizer"),
        "--prompt-data",
        os.path.join(workdir, "train.jsonl"),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--metadata-key",
        "metadata",
        "--eval-prompt-data",
        "synthetic",
        os.path.join(workdir, "eval.jsonl"),
        "--n-samples-per-eval-prompt",
        "4",
        "--eval-max-response-len",
        str(EVAL_MAX_RESPONSE_LEN),
        "--eval-interval",
        "1",
        "--eval-temperature",
        "1.0",
        "--custom-rm-path",
        "support.slime_e2e_harness.reward",
        "--custom-eval-rollout-log-function-path",
        "epic_slime.slime.eval_hooks.log_eval_rollout",
        "--rollout-function-path",
        "epic_slime.slime.rollout.generate_rollout",
        "--loss-type",
        "custom_loss",
        "--custom-loss-function-path",
        "epic_slime.slime.loss.policy_loss",
        "--policy-loss",
        "epic",
        "--update-depth",
        "2",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "4",
        "--rollout-max-response-len",
        str(ROLLOUT_MAX_RESPONSE_LEN),
        "--rollout-temperature",
        "1.0",
        "--rollout-num-gpus",
        str(engines),
        "--rollout-num-gpus-per-engine",
        "1",
        "--sglang-server-concurrency",
        "12",
        "--max-staleness",
        str(max_staleness),
        "--num-rollout",
        str(num_rollout),
        "--lr",
        "1e-3",
        "--save",
        os.path.join(workdir, "ckpt"),
        "--custom-config-path",
        os.path.join(workdir, "epic_run.yaml"),  # eval records (eval_hooks)
    ]
    if max_staleness != 0:  # the background stream's depth; the synchronous schedule has none
        # oversampling needs K >= 2 (K = 1 trains only groups that finish in the rollout they start in)
        argv += ["--async-groups-in-flight", str(GROUPS_IN_FLIGHT if max_staleness != 1 else 2)]
    if save_interval is not None:
        argv += ["--save-interval", str(save_interval)]
    if load is not None:
        argv += ["--load", load]
    return argv + list(extra)


def prepare_workdir(workdir: str, train_prompts: int = 200, eval_prompts: int = 10) -> None:
    write_tokenizer(os.path.join(workdir, "tokenizer"))
    write_prompts(os.path.join(workdir, "train.jsonl"), train_prompts, seed=1)
    write_prompts(os.path.join(workdir, "eval.jsonl"), eval_prompts, seed=2, first_pid=10_000)
    init_weights(os.path.join(workdir, "init.pt"))
    from support.eval_helpers import run_config_yaml

    run_config_yaml(os.path.join(workdir, "epic_run.yaml"), os.path.join(workdir, "eval_records.jsonl"), run_name="e2e")
