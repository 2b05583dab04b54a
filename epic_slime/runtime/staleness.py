"""Staleness control and sample accounting (pure Python; the driver owns one of each).

A group = the n responses to one prompt, generated in one request with one weight version, so
every sample of a group has the same lag. lag = trainer version at training time - the version
that generated the sample. K = max_staleness: lag > K is dropped (stale_policy "drop") or trained
anyway and counted (stale_policy "keep"). Both are counted, every trained lag is histogrammed.

Invariant checked after every step: generated = trained + dropped + buffered (generated but not
yet trained, the "in flight" samples of the issue); requests to workers that died are counted as
lost samples separately (never generated).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass
class Group:
    group_id: int              # data position of the prompt (unique over the run)
    version: int               # weight version that generated it
    samples: list[dict]        # prompt_ids, response_ids, behavior_log_probs, status, reward, ...

    def __len__(self) -> int:
        return len(self.samples)


@dataclass
class Selection:
    batch: list[Group] | None     # None: not enough fresh groups yet
    dropped: list[Group]          # removed for staleness (final)
    stale_kept: int = 0           # samples over K kept because stale_policy == "keep"


def select_batch(buffer: deque, current_version: int, n_groups: int, max_staleness: int,
                 stale_policy: str) -> Selection:
    """Take the oldest n_groups trainable groups (FIFO) from `buffer`, dropping stale ones on the way.

    Mutates `buffer`: dropped groups and the returned batch leave it; when fewer than n_groups
    trainable groups exist, those stay at the head and batch is None."""
    if stale_policy not in ("drop", "keep"):
        raise ValueError(f"stale_policy must be 'drop' or 'keep', got {stale_policy!r}")
    kept, dropped, rest = [], [], deque()
    while buffer:
        g = buffer.popleft()
        lag = current_version - g.version
        if lag < 0:
            raise RuntimeError(f"group {g.group_id} has version {g.version} newer than the trainer's {current_version}")
        if len(kept) < n_groups:
            if lag > max_staleness and stale_policy == "drop":
                dropped.append(g)
            else:
                kept.append(g)
        else:
            rest.append(g)
    if len(kept) < n_groups:
        buffer.extend(kept)
        buffer.extend(rest)
        return Selection(batch=None, dropped=dropped)
    buffer.extend(rest)
    stale_kept = sum(len(g) for g in kept if current_version - g.version > max_staleness)
    return Selection(batch=kept, dropped=dropped, stale_kept=stale_kept)


@dataclass
class Accounting:
    generated: int = 0        # samples returned by rollout workers
    trained: int = 0
    dropped: int = 0          # over K with stale_policy drop
    stale_kept: int = 0       # over K with stale_policy keep (also in trained)
    lost: int = 0             # requested from a worker that died before answering
    worker_restarts: int = 0
    lag_hist: Counter = field(default_factory=Counter)   # lag -> trained samples

    def check(self, buffered: int) -> None:
        if self.generated != self.trained + self.dropped + buffered:
            raise RuntimeError(f"sample accounting broken: generated {self.generated} != trained {self.trained} "
                               f"+ dropped {self.dropped} + buffered {buffered}")

    def state(self) -> dict:
        d = {k: getattr(self, k) for k in ("generated", "trained", "dropped", "stale_kept", "lost", "worker_restarts")}
        d["lag_hist"] = {str(k): v for k, v in sorted(self.lag_hist.items())}
        return d

    @classmethod
    def from_state(cls, d: dict) -> "Accounting":
        a = cls(**{k: d[k] for k in ("generated", "trained", "dropped", "stale_kept", "lost", "worker_restarts")})
        a.lag_hist = Counter({int(k): v for k, v in d["lag_hist"].items()})
        return a
