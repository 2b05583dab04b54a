"""slime-shaped loss inputs shared by the adapter, Top-K and metric-name tests (no slime needed).

``loss_args``: the Namespace slime hands a custom loss, with the project's policy-loss flags parsed.
``full_data`` / ``slime_inputs``: full-response tensors per sample and what one CP rank sees of them.
``sample_mean_reducer``: slime's ``sum_of_sample_mean`` reducer written from its documented
contract (per sample, sum of x * mask over local tokens divided by the full-response denominator,
summed over samples; per-token mode: the plain masked token sum).
"""

from __future__ import annotations

import argparse

import torch

from epic_slime.losses import LOSS_MODES
from epic_slime.slime.loss_parts.cp import zigzag_response_positions

# (total_length, response_length): odd sizes, a one-token response, responses that start in
# the second zigzag chunk and ones that end in the padding.
SHAPES = [(9, 5), (20, 17), (7, 1), (33, 30), (12, 3)]


def loss_args(mode: str, *extra: str, **attrs) -> argparse.Namespace:
    from epic_slime.losses.flags import add_policy_loss_arguments

    parser = argparse.ArgumentParser()
    add_policy_loss_arguments(parser)
    args = parser.parse_args(["--policy-loss", mode, *extra])
    aggregation = args.policy_loss_aggregation or LOSS_MODES[mode].aggregation
    defaults = dict(
        behavior_logprobs="rollout",
        calculate_per_token_loss=aggregation == "token-mean",
        entropy_coef=0.0,
        use_kl_loss=False,
        kl_loss_coef=0.0,
        kl_loss_type="low_var_kl",
        use_unbiased_kl=False,
        use_rollout_logprobs=False,
    )
    defaults.update(attrs)
    for key, value in defaults.items():
        setattr(args, key, value)
    return args


def full_data(seed: int = 0):
    """Full-response tensors per sample (float64): log pi, log mu, advantages, mask, ref log-probs."""
    g = torch.Generator().manual_seed(seed)
    data = []
    for k, (total, resp) in enumerate(SHAPES):
        log_mu = -torch.rand(resp, generator=g, dtype=torch.float64) * 3 - 0.01
        # current policy: samples 0 and 2 almost on-policy (inside even GSPO's 3e-4 band), the
        # others drift, with a few large moves so that every mode clips somewhere
        drift = torch.randn(resp, generator=g, dtype=torch.float64) * (1e-5 if k in (0, 2) else 0.05)
        if k not in (0, 2):
            drift[::4] += torch.randn(len(drift[::4]), generator=g, dtype=torch.float64) * 0.6
            drift += 0.05 * (1 if k % 2 == 0 else -1)  # pushes the ratio in its advantage's direction
        log_pi = torch.clamp(log_mu + drift, max=-1e-4)
        mask = torch.ones(resp, dtype=torch.int32)
        if resp > 3:
            mask[resp // 2] = 0  # e.g. a tool-output token inside the response
        adv = torch.full((resp,), [1.0, -0.7, 0.4, -1.3, 0.9][k], dtype=torch.float64)
        ref = log_mu + torch.randn(resp, generator=g, dtype=torch.float64) * 0.1
        data.append(dict(total=total, resp=resp, log_pi=log_pi, log_mu=log_mu, mask=mask, adv=adv, ref=ref))
    return data


def sample_mean_reducer(positions, masks, denoms, per_token: bool):
    def reduce(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(())
        for x_i, pos, m, d in zip(x.split([len(p) for p in positions]), positions, masks, denoms):
            term = (x_i * m[pos].to(x.dtype)).sum()
            out = out + (term if per_token else term / max(float(d), 1.0))
        return out

    return reduce


def slime_inputs(data, rank: int, cp: int, args):
    """Leaves (full log pi per sample) and the batch / reducer a CP rank would see."""
    leaves = [d["log_pi"].clone().requires_grad_(True) for d in data]
    positions = [zigzag_response_positions(d["total"], d["resp"], rank, cp) for d in data]
    masks = [d["mask"] for d in data]
    batch = {
        "total_lengths": [d["total"] for d in data],
        "response_lengths": [d["resp"] for d in data],
        "loss_masks": masks,
        "advantages": [d["adv"][p] for d, p in zip(data, positions)],
        "rollout_log_probs": [d["log_mu"][p] for d, p in zip(data, positions)],
        "ref_log_probs": [d["ref"][p] for d, p in zip(data, positions)],
        "log_probs": None,
        "rollout_mask_sums": None,
    }
    log_probs = [leaf[p] for leaf, p in zip(leaves, positions)]
    reducer = sample_mean_reducer(positions, masks, [m.sum() for m in masks], args.calculate_per_token_loss)
    return leaves, log_probs, batch, reducer
