"""What ``GroupStream`` does when an SGLang engine dies, hangs or comes back (issue 35).

Three rules, each counted (``rollout/faults/*``):

- **Behind-version guard.** Every healthy engine receives every push, so a reply that reports a weight
  version older than the one the stream knew had landed when it submitted that call came from an engine
  that missed the push: one that slime's fault tolerance restarted with its initial weights (it reports
  ``"default"``, version 0) and that registered with the router (``POST /workers``, in its init) before
  the push that gives it the current weights. Its tokens are never trained: the group is regenerated
  from its fresh prompt after ``behind_delay_s`` (the push is under way), at most ``MAX_BEHIND_REGENERATIONS``
  times in a row.
- **With ``--use-fault-tolerance``**: a group whose generate raised (slime's HTTP client gave up on a
  dead or hung engine that the router still lists) is regenerated, ``retry_delay_s`` apart, until
  ``recovery_deadline_s`` after its first failure: slime's health monitor removes a dead engine from
  the router within ``--rollout-health-check-first-wait`` + ``--rollout-health-check-interval`` +
  ``--rollout-health-check-timeout``; ``FT_MARGIN_S`` covers the removal itself and the request in flight.
- **Without it** nothing removes a dead engine from the router (slime starts the router with its own
  health check disabled), so a failed group first probes the router's ``GET /workers`` and each worker's
  ``GET /health`` (``PROBE_TIMEOUT_S``): a worker that does not answer ends the run with one line that
  names it and the checkpoint to resume from (``data_source.last_consistent_save``). Saves are atomic
  (a temporary name, then a rename; slime's state file last), so nothing is left half-written. When every
  worker answers the failure was transient: the group is regenerated, at most ``MAX_GROUP_ATTEMPTS`` tries.

A regenerated group keeps its place in the start order and its prompt is handed out once (the data
source's ledger is not touched), so no prompt is lost or trained twice.
"""

from __future__ import annotations

import asyncio
import logging
import time

logger = logging.getLogger(__name__)

MAX_GROUP_ATTEMPTS = 3  # without fault tolerance, when no engine is found dead
FT_MARGIN_S = 30.0  # on top of slime's health-check first wait + interval + timeout
RETRY_DELAY_S = 2.0  # between regenerations of a failed group under fault tolerance
BEHIND_DELAY_S = 1.0  # before regenerating a group a behind engine answered
MAX_BEHIND_REGENERATIONS = 120  # in a row, per group: an engine that never gets the push
PROBE_TIMEOUT_S = 2.0


class EngineFailedError(RuntimeError):
    """The run cannot go on: an engine is dead without fault tolerance, or stayed dead past the deadline."""


def recovery_deadline_s(args) -> float | None:
    """Seconds a failed group keeps being retried under ``--use-fault-tolerance`` (None without it)."""
    if not getattr(args, "use_fault_tolerance", False):
        return None
    return (
        float(getattr(args, "rollout_health_check_first_wait", 0) or 0)
        + float(getattr(args, "rollout_health_check_interval", 30.0))
        + float(getattr(args, "rollout_health_check_timeout", 30.0))
        + FT_MARGIN_S
    )


def router_url(args) -> str | None:
    ip, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
    return f"http://{ip}:{port}" if ip and port else None


def unhealthy_workers(router: str | None, timeout: float = PROBE_TIMEOUT_S) -> list[str]:
    """The workers the router lists whose ``/health`` does not answer 200 within ``timeout`` (blocking)."""
    import requests

    if router is None:
        return []
    session = requests.Session()
    session.trust_env = False
    try:
        listed = session.get(router + "/workers", timeout=timeout).json().get("workers", [])
    except (requests.RequestException, ValueError) as exc:
        return [f"the router {router} itself ({type(exc).__name__})"]
    dead = []
    for worker in listed:
        url = worker.get("url")
        try:
            ok = session.get(f"{url}/health", timeout=timeout).status_code == 200
        except requests.RequestException:
            ok = False
        if not ok:
            dead.append(url)
    return dead


def resume_hint(args) -> str:
    """Which checkpoint a resumed run should load (the latest whose data state and model are complete)."""
    import os

    from epic_slime.slime.data_source import last_consistent_save

    save = getattr(args, "save", None)
    if not save:
        return "No checkpoint to resume from (--save is not set): restart the run."
    if not os.path.isdir(os.path.join(save, "rollout")):
        return f"No checkpoint in {save} yet: restart the run."
    return f"{last_consistent_save(save, 1 << 62)} (--load {save})"


class EngineFaults:
    """The stream's fault decisions and counts (see the module docstring)."""

    def __init__(self, args):
        self.args = args
        self.deadline_s = recovery_deadline_s(args)
        self.router = router_url(args)
        self.first_failure: dict = {}  # group key -> monotonic time of its first failure in a row
        self.behind_in_a_row: dict = {}  # group key -> behind-version regenerations in a row
        self.counts = {
            "failed_calls": 0,
            "fault_retries": 0,
            "behind_version_regenerations": 0,
            "engines_found_dead": 0,
        }
        self.dead_engines: set[str] = set()  # distinct: several groups in flight may find the same engine dead
        self.probe = unhealthy_workers  # injectable (a test counts or replaces the probe)
        self.retry_delay_s, self.behind_delay_s = RETRY_DELAY_S, BEHIND_DELAY_S

    def metrics(self, prefix: str = "rollout/faults/") -> dict:
        return {prefix + k: float(v) for k, v in self.counts.items()}

    def succeeded(self, key) -> None:
        self.first_failure.pop(key, None)
        self.behind_in_a_row.pop(key, None)

    def behind_version(self, group, before, submitted_version: int) -> int | None:
        """The oldest version this call's replies reported, when it is below ``submitted_version``."""
        from epic_slime.slime.stream.gate import parse_weight_version

        reported = [
            parse_weight_version(v)
            for sample, (_, n) in zip(group, before, strict=True)
            for v in sample.weight_versions[n:]
        ]
        oldest = min(reported, default=None)
        return oldest if oldest is not None and oldest < submitted_version else None

    def behind_error(self, key, reported: int, submitted_version: int) -> EngineFailedError | None:
        """Count a behind-version reply; an error once the group met ``MAX_BEHIND_REGENERATIONS`` of them."""
        self.counts["behind_version_regenerations"] += 1
        n = self.behind_in_a_row[key] = self.behind_in_a_row.get(key, 0) + 1
        logger.warning(
            "rollout group %s: an engine answered with weight version %d, older than version %d that "
            "every healthy engine holds (a restarted engine before its push); regenerating it from its "
            "prompt, its samples are not trained (%d in a row)",
            key,
            reported,
            submitted_version,
            n,
        )
        if n > MAX_BEHIND_REGENERATIONS:
            return EngineFailedError(
                f"rollout group {key}: an engine kept answering with weight version {reported} < {submitted_version} "
                f"({n} times in a row): it never received the weight push. {resume_hint(self.args)}"
            )
        return None

    async def after_failure(self, key, attempt: int, exc: BaseException) -> Exception | None:
        """A generate call of group ``key`` raised: None to regenerate it (after a wait), else the error
        that ends the run."""
        self.counts["failed_calls"] += 1
        now = time.monotonic()
        first = self.first_failure.setdefault(key, now)
        if self.deadline_s is not None:
            if now - first >= self.deadline_s:
                dead = await self._probe()
                return EngineFailedError(
                    f"rollout group {key} kept failing for {now - first:.0f} s, past the fault-tolerance deadline "
                    f"of {self.deadline_s:.0f} s (--rollout-health-check-first-wait + interval + timeout + "
                    f"{FT_MARGIN_S:.0f} s); unhealthy engines: {', '.join(dead) or 'none found'}; last error "
                    f"{exc!r}. {resume_hint(self.args)}"
                )
            logger.warning(
                "rollout group %s raised %r; regenerating it in %.0f s (fault tolerance: %.0f s of %.0f s spent)",
                key,
                exc,
                self.retry_delay_s,
                now - first,
                self.deadline_s,
            )
            await asyncio.sleep(self.retry_delay_s)
            self.counts["fault_retries"] += 1
            return None
        dead = await self._probe()
        if dead:
            self.dead_engines.update(dead)
            self.counts["engines_found_dead"] = len(self.dead_engines)
            return EngineFailedError(
                f"SGLang engine {', '.join(dead)} does not answer /health (dead or hung) and the router still routes "
                f"to it; without --use-fault-tolerance nothing replaces it, so the run stops (last error {exc!r}). "
                f"{resume_hint(self.args)}"
            )
        if attempt >= MAX_GROUP_ATTEMPTS:
            return RuntimeError(f"group {key}: {attempt} attempts, last error {exc!r}")
        return None

    async def _probe(self) -> list[str]:
        return await asyncio.get_running_loop().run_in_executor(None, self.probe, self.router)
