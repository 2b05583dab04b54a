"""Thin Ray actor wrappers around the engines and the trainer. One torch thread per actor (`threads.py`):
on a 2-core machine the actors share the cores, they must not each spawn a thread pool."""

from __future__ import annotations

import ray
import torch

from .threads import set_torch_threads


@ray.remote(num_cpus=1, max_restarts=0)
class RolloutWorker:
    def __init__(
        self,
        worker_id: int,
        model_cfg,
        init_state: dict,
        version: int,
        dtype: str,
        seed: int,
        router_noise: float = 0.0,
    ):
        set_torch_threads()
        from .rollout import PolicyEngine

        self.worker_id = worker_id
        self.engine = PolicyEngine(model_cfg, init_state, version, dtype=dtype, seed=seed, router_noise=router_noise)

    def generate(self, requests, weights, version: int, sampling: dict):
        """`weights` is None when this worker already holds an acceptable version."""
        if weights is not None:
            self.engine.set_weights(weights, version)
        return self.engine.generate(requests, **sampling)

    def version(self) -> int:
        return self.engine.version

    def pid(self) -> int:
        import os

        return os.getpid()


@ray.remote(num_cpus=1, max_restarts=0)
class EvalWorker:
    def __init__(self, model_cfg, init_state: dict, seed: int):
        set_torch_threads()
        from .rollout import PolicyEngine

        self.engine = PolicyEngine(model_cfg, init_state, 0, dtype="float32", seed=seed)

    def evaluate(self, weights, version: int, problems, sampling: dict):
        """(the version it scored, correct[prompt][sample], the tool's counts per response and per sample
        [prompt][sample]: empty and None but for the agent task)."""
        self.engine.set_weights(weights, version)
        if "max_turns" in sampling:
            from .rollout_agent import evaluate

            correct, stats, counts = evaluate(self.engine, problems, **sampling)
        else:
            correct, stats, counts = self.engine.evaluate(problems, **sampling), {}, None
        return self.engine.version, correct, stats, counts


@ray.remote(num_cpus=1, max_restarts=0)
class Trainer:
    def __init__(self, init_state: dict, trainer_kwargs: dict):
        set_torch_threads()
        from .trainer import PolicyTrainer

        self.trainer = PolicyTrainer(init_state=init_state, **trainer_kwargs)

    def train_step(self, groups):
        return self.trainer.train_groups(groups)

    def get_weights(self):
        return self.trainer.get_weights()

    def save_state(self, path: str) -> None:
        import os

        tmp = f"{path}.tmp{os.getpid()}"
        torch.save(self.trainer.state(), tmp)
        os.replace(tmp, path)

    def load_state(self, path: str) -> int:
        self.trainer.load_state(torch.load(path, map_location="cpu", weights_only=False))
        return self.trainer.version
