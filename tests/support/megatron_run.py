"""Running tests/support/megatron_worker.py from a test: its preconditions (skip reasons), its
environment (the vendored Megatron-LM `megatron.training` and slime on PYTHONPATH) and its JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from support.slime_args import slime_path

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "support" / "megatron_worker.py"
MEGATRON_LM = REPO.parent / "shared" / "vendor" / "megatron-lm-core_v0.16.1"


def megatron_lm_path() -> Path | None:
    env = os.environ.get("EPIC_SLIME_MEGATRON_LM_PATH")
    path = Path(env) if env else MEGATRON_LM
    return path if (path / "megatron" / "training").is_dir() else None


def skip_reason() -> str | None:
    """Why the Megatron tests cannot run here, or None. A megatron-core other than the pin is not a
    skip: the worker refuses it with its own message (support.megatron_cpu.check_version)."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        return "megatron-core==0.16.1 is not installed (the slime-contract extra)"
    if slime_path() is None:
        return "slime's source is absent (SLIME_PATH or ../shared/vendor/slime-624b824a)"
    if megatron_lm_path() is None:
        return "Megatron-LM's megatron.training is absent (../shared/vendor/megatron-lm-core_v0.16.1)"
    for module in ("six", "triton", "wandb"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (the megatron-cpu extra: what megatron.training and slime import)"
    return None


def worker_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO), slime_path(), str(megatron_lm_path()), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["SLIME_PATH"] = slime_path()
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def start(scenario: str, tp: int, out: Path, **env: str) -> subprocess.Popen:
    log = open(out.with_suffix(".log"), "w")  # noqa: SIM115 - closed by `finish`
    return subprocess.Popen(
        [sys.executable, str(WORKER), scenario, str(tp), str(out)],
        env=worker_env(**env),
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def wait_or_kill(proc: subprocess.Popen, timeout: float) -> None:
    """Wait for ``proc`` up to ``timeout`` seconds; one still running when the wait ends (its timeout
    raised, or the test interrupted) is killed and reaped before the error goes on."""
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def finish(proc: subprocess.Popen, out: Path, timeout: float) -> tuple[int, str, dict | None]:
    """(exit code, the log's tail, the JSON result or None)."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log = out.with_suffix(".log").read_text()
    result = None
    if proc.returncode == 0 and out.is_file():
        if out.suffix == ".pt":
            import torch

            result = torch.load(out)
        else:
            result = json.loads(out.read_text())
    return proc.returncode, log[-4000:], result


def finish_all(procs: dict, outs: dict, timeout: float) -> dict:
    """`finish` for several workers started together; none outlives the call (a test's time limit
    interrupts the wait: the rest are killed then)."""
    try:
        return {key: finish(proc, outs[key], timeout) for key, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
