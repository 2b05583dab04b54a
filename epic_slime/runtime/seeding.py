"""One random stream per request: the rollout workers and the agent's turns draw from a generator seeded by
the run's seed, a tag and the request's first id, so a request's samples do not depend on which worker
served it. Its own module: rollout.py and rollout_agent.py both use it, and rollout.py loads the agent's."""

from __future__ import annotations

import hashlib

import torch


def generator_for(key: str) -> torch.Generator:
    """A torch.Generator seeded by the first 63 bits of sha256(key): the same key, the same draws."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return torch.Generator().manual_seed(h & ((1 << 63) - 1))


def request_generator(seed: int, tag: str, first_id: int) -> torch.Generator:
    return generator_for(f"{tag}/{seed}/{first_id}")
