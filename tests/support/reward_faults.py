"""A verifier for reward workers that fails on demand (``RewardPool(verifier="support.reward_faults:verify")``).

The test writes a fault into the file named by ``EPIC_SLIME_REWARD_FAULT_FILE``; the first call of
any worker that finds it takes it (an atomic rename, so exactly one call fails) and fails that
way; every other call is the real math-verify ``verify_equivalent``. Faults: ``raise`` (an error
inside math-verify / sympy), ``hang`` (sympy that never returns), ``exit`` (``os._exit`` mid-call),
``sigkill`` (killed mid-call, as by the OOM killer), ``not_bool`` (an answer that is neither True
nor False, here the truthy string "False"), ``fatal`` (an error whose message itself fails: the
worker's own error handling raises, so it answers "fatal" and exits).
"""

from __future__ import annotations

import os
import signal
import time

from epic_slime.reward.equivalence import verify_equivalent

FAULT_FILE_ENV = "EPIC_SLIME_REWARD_FAULT_FILE"


def _take_fault() -> str | None:
    path = os.environ.get(FAULT_FILE_ENV)
    if not path:
        return None
    taken = f"{path}.taken.{os.getpid()}"
    try:
        os.rename(path, taken)
    except FileNotFoundError:
        return None
    with open(taken) as handle:
        fault = handle.read().strip()
    os.unlink(taken)
    with open(path + ".started", "w") as handle:  # the test waits for this before killing from outside
        handle.write(str(os.getpid()))
    return fault


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("the error's message cannot be built")


def verify(prediction: str, reference: str):
    fault = _take_fault()
    if fault == "raise":
        raise ValueError("sympy: maximum recursion depth exceeded while simplifying")
    if fault == "hang":
        signal.signal(signal.SIGALRM, signal.SIG_IGN)  # nothing inside the worker ends it
        while True:
            time.sleep(0.1)
    if fault == "exit":
        os._exit(7)
    if fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "not_bool":
        return "False"
    if fault == "fatal":
        raise _Unprintable()
    if fault is not None:
        raise AssertionError(f"unknown fault {fault!r}")
    return verify_equivalent(prediction, reference)
