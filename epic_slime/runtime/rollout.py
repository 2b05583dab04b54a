"""Rollout and evaluation engines (plain Python; `actors.py` wraps them in Ray actors).

A request is a list of (group_id, Problem); the engine samples n responses per prompt with the
weights of its current version and returns one `Group` per prompt. Sampling randomness is seeded
by (run seed, first group id), so a request's samples do not depend on which worker served it."""

from __future__ import annotations

import torch

from .batches import Group
from .model import ModelConfig, build_policy, sample
from .seeding import request_generator
from .task import Problem, Tokenizer, answer_reward


class PolicyEngine:
    """A policy copy that samples; weights arrive with a version number."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        init_state: dict,
        version: int,
        dtype: str = "float32",
        seed: int = 0,
        router_noise: float = 0.0,
    ):
        self.tok = Tokenizer()
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        self.model = build_policy(
            model_cfg, self.tok.vocab_size, self.tok.pad_id, self.tok.bos_id, self.tok.eos_id, seed
        )
        self.model.eval()
        self.router_noise = float(router_noise)
        self.router_generator = torch.Generator()
        if self.router_noise > 0:  # rollout-only routing drift (`mismatch.py`); eval engines never get it
            from .mismatch import install_router_noise

            install_router_noise(self.model, self.router_noise, self.router_generator)
        self.version = -1
        self.set_weights(init_state, version)

    def set_weights(self, state: dict, version: int) -> None:
        self.model.to(torch.float32)
        self.model.load_state_dict(state)
        self.model.to(self.dtype)  # bfloat16 copy of float32 weights: the precision mismatch
        self.version = int(version)

    def _prompt_ids(self, problem: Problem) -> list[int]:
        return [self.tok.bos_id] + self.tok.encode(problem.prompt)

    def generate(
        self,
        requests: list[tuple[int, Problem]],
        *,
        n_samples: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int,
        topk: int = 0,
        max_turns: int | None = None,
    ) -> list[Group]:
        """max_turns: the agent task (``rollout_agent.generate_turn``): one turn of each request."""
        if max_turns is not None:
            from .rollout_agent import generate_turn

            return generate_turn(
                self,
                requests,
                n_samples=n_samples,
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=max_new_tokens,
                seed=seed,
                max_turns=max_turns,
                topk=topk,
            )
        if not requests:
            return []
        prompts = [self._prompt_ids(p) for _, p in requests for _ in range(n_samples)]
        gen = request_generator(seed, "rollout", requests[0][0])
        # the router noise has its own stream, keyed like the sampling one (a request's samples do not
        # depend on the worker), so that the noise leaves the token sampling stream untouched
        self.router_generator.manual_seed(request_generator(seed, "router", requests[0][0]).initial_seed())
        results = sample(
            self.model,
            prompts,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            eos_id=self.tok.eos_id,
            pad_id=self.tok.pad_id,
            generator=gen,
            topk=topk,
        )
        groups = []
        for gi, (group_id, problem) in enumerate(requests):
            samples = []
            for j in range(n_samples):
                r = results[gi * n_samples + j]
                r.update(
                    prompt_ids=prompts[gi * n_samples + j],
                    label=problem.answer,
                    group_id=group_id,
                    sample_idx=j,
                    version=self.version,
                    reward=answer_reward(r["response_ids"], problem.answer, self.tok),
                )
                samples.append(r)
            groups.append(Group(group_id=group_id, version=self.version, samples=samples))
        return groups

    def evaluate(
        self, problems: list[Problem], *, k: int, temperature: float, top_p: float, max_new_tokens: int, seed: int
    ) -> list[list[bool]]:
        """correct[prompt][sample] for k samples per held-out prompt (seeded by version)."""
        prompts = [self._prompt_ids(p) for p in problems for _ in range(k)]
        gen = request_generator(seed, "eval", self.version)
        results = sample(
            self.model,
            prompts,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            eos_id=self.tok.eos_id,
            pad_id=self.tok.pad_id,
            generator=gen,
        )
        return [
            [answer_reward(results[i * k + j]["response_ids"], p.answer, self.tok) == 1.0 for j in range(k)]
            for i, p in enumerate(problems)
        ]
