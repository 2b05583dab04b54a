"""Inputs for the Megatron worker: slime's arguments for one loss mode, and one rollout batch of the
runtime's tiny model (token ids, the HF model's own log-probs as behaviour log-probs, perturbed so that
every mode clips somewhere, advantages, a masked token)."""

from __future__ import annotations

import torch

TEMPERATURE = 0.8
# (prompt length, response length): a one-token response, and packed lengths that are not multiples
# of the THD padding
LAYOUT = [(5, 7), (3, 12), (9, 1), (4, 9)]
ADVANTAGES = [1.0, -0.7, 0.4, -1.2]
PAD_MULTIPLIER = 8


def sample_layout() -> list[tuple[int, int]]:
    return list(LAYOUT)


def make_args(mode: str, *extra: str):
    """slime's own argument defaults (read from its source, support.slime_args) with the project's
    flags, plus the Megatron ones slime's train path reads."""
    from epic_slime.slime.cli.flags import add_project_arguments
    from support.slime_args import slime_argument_parser

    parser = slime_argument_parser()
    add_project_arguments(parser)
    args = parser.parse_args(
        [
            "--policy-loss",
            mode,
            "--loss-type",
            "custom_loss",
            "--custom-loss-function-path",
            "epic_slime.slime.loss.policy_loss",
            "--rollout-temperature",
            str(TEMPERATURE),
            *extra,
        ]
    )
    from epic_slime.losses import LOSS_MODES

    aggregation = args.policy_loss_aggregation or LOSS_MODES[mode].aggregation
    megatron = dict(
        calculate_per_token_loss=aggregation == "token-mean",
        data_pad_size_multiplier=PAD_MULTIPLIER,
        seq_length=64,
        decoder_seq_length=None,
        micro_batch_size=1,
        use_dynamic_batch_size=False,
        enable_mtp_training=False,
        ci_test=False,
        check_for_nan_in_loss_and_grad=True,
        save_debug_train_data=None,
        allgather_cp=False,
        use_rollout_entropy=False,
        log_probs_chunk_size=-1,
        recompute_loss_function=False,
        use_kl_loss=False,
        kl_loss_coef=0.0,
        entropy_coef=0.0,
        use_rollout_logprobs=False,
        behavior_logprobs="rollout",
        num_experts=4,
        num_layers=2,
        sequence_parallel=torch.distributed.get_world_size() > 1 if torch.distributed.is_initialized() else False,
    )
    for key, value in megatron.items():
        setattr(args, key, value)
    return args


@torch.no_grad()
def rollout_data(hf, layout, seed: int = 0):
    """slime's per-sample rollout dict (what DataIterator indexes) and the HF model's log-probs."""
    from epic_slime.runtime.model import response_log_probs
    from support.megatron_qwen import VOCAB

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, VOCAB, (p,), generator=g).tolist() for p, _ in layout]
    responses = [torch.randint(3, VOCAB, (r,), generator=g).tolist() for _, r in layout]
    lp, mask = response_log_probs(hf, prompts, responses, TEMPERATURE, pad_id=0)
    hf_lp = [lp[i, : len(r)].clone() for i, r in enumerate(responses)]
    data = {k: [] for k in ("tokens", "total_lengths", "response_lengths", "loss_masks", "advantages")}
    data["rollout_log_probs"] = []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        n = len(r)
        data["tokens"].append(torch.tensor(p + r, dtype=torch.long))
        data["total_lengths"].append(len(p) + n)
        data["response_lengths"].append(n)
        loss_mask = torch.ones(n, dtype=torch.int)
        if n > 3:
            loss_mask[n // 2] = 0
        data["loss_masks"].append(loss_mask)
        data["advantages"].append(torch.full((n,), ADVANTAGES[i]))
        drift = 0.05 * torch.randn(n, generator=g) + 0.5 * (torch.arange(n) % 4 == 1)
        data["rollout_log_probs"].append((hf_lp[i] - drift).clamp(max=-1e-3))
    return data, hf_lp
