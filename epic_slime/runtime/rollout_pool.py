"""``RolloutPool``: the embedded runtime's generation side. It owns the rollout workers, the
generations in flight, the version each worker holds, the weights by version, the data position
(group ids), the admission budget, the buffer of generated groups and the sample accounting, with
the operations the driver's schedule calls: fill, wait, collect, drain, top up, take a batch, state
and restore.

Asynchronous schedule: every idle worker gets a request whenever the admission budget and the memory
cap (``rollout_buffer_batches``) allow; new weights reach a worker with its next request (every
``update_weights_interval`` versions; ``--rollout-lag`` L: the version L behind the trainer). A worker
that dies is restarted on the newest weights and its requested groups leave the budget (counted lost).

The agent task (``rollout_agent``): a request runs one turn; groups with a trajectory still going come
back ``unfinished`` and wait in ``continuing`` until an idle worker runs their next turn, on the
weights it holds then. They were admitted with their first turn, so they pass the budget and the cap.
"""

from __future__ import annotations

import sys
from collections import deque

from epic_slime.admission import AdmissionBudget

from .batches import Accounting, Group, Selection, select_batch, trainable_groups
from .config import RuntimeConfig
from .tasks import get_task, train_problem

MAX_WORKER_RESTARTS = 20


class RolloutPool:
    def __init__(self, cfg: RuntimeConfig):
        self.cfg = cfg
        self.workers: list = []
        self.pending: dict = {}  # future -> (worker index, requests, version)
        self.worker_versions: list[int] = []
        self.version = 0  # the trainer's newest weight version (= its finished steps)
        self.weights_ref = None  # the newest weights
        self.weights_by_version: dict = {}  # --rollout-lag: version -> weights ref (the L + 1 newest)
        self.next_group_id = 0  # data position
        # the runtime trains its first batch on the initial weights: first_train_version 0
        self.budget = AdmissionBudget(cfg.rollout_batch_size, cfg.max_staleness, first_train_version=0)
        self.buffer: deque[Group] = deque()  # generated, not yet trained or dropped
        self.continuing: list[Group] = []  # the agent task: admitted, between two turns (by group id)
        self.agent = get_task(cfg.task_name).agent
        self.acc = Accounting()
        self.trained_group_ids: list[int] = []
        self.dropped_group_ids: list[int] = []

    # ---------------- workers and weights ----------------
    @property
    def prompts_per_request(self) -> int:
        return max(1, self.cfg.rollout_batch_size // self.cfg.num_rollout_workers)

    def start(self, weights_ref) -> None:
        """The workers, on the trainer's current weights (a resumed run's version included)."""
        self.weights_ref = weights_ref
        self.weights_by_version = {self.version: weights_ref}
        self.workers = [self._new_worker(i) for i in range(self.cfg.num_rollout_workers)]
        self.worker_versions = [self.version] * self.cfg.num_rollout_workers

    def new_weights(self, version: int, weights_ref) -> None:
        self.version, self.weights_ref = version, weights_ref
        if self.cfg.rollout_lag:  # keep the L + 1 newest versions' weights for the lagged rollouts
            self.weights_by_version[version] = weights_ref
            for v in [v for v in self.weights_by_version if v < version - self.cfg.rollout_lag]:
                del self.weights_by_version[v]

    def _new_worker(self, i: int):
        from .actors import RolloutWorker

        c = self.cfg
        return RolloutWorker.options(num_cpus=1).remote(
            i, c.model, self.weights_ref, self.version, c.rollout_dtype, c.seed, c.rollout_router_noise
        )

    def on_policy(self) -> None:
        """Synchronous schedule: every worker gets the newest weights (--rollout-lag: L behind) next."""
        for i in range(len(self.workers)):
            self.worker_versions[i] = -1

    def _sampling(self) -> dict:
        c = self.cfg
        from epic_slime.losses import LOSS_MODES

        topk = c.policy_loss_topk if LOSS_MODES[c.policy_loss].needs_topk else 0
        return dict(
            n_samples=c.n_samples_per_prompt,
            temperature=c.rollout_temperature,
            top_p=c.rollout_top_p,
            max_new_tokens=c.rollout_max_response_len,
            seed=c.seed,
            topk=topk,
            **({"max_turns": c.agent_max_turns} if self.agent else {}),
        )

    # ---------------- requests ----------------
    def next_requests(self, count: int | None = None) -> list:
        reqs = []
        for _ in range(self.prompts_per_request if count is None else count):
            reqs.append((self.next_group_id, train_problem(self.next_group_id, self.cfg.seed, self.cfg.task)))
            self.next_group_id += 1
        return reqs

    def pending_samples(self) -> int:
        return sum(len(r) for _, r, _ in self.pending.values()) * self.cfg.n_samples_per_prompt

    def buffered_samples(self) -> int:
        return sum(len(g) for g in self.buffer)

    def continuing_samples(self) -> int:
        return sum(len(g) for g in self.continuing)

    def _lagged_version(self) -> int:
        """--rollout-lag L (sync): the version every batch is generated with, L behind the trainer (the
        first L steps, before version L exists, start from version 0: lags 0, 1, ..., L - 1)."""
        return max(0, self.version - self.cfg.rollout_lag)

    def submit_version(self, i: int) -> tuple[bool, int]:
        """Whether worker i gets the newest weights with its next request, and the version it generates with."""
        if self.cfg.rollout_lag:
            target = self._lagged_version()
            return self.worker_versions[i] != target, target
        send = self.worker_versions[i] + self.cfg.update_weights_interval <= self.version or self.worker_versions[i] < 0
        return send, (self.version if send else self.worker_versions[i])

    def room(self, i: int) -> int:
        """The admission budget (``AdmissionBudget``, first_train_version 0: group n in start order
        trains at step floor(n / B) at version floor(n / B), so it may start at version g only while
        n < (g + K + 1) B) and, on top, the memory cap (``rollout_buffer_batches``)."""
        cap = self.cfg.rollout_buffer_batches * self.cfg.samples_per_step
        request = self.prompts_per_request * self.cfg.n_samples_per_prompt
        if self.buffered_samples() + self.pending_samples() + self.continuing_samples() + request > cap:
            return 0
        _, version = self.submit_version(i)
        return min(self.prompts_per_request, self.budget.room(version))

    def first_unfinished(self) -> int | None:
        """The oldest group still generating: a batch in start order waits for it."""
        ids = [_group_id(r) for _, reqs, _ in self.pending.values() for r in reqs]
        ids += [g.group_id for g in self.continuing]
        return min(ids) if ids else None

    def submit(self, i: int, count: int | None = None) -> None:
        """A request of ``count`` prompts (default ``prompts_per_request``) to worker i."""
        reqs = self.next_requests(count)
        self.budget.start(len(reqs))
        self._send(i, reqs)

    def submit_continuing(self, i: int) -> None:
        """The next turn of the oldest unfinished groups to worker i (admitted already: no budget)."""
        reqs, self.continuing = self.continuing[: self.prompts_per_request], self.continuing[self.prompts_per_request :]
        self._send(i, reqs)

    def _send(self, i: int, reqs: list) -> None:
        send, version = self.submit_version(i)
        weights = (self.weights_by_version[version] if self.cfg.rollout_lag else self.weights_ref) if send else None
        fut = self.workers[i].generate.remote(reqs, weights, version, self._sampling())
        self.pending[fut] = (i, reqs, version)
        if send:
            self.worker_versions[i] = version

    def idle_workers(self) -> list[int]:
        busy = {i for i, _, _ in self.pending.values()}
        return [i for i in range(len(self.workers)) if i not in busy]

    def fill(self) -> None:
        """A request to every idle worker the budget and the cap have room for."""
        for i in self.idle_workers():
            if self.continuing:  # trajectories already admitted go first
                self.submit_continuing(i)
                continue
            room = self.room(i)  # the last request before the budget's limit may be smaller
            if room > 0:
                self.submit(i, room)

    def submit_idle(self) -> None:
        """A full request to every idle worker (the synchronous schedule: no budget)."""
        for i in self.idle_workers():
            self.submit(i)

    # ---------------- results ----------------
    def owns(self, fut) -> bool:
        return fut in self.pending

    def wait(self, also: list, timeout: float = 1.0):
        """The first finished of the generations in flight and ``also`` (None entries skipped), or
        None after ``timeout`` seconds."""
        import ray

        waits = list(self.pending) + [f for f in also if f]
        if not waits:
            raise RuntimeError(
                f"driver stalled: nothing in flight and no trainable batch (buffered {self.buffered_samples()} samples)"
            )
        ready, _ = ray.wait(waits, num_returns=1, timeout=timeout)
        return ready[0] if ready else None

    def collect(self, fut) -> None:
        import ray

        i, reqs, _version = self.pending.pop(fut)
        try:
            groups = ray.get(fut)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError, ray.exceptions.WorkerCrashedError) as e:
            self._restart_worker(i, len(reqs) * self.cfg.n_samples_per_prompt, e)
            return
        for g in groups:
            if g.unfinished:
                self.continuing.append(g)
                continue
            self.buffer.append(g)
            self.acc.generated += len(g)
        self.continuing.sort(key=lambda g: g.group_id)

    def _restart_worker(self, i: int, lost_samples: int, error) -> None:
        self.budget.discard(lost_samples // self.cfg.n_samples_per_prompt)  # lost groups leave the budget
        self.acc.lost += lost_samples
        self.acc.worker_restarts += 1
        if self.acc.worker_restarts > MAX_WORKER_RESTARTS:
            raise RuntimeError(f"rollout workers died {self.acc.worker_restarts} times; giving up") from error
        print(
            f"[epic-slime] rollout worker {i} died ({type(error).__name__}); restarting it, "
            f"{lost_samples} requested samples lost",
            file=sys.stderr,
        )
        self.workers[i] = self._new_worker(i)
        self.worker_versions[i] = self.version

    def drain(self) -> None:
        """Collect every generation in flight (the agent task: every trajectory to its end)."""
        import ray

        while self.pending or self.continuing:
            for i in self.idle_workers():
                if self.continuing:
                    self.submit_continuing(i)
            ready, _ = ray.wait(list(self.pending), num_returns=1)
            self.collect(ready[0])
        if self.cfg.rollout_mode == "sync":
            # requests finish in any order; the batch (and so each minibatch) must not depend on it
            self.buffer = deque(sorted(self.buffer, key=lambda g: g.group_id))

    def trainable_groups(self) -> int:
        return trainable_groups(self.buffer, self.version, self.cfg.max_staleness, self.cfg.stale_policy)

    def top_up(self) -> None:
        """Generate (all workers, current weights) until the buffer holds one full trainable batch."""
        while self.trainable_groups() < self.cfg.rollout_batch_size:
            for i in range(len(self.workers)):
                self.submit(i)
            self.drain()

    # ---------------- batches ----------------
    def take_batch(self) -> Selection:
        """The next batch in start order (None when not ready); the groups dropped on the way leave the
        budget and are counted."""
        sel = select_batch(
            self.buffer,
            self.version,
            self.cfg.rollout_batch_size,
            self.cfg.max_staleness,
            self.cfg.stale_policy,
            first_unfinished=self.first_unfinished(),
        )
        self.budget.discard(len(sel.dropped))
        for g in sel.dropped:
            self.acc.dropped += len(g)
            self.dropped_group_ids.append(g.group_id)
        if sel.batch is not None:
            self.acc.stale_kept += sel.stale_kept
        return sel

    def trained(self, batch: list[Group], lags: list[int]) -> None:
        """A step trained ``batch`` (``lags``: one per sample)."""
        self.acc.trained += sum(len(g) for g in batch)
        for lag in lags:
            self.acc.lag_hist[lag] += 1
        self.trained_group_ids.extend(g.group_id for g in batch)

    # ---------------- checkpoints ----------------
    def state(self) -> dict:
        """What a checkpoint saves of the pool (checkpoint.DRIVER_STATE_KEYS; quiescent: nothing in flight)."""
        assert not self.pending and not self.continuing, "a checkpoint is taken with nothing in flight"
        return {
            "next_group_id": self.next_group_id,
            "buffer": list(self.buffer),
            "accounting": self.acc.state(),
            "trained_group_ids": self.trained_group_ids,
            "dropped_group_ids": self.dropped_group_ids,
        }

    def restore(self, state: dict) -> None:
        self.version = state["version"]
        self.next_group_id = state["next_group_id"]
        self.buffer = deque(state["buffer"])
        self.acc = Accounting.from_state(state["accounting"])
        self.trained_group_ids = list(state["trained_group_ids"])
        self.dropped_group_ids = list(state["dropped_group_ids"])
        # a checkpoint is quiescent (nothing generating or training): live = trained + buffered
        self.budget.restore(len(self.trained_group_ids) + len(self.buffer))


def _group_id(request) -> int:
    """A request's group: a (group_id, Problem) pair, or an unfinished ``Group`` (the agent task)."""
    return request.group_id if isinstance(request, Group) else request[0]
