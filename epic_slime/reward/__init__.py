"""Math answer verifier: ``math_reward(response, label) -> 1.0 | 0.0``.

Pipeline: extract the final answer (last ``Answer:`` line, else last ``\\boxed{}``), normalise
both sides (cheap string rules), decide identical strings and plain numbers at once, and send
the rest to math-verify in an isolated worker process with a hard deadline (default 5 s; a
miss scores 0.0 and is counted). Safe from any thread and inside Ray actors.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from epic_slime.reward.extract import extract_final_answer, last_boxed
from epic_slime.reward.normalize import as_plain_number, is_multi_value, normalize_answer
from epic_slime.reward.pool import RewardPool, RewardWorkerError

__all__ = [
    "math_reward",
    "math_rewards",
    "judge",
    "extract_final_answer",
    "last_boxed",
    "normalize_answer",
    "RewardPool",
    "RewardWorkerError",
    "get_default_pool",
    "shutdown_default_pool",
    "reward_stats",
    "DEFAULT_TIMEOUT_S",
    "MAX_ANSWER_CHARS",
]

DEFAULT_TIMEOUT_S = 5.0
# Longer extracted answers score 0.0 at once (counted as "too_long"): no gold answer of the
# benchmarks comes close, and it spares a worker kill per degenerate response.
MAX_ANSWER_CHARS = 1000

_default_pool: RewardPool | None = None
_pool_lock = threading.Lock()
_stats_lock = threading.Lock()
_stats = {"calls": 0, "no_answer": 0, "too_long": 0, "fast_path": 0, "math_verify": 0, "no_verdict": 0}


def get_default_pool() -> RewardPool:
    """The process-wide pool (started on first use, closed at exit)."""
    global _default_pool
    with _pool_lock:
        if _default_pool is None or _default_pool._closed or _default_pool._owner_pid != os.getpid():
            _default_pool = RewardPool(timeout=DEFAULT_TIMEOUT_S)
        return _default_pool


def shutdown_default_pool() -> None:
    global _default_pool
    with _pool_lock:
        if _default_pool is not None:
            _default_pool.close()
            _default_pool = None


def _count(name: str) -> None:
    with _stats_lock:
        _stats[name] += 1


def reward_stats() -> dict[str, int]:
    """Counters of this process: calls, fast_path, math_verify, no_answer, too_long,
    no_verdict (the verifier's own failures, scored 0.0, never 1.0: a call past its deadline, a
    verifier that raised or answered no bool, a worker that died mid-call), plus the default
    pool's own counters (``pool_timeouts``, ``pool_worker_errors``, ``pool_worker_deaths``, ...)."""
    with _stats_lock:
        stats = dict(_stats)
    if _default_pool is not None:
        stats.update({f"pool_{k}": v for k, v in _default_pool.stats().items()})
    return stats


def judge(response: str, label: str, max_answer_chars: int = MAX_ANSWER_CHARS):
    """Everything except math-verify: returns (verdict or None, prediction, reference).

    A verdict of None means the pair needs math-verify.
    """
    if label is None or not str(label).strip():
        raise ValueError(f"math_reward: label must be a non-empty answer string, got {label!r}")
    _count("calls")
    extracted = extract_final_answer(response)
    if extracted is None:
        _count("no_answer")
        return False, "", ""
    reference = normalize_answer(str(label))
    multi = is_multi_value(reference)
    if multi:
        reference = normalize_answer(str(label), multi_value=True)
    prediction = normalize_answer(extracted, multi_value=multi)
    if not prediction:
        _count("no_answer")
        return False, prediction, reference
    if len(prediction) > max_answer_chars:
        _count("too_long")
        return False, prediction, reference
    if prediction == reference:
        _count("fast_path")
        return True, prediction, reference
    pred_number, ref_number = as_plain_number(prediction), as_plain_number(reference)
    if pred_number is not None and ref_number is not None:
        _count("fast_path")
        return pred_number == ref_number, prediction, reference
    return None, prediction, reference


def _decide(prediction: str, reference: str, timeout: float, pool: RewardPool | None) -> float:
    _count("math_verify")
    verdict = (pool or get_default_pool()).verify(prediction, reference, timeout=timeout)
    if verdict is None:
        _count("no_verdict")
        return 0.0
    return 1.0 if verdict else 0.0


def math_reward(
    response: str,
    label: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    pool: RewardPool | None = None,
    max_answer_chars: int = MAX_ANSWER_CHARS,
) -> float:
    """1.0 if the final answer of ``response`` equals ``label``, else 0.0.

    Blocks at most about ``timeout`` seconds (plus a one-off worker start-up on first use).
    """
    verdict, prediction, reference = judge(response, label, max_answer_chars)
    if verdict is not None:
        return 1.0 if verdict else 0.0
    return _decide(prediction, reference, timeout, pool)


def math_rewards(
    responses: Sequence[str],
    labels: Sequence[str],
    timeout: float = DEFAULT_TIMEOUT_S,
    pool: RewardPool | None = None,
    max_answer_chars: int = MAX_ANSWER_CHARS,
) -> list[float]:
    """Batch form of ``math_reward``: fast cases inline, the rest spread over the pool's workers."""
    if len(responses) != len(labels):
        raise ValueError(f"math_rewards: {len(responses)} responses but {len(labels)} labels")
    rewards: list[float] = [0.0] * len(responses)
    pending: list[tuple[int, str, str]] = []
    for index, (response, label) in enumerate(zip(responses, labels)):
        verdict, prediction, reference = judge(response, label, max_answer_chars)
        if verdict is None:
            pending.append((index, prediction, reference))
        else:
            rewards[index] = 1.0 if verdict else 0.0
    if pending:
        pool = pool or get_default_pool()
        with ThreadPoolExecutor(max_workers=pool.num_workers) as executor:
            results = executor.map(lambda item: _decide(item[1], item[2], timeout, pool), pending)
            for (index, _, _), reward in zip(pending, results):
                rewards[index] = reward
    return rewards
