"""Supervised warm start: a short fine-tune on correct solutions, cached on disk by config hash.

It stands in for a pretrained base model: a policy with non-zero but low reward that RL can
improve. The imitated solutions have correct steps but, with probability `answer_noise`, a final
answer off by 1..3, so the base policy knows the procedure yet usually botches the last line
(like a base LLM that rambles past the right result); RL has a signal it can find in minutes. The cache is only a speed-up: a missing or unreadable cache entry is recomputed."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import random
import re
from pathlib import Path

import torch

from .model import ModelConfig, build_policy, response_log_probs
from .task import ANSWER, TaskConfig, Tokenizer, make_problem
from .tasks import get_task, train_problem
from .threads import torch_threads

WARM_START_VERSION = 1  # bump when the recipe changes so old cache entries are not reused
WARM_START_BAR = "warm start (trained once, then cached)"


def warm_start_key(
    model_cfg: ModelConfig,
    task_cfg: TaskConfig,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    answer_noise: float,
    step_noise: float = 0.0,
    init_sha256: str | None = None,
) -> str:
    recipe = {
        "model": model_cfg.__dict__,
        "task": task_cfg.__dict__,
        "steps": steps,
        "lr": lr,
        "batch_size": batch_size,
        "seed": seed,
        "answer_noise": answer_noise,
        "recipe": WARM_START_VERSION,
    }
    if step_noise:  # only when used, so that every existing cache entry keeps its key
        recipe["step_noise"] = step_noise
    if init_sha256:  # the starting weights' content, not their path: a moved file keeps its key
        recipe["init_sha256"] = init_sha256
    blob = json.dumps(recipe, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "epic-slime" / "warm_start"


def slipped_solution(problem, rng: random.Random, step_noise: float, modulus: int | None) -> str:
    """The solution with arithmetic slips: each step's result is wrong with probability `step_noise`
    (off by 1..3, or by 1..modulus-1 modulo `modulus`), and every later step carries the wrong value on
    consistently, as a careless solver would. Copies (operands, operators) stay exact, so the imitating
    policy is certain where the prompt decides and uncertain at every step's result."""

    def slip(result: int) -> int:
        if rng.random() >= step_noise:
            return result
        return (
            (result + rng.randint(1, modulus - 1)) % modulus if modulus else result + rng.choice((-3, -2, -1, 1, 2, 3))
        )

    operands = [int(x) for x in re.findall(r"\d+", problem.prompt)]
    ops = re.findall(r"[+\-*]", problem.prompt)
    return make_problem(operands, ops, modulus, slip=slip).solution


def warm_start_target(
    problem,
    rng: random.Random,
    answer_noise: float,
    step_noise: float = 0.0,
    modulus: int | None = None,
    task_slips=None,
) -> str:
    """The solution text the warm start imitates: with probability `answer_noise` the steps are right
    but the final `Answer:` is off by 1..3 (a sloppy base model: knows how, often does not finish right);
    with `step_noise` > 0 each step's result slips with that probability (`slipped_solution`)."""
    if step_noise > 0:
        if task_slips is not None:
            return task_slips(problem, rng, step_noise)
        return slipped_solution(problem, rng, step_noise, modulus)
    if rng.random() >= answer_noise:
        return problem.solution
    wrong = problem.answer + rng.choice((-3, -2, -1, 1, 2, 3))
    head = problem.solution[: problem.solution.rindex(ANSWER)]
    return f"{head}{ANSWER}{wrong}"


def read_init_weights(path: str | Path) -> tuple[dict, str]:
    """(state_dict, sha256 of the file) of `warm_start_init`; a one-line error naming the field otherwise."""
    try:
        blob = Path(path).read_bytes()  # read once: hashed, then loaded from memory
        state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as e:
        raise ValueError(f"warm_start_init: cannot read weights from {str(path)!r} ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict):
        raise ValueError(f"warm_start_init: {str(path)!r} is not a state dict (got {type(state).__name__})")
    return state, hashlib.sha256(blob).hexdigest()


def supervised_warm_start(
    model_cfg: ModelConfig,
    task_cfg: TaskConfig,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    answer_noise: float = 0.0,
    step_noise: float = 0.0,
    on_step=None,
    init_state: dict | None = None,
) -> dict:
    """on_step(step, loss): called after every step (progress output). init_state: start from these
    weights instead of a fresh model (a curriculum: a long task's warm start from a short task's, whose
    arithmetic a fresh model at 600 tokens learned much worse than the copies)."""
    tok = Tokenizer()
    model = build_policy(model_cfg, tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed)
    if init_state is not None:
        try:
            model.load_state_dict(init_state)
        except RuntimeError as e:
            first = str(e).strip().splitlines()
            raise ValueError(
                f"warm_start_init: the weights do not fit this model ({first[1].strip() if len(first) > 1 else first[0]})"
            ) from None
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(f"warm/{seed}")
    modulus, task_slips = get_task(task_cfg.name).modulus, get_task(task_cfg.name).slipped_solution
    for step in range(steps):
        # problems from a separate stream of indices (negative), so RL data is not memorised verbatim
        probs = [train_problem(-1 - rng.randrange(1 << 30), seed, task_cfg) for _ in range(batch_size)]
        prompts = [[tok.bos_id] + tok.encode(p.prompt) for p in probs]
        targets = [
            tok.encode(warm_start_target(p, rng, answer_noise, step_noise, modulus, task_slips)) + [tok.eos_id]
            for p in probs
        ]
        lp, mask = response_log_probs(model, prompts, targets, 1.0, tok.pad_id)
        loss = -((lp * mask).sum(1) / mask.sum(1)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        # linear decay so a short run ends in a stable place
        for g in opt.param_groups:
            g["lr"] = lr * (1 - step / max(1, steps))
        opt.step()
        if on_step is not None:
            on_step(step + 1, float(loss.detach()))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def load_or_train_warm_start(
    model_cfg: ModelConfig,
    task_cfg: TaskConfig,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    cache_dir: str | Path | None,
    answer_noise: float = 0.0,
    step_noise: float = 0.0,
    progress: bool = False,
    init: str | Path | None = None,
) -> tuple[dict, str]:
    """(state_dict, provenance) where provenance is "cache:<path>", "trained:<path>" or "fresh-init".
    progress: say what happens (cached at PATH / training with a progress bar). init: a state-dict file
    to start from (`warm_start_init`), read and hashed even on a cache hit so a changed file is retrained."""
    from .progress import Progress, say

    init_state, init_sha256 = read_init_weights(init) if init else (None, None)
    if steps == 0:
        if init_state is not None:
            raise ValueError(
                f"warm_start_init: {str(init)!r} needs warm_start_steps > 0 (got 0); "
                "to start RL from a file, use --load"
            )
        tok = Tokenizer()
        model = build_policy(model_cfg, tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}, "fresh-init"
    key = warm_start_key(model_cfg, task_cfg, steps, lr, batch_size, seed, answer_noise, step_noise, init_sha256)
    path = Path(cache_dir or default_cache_dir()) / f"{key}.pt"
    if path.exists():
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            if progress:
                say(f"warm start: cached at {path}")
            return state, f"cache:{path}"
        except Exception as e:  # unreadable entry: recompute (counted in the provenance string)
            print(f"warm start: cache entry {path} unreadable ({e}); recomputing")
    if progress:
        say(
            f"warm start: training {steps} supervised steps, once for this config (a few seconds to minutes; "
            f"later runs load it from {path})"
        )
    bar = Progress(steps, desc=WARM_START_BAR, enabled=progress, interval=max(1, steps // 10))
    try:
        own = get_task(task_cfg.name).supervised_warm_start  # a task with its own recipe (calc)
        on_step = lambda i, loss: bar.update(i, {"loss": loss})  # noqa: E731
        with torch_threads():
            if own is not None:
                if init_state is not None:
                    raise ValueError(f"warm_start_init: not supported with task_name {task_cfg.name!r}")
                state = own(
                    model_cfg,
                    steps=steps,
                    batch_size=batch_size,
                    lr=lr,
                    seed=seed,
                    on_step=on_step,
                )
            else:
                state = supervised_warm_start(
                    model_cfg,
                    task_cfg,
                    steps=steps,
                    lr=lr,
                    batch_size=batch_size,
                    seed=seed,
                    answer_noise=answer_noise,
                    step_noise=step_noise,
                    init_state=init_state,
                    on_step=on_step,
                )
    finally:
        bar.close()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(state, tmp)
        os.replace(tmp, path)
    except OSError as e:
        print(f"warm start: could not write cache {path} ({e}); continuing without cache")
    return state, f"trained:{path}"


def warm_start_for(cfg, progress: bool = False) -> tuple[dict, str]:
    """The warm start of a run configuration (`epic_slime.runtime.config.RunConfig`): one call site
    for the driver, the study and the benches, so that every recipe field reaches the cache key."""
    return load_or_train_warm_start(
        cfg.model,
        cfg.task,
        steps=cfg.warm_start_steps,
        lr=cfg.warm_start_lr,
        batch_size=cfg.warm_start_batch_size,
        seed=cfg.warm_start_seed_or_seed,
        cache_dir=cfg.warm_start_cache_dir,
        answer_noise=cfg.warm_start_answer_noise,
        step_noise=cfg.warm_start_step_noise,
        progress=progress,
        init=cfg.warm_start_init,
    )
