"""gpu_check section "slime": slime's own loss_function with the project's loss against the core."""

from __future__ import annotations

import argparse
import glob
import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from epic_slime.losses import LOSS_MODES, compute_policy_loss

from .common import BENCH_DIR, REPO_ROOT, relative_error


def find_slime(explicit: str | None) -> Path | None:
    candidates = [
        explicit,
        os.environ.get("SLIME_PATH"),
        BENCH_DIR / "slime-624b824a",
        REPO_ROOT.parent / "shared" / "vendor" / "slime-624b824a",
    ]
    for c in candidates:
        if c and (Path(c) / "slime" / "backends" / "megatron_utils" / "loss.py").is_file():
            return Path(c)
    return None


def import_with_local_wheels(module: str, wheel_dir: Path) -> str:
    """Import ``module``; if a module is missing, install every wheel in ``wheel_dir`` into a
    temporary folder (pip --no-index --no-deps: nothing is fetched, the environment is left as
    it is) and try once more. Returns how it was found; raises ImportError naming what is missing."""
    try:
        importlib.import_module(module)
        return "installed"
    except ModuleNotFoundError as exc:
        missing = exc.name
    wheels = sorted(glob.glob(str(wheel_dir / "*.whl")))
    if not wheels:
        raise ImportError(f"importing {module}: no module named {missing!r} and no wheel in {wheel_dir}")
    target = tempfile.mkdtemp(prefix="gpu_check_wheels_")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
            "--target",
            target,
            *wheels,
        ],
        check=True,
    )
    sys.path.insert(0, target)
    importlib.invalidate_caches()
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ImportError(
            f"importing {module}: no module named {exc.name!r}, not in the wheels of {wheel_dir} either"
        ) from exc
    return f"wheels from {wheel_dir}: {', '.join(Path(w).name for w in wheels)}"


SLIME_CASES = ("epic", "grpo", "gspo", "dapo")  # dapo: slime's per-token (token-mean) mode
SLIME_TEMPERATURE = 0.8


def slime_args(mode):
    from epic_slime.losses.flags import add_policy_loss_arguments

    parser = argparse.ArgumentParser()
    add_policy_loss_arguments(parser)
    args = parser.parse_args(["--policy-loss", mode])
    aggregation = args.policy_loss_aggregation or LOSS_MODES[mode].aggregation
    settings = dict(
        loss_type="custom_loss",
        custom_loss_function_path="epic_slime.slime.loss.policy_loss",
        calculate_per_token_loss=aggregation == "token-mean",
        recompute_loss_function=False,
        allgather_cp=False,
        rollout_temperature=SLIME_TEMPERATURE,
        rollout_top_p=1.0,
        log_probs_chunk_size=-1,
        entropy_coef=0.0,
        use_kl_loss=False,
        kl_loss_coef=0.0,
        kl_loss_type="low_var_kl",
        use_unbiased_kl=False,
        use_rollout_logprobs=False,
        behavior_logprobs="rollout",
    )
    for key, value in settings.items():
        setattr(args, key, value)
    return args, aggregation


def response_log_probs(logits, tokens, resp):
    """log softmax(logits / T) of each response token, read from the logit one position earlier."""
    total = tokens.numel()
    scores = torch.log_softmax(logits[total - resp - 1 : total - 1].float() / SLIME_TEMPERATURE, dim=-1)
    return scores.gather(1, tokens[total - resp :, None]).squeeze(1)


def slime_samples(sizes, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    samples = []
    for k, (total, resp) in enumerate(sizes.slime_samples):
        logits = torch.randn(total, sizes.slime_vocab, generator=g)
        tokens = torch.randint(0, sizes.slime_vocab, (total,), generator=g)
        mask = torch.ones(resp, dtype=torch.int32)
        mask[1:resp:7] = 0 if resp > 3 else 1
        log_pi = response_log_probs(logits, tokens, resp)
        # a stale behaviour policy, some tokens far off so that clipping acts
        log_mu = (log_pi + 0.05 * torch.randn(resp, generator=g) + 0.5 * (torch.arange(resp) % 5 == 0)).clamp(max=-1e-3)
        adv = torch.full((resp,), (1.0, -0.6, 0.3, -1.1)[k % 4])
        samples.append(
            {
                key: v.to(device) if torch.is_tensor(v) else v
                for key, v in dict(
                    total=total, resp=resp, logits=logits, tokens=tokens, mask=mask, log_mu=log_mu, adv=adv
                ).items()
            }
        )
    return samples


def slime_loss_and_grads(mode, samples):
    """slime's loss_function on one rank (THD stream of the samples' logits), rescaling undone."""
    from slime.backends.megatron_utils.loss import loss_function

    args, aggregation = slime_args(mode)
    leaves = [s["logits"].clone().requires_grad_(True) for s in samples]
    batch = {
        "unconcat_tokens": [s["tokens"] for s in samples],
        "total_lengths": [s["total"] for s in samples],
        "response_lengths": [s["resp"] for s in samples],
        "loss_masks": [s["mask"] for s in samples],
        "advantages": [s["adv"] for s in samples],
        "rollout_log_probs": [s["log_mu"] for s in samples],
        "ref_log_probs": [s["log_mu"] for s in samples],
        "log_probs": None,
        "rollout_mask_sums": torch.stack([s["mask"].sum().float() for s in samples]),
    }
    scaled, _, _ = loss_function(args, batch, 1, len(samples), torch.cat(leaves)[None])
    scaled.backward()
    # world size 1: slime scales a per-sample mean by 1 / step_global_batch_size; per-token mode by 1
    factor = 1.0 if aggregation == "token-mean" else 1.0 / len(samples)
    return scaled.detach() / factor, [leaf.grad / factor for leaf in leaves]


def core_loss_and_grads(mode, samples):
    """The core on log-probs computed here, reduced as slime's step sums (sample means / token sum)."""
    from torch.nn.utils.rnn import pad_sequence

    _, aggregation = slime_args(mode)
    leaves = [s["logits"].clone().requires_grad_(True) for s in samples]
    log_pi = [response_log_probs(leaf, s["tokens"], s["resp"]) for leaf, s in zip(leaves, samples)]
    mask = pad_sequence([s["mask"].bool() for s in samples], batch_first=True)
    out = compute_policy_loss(
        mode,
        pad_sequence(log_pi, batch_first=True),
        pad_sequence([s["log_mu"] for s in samples], batch_first=True),
        pad_sequence([s["adv"] for s in samples], batch_first=True),
        mask,
        aggregation=aggregation,
    )
    loss = out.loss * (mask.sum() if aggregation == "token-mean" else len(samples))
    loss.backward()
    return loss.detach(), [leaf.grad for leaf in leaves]


def section_slime(device, sizes, slime_path, wheel_dir):
    path = find_slime(slime_path)
    if path is None:
        return dict(
            status="skip",
            reason="slime's source not found (--slime-path, $SLIME_PATH, bench/slime-624b824a, "
            "../shared/vendor/slime-624b824a)",
        )
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    try:
        megatron_from = import_with_local_wheels("slime.backends.megatron_utils.loss", wheel_dir)
    except Exception as exc:  # noqa: BLE001 - a missing precondition is a skip with its reason
        return dict(status="skip", reason=f"slime / megatron-core not importable: {type(exc).__name__}: {exc}"[:400])
    import torch.distributed as dist
    from megatron.core import parallel_state

    backend = "nccl" if device == "cuda" else "gloo"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        started_here = not dist.is_initialized()
        if started_here:
            if device == "cuda":
                torch.cuda.set_device(0)
            dist.init_process_group(backend, init_method=f"file://{tmp}/init", rank=0, world_size=1)
        try:
            parallel_state.initialize_model_parallel()
            samples = slime_samples(sizes, device)
            for mode in SLIME_CASES:
                s_loss, s_grads = slime_loss_and_grads(mode, samples)
                c_loss, c_grads = core_loss_and_grads(mode, samples)
                row = dict(
                    mode=mode,
                    loss=float(s_loss),
                    loss_core=float(c_loss),
                    loss_rel_err=relative_error(s_loss, c_loss),
                    grad_rel_err=max(relative_error(a, b) for a, b in zip(s_grads, c_grads)),
                    grad_nonzero=sum(float(g.abs().sum()) > 0 for g in c_grads),
                )
                row["ok"] = row["loss_rel_err"] <= 1e-5 and row["grad_rel_err"] <= 1e-4 and row["grad_nonzero"] >= 2
                rows.append(row)
        finally:
            parallel_state.destroy_model_parallel()
            if started_here:
                dist.destroy_process_group()
    return dict(
        status="pass" if all(r["ok"] for r in rows) else "fail",
        slime_path=str(path),
        megatron=megatron_from,
        backend=backend,
        samples=[list(s) for s in sizes.slime_samples],
        vocab=sizes.slime_vocab,
        modes=rows,
    )
