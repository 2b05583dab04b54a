"""The runtime's batches: buffered groups, the batch taken from them in start order, and the sample
accounting (pure Python). The drop rule is the shared one (``epic_slime.staleness.is_dropped``);
versions follow ``AdmissionBudget``'s convention with first_train_version 0 (the first batch trains on
the initial weights). consumed (generated) = trained + dropped for staleness + buffered, checked
every step."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from epic_slime.staleness import check_stale_policy, is_dropped, over_limit


@dataclass
class Group:
    group_id: int  # data position of the prompt (unique over the run)
    version: int  # weight version that generated it
    samples: list[dict]  # prompt_ids, response_ids, behavior_log_probs, status, reward, ...
    # the agent task: a group with a trajectory still between turns (``rollout_agent``); its version
    # is then its first turn's, which stays its oldest model token's
    unfinished: bool = False

    def __len__(self) -> int:
        return len(self.samples)


@dataclass
class Selection:
    batch: list[Group] | None  # None: not enough fresh groups yet
    dropped: list[Group]  # removed for staleness (final)
    stale_kept: int = 0  # samples over K kept because stale_policy == "keep"


def select_batch(
    buffer: deque,
    current_version: int,
    n_groups: int,
    max_staleness: int,
    stale_policy: str,
    first_unfinished: int | None = None,
) -> Selection:
    """Take the oldest n_groups trainable groups in START order (group_id: the data position, handed
    out as groups start) from `buffer`, dropping stale ones on the way.

    ``first_unfinished``: the id of the oldest group still generating (None: none). Only groups
    started before it may be in the batch, so a batch waits for its oldest groups (the admission
    budget's FIFO: ``AdmissionBudget``). Mutates `buffer` (left in start order): dropped groups and
    the returned batch leave it; when fewer than n_groups trainable groups are ready, those stay
    and batch is None (drops are final)."""
    check_stale_policy(stale_policy)
    kept, dropped, rest = [], [], deque()
    for g in sorted(buffer, key=lambda g: g.group_id):
        lag = current_version - g.version
        if lag < 0:
            raise RuntimeError(f"group {g.group_id} has version {g.version} newer than the trainer's {current_version}")
        ready = first_unfinished is None or g.group_id < first_unfinished
        if len(kept) < n_groups and ready:
            if is_dropped(lag, max_staleness, stale_policy):
                dropped.append(g)
            else:
                kept.append(g)
        else:
            rest.append(g)
    buffer.clear()
    if len(kept) < n_groups:
        buffer.extend(sorted(kept + list(rest), key=lambda g: g.group_id))
        return Selection(batch=None, dropped=dropped)
    buffer.extend(rest)
    stale_kept = sum(len(g) for g in kept if over_limit(current_version - g.version, max_staleness))
    return Selection(batch=kept, dropped=dropped, stale_kept=stale_kept)


def trainable_groups(buffer: deque, current_version: int, max_staleness: int, stale_policy: str) -> int:
    """How many buffered groups ``select_batch`` would train rather than drop at ``current_version``
    (the same gate: the runtime tops its buffer up to a full batch of these before a checkpoint)."""
    check_stale_policy(stale_policy)
    return sum(1 for g in buffer if not is_dropped(current_version - g.version, max_staleness, stale_policy))


@dataclass
class Accounting:
    generated: int = 0  # samples returned by rollout workers
    trained: int = 0
    dropped: int = 0  # over K with stale_policy drop
    stale_kept: int = 0  # over K with stale_policy keep (also in trained)
    lost: int = 0  # requested from a worker that died before answering
    worker_restarts: int = 0
    lag_hist: Counter = field(default_factory=Counter)  # lag -> trained samples

    def check(self, buffered: int) -> None:
        if self.generated != self.trained + self.dropped + buffered:
            raise RuntimeError(
                f"sample accounting broken: generated {self.generated} != trained {self.trained} "
                f"+ dropped {self.dropped} + buffered {buffered}"
            )

    def state(self) -> dict:
        d = {k: getattr(self, k) for k in ("generated", "trained", "dropped", "stale_kept", "lost", "worker_restarts")}
        d["lag_hist"] = {str(k): v for k, v in sorted(self.lag_hist.items())}
        return d

    @classmethod
    def from_state(cls, d: dict) -> "Accounting":
        a = cls(**{k: d[k] for k in ("generated", "trained", "dropped", "stale_kept", "lost", "worker_restarts")})
        a.lag_hist = Counter({int(k): v for k, v in d["lag_hist"].items()})
        return a
