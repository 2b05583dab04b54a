"""The real SGLang 0.5.15.post1 server and sglang-router 0.3.2 on CPU, for the tests that check a stand-in
against the engine it imitates, and for the end-to-end runs against real engines.

They run from a venv of their own (``.ci/sglang_venv.sh``: torch 2.14.1 + torchvision, sglang with
``--no-deps``), found by ``EPIC_SLIME_SGLANG_PYTHON`` or by the script's own cache key. The project's venv
keeps torch 2.13: the tests speak to the server over HTTP. The model is the embedded runtime's tiny
Qwen3-MoE, exported by ``epic_slime.runtime.hf_export`` (bf16 weights, the task's tokenizer).

Without the venv the tests that need it skip with the reason; with ``EPIC_SLIME_REQUIRE_REAL_SGLANG=1``
(``.ci/run`` sets it) a missing venv or a server that does not start is a failure, never a skip.
Launch flags: ``../shared/docs/sglang-cpu.md``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
REQUIRE_ENV = "EPIC_SLIME_REQUIRE_REAL_SGLANG"
PYTHON_ENV = "EPIC_SLIME_SGLANG_PYTHON"
# The server's start is mostly imports: 86-123 s measured at load 15-27; leave room for a loaded CI.
START_TIMEOUT_S = 420
MAX_NEW = 48  # the tiny model holds 64 positions (as the stand-in's client)

SERVER_FLAGS = (
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--sampling-backend",
    "pytorch",
    "--disable-overlap-schedule",
    "--cuda-graph-backend-decode",
    "disabled",
    "--cuda-graph-backend-prefill",
    "disabled",
    "--max-total-tokens",
    "4096",
    "--mem-fraction-static",
    "0.05",
    "--skip-server-warmup",
    # An idle scheduler otherwise polls its sockets in a busy loop: a whole core per server for the session
    # (measured 29.5 CPU-s per 30 s each). With two servers that is both of CI's cores, and the suite
    # starved (stop 40's CI timed out at 88 min, Ray actors not starting within 300 s). SGLang's own flag:
    # block on the sockets for up to 1 s when idle, wake at once on a request.
    "--sleep-on-idle",
)


def required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def venv_key() -> str:
    """The cache key ``.ci/sglang_venv.sh`` computes (sha256 of its requirements and itself, 16 hex)."""
    digest = hashlib.sha256()
    for name in ("sglang-cpu.txt", "sglang_venv.sh"):
        digest.update((REPO / ".ci" / name).read_bytes())
    return digest.hexdigest()[:16]


def sglang_python() -> str | None:
    """The real SGLang venv's python, or None when it is not provisioned on this machine."""
    explicit = os.environ.get(PYTHON_ENV)
    if explicit:
        return explicit if Path(explicit).exists() else None
    cache = os.environ.get("EPIC_SLIME_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "epic-slime"
    )
    venv = Path(cache) / f"sglang-venv-{venv_key()}"
    return str(venv / "bin" / "python") if (venv / ".complete").exists() else None


def unavailable_reason() -> str | None:
    if sglang_python() is None:
        return (
            f"the real SGLang venv is not provisioned (bash .ci/sglang_venv.sh, or {PYTHON_ENV}): "
            "the real-engine tests need SGLang 0.5.15.post1 and sglang-router 0.3.2"
        )
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # loopback only, never a proxy
    return session


class _Process:
    """A server process group on 127.0.0.1 with its log; stopped as a group (SGLang forks a scheduler and
    a detokenizer)."""

    def __init__(self, argv: list[str], log_path: Path, env: dict | None = None):
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.alive():
            self.signal(signal.SIGCONT)  # a test may have stopped it
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(10)
        else:  # the leader died (a kill in a test): its children may not have
            self.signal(signal.SIGKILL)
        self.log.close()

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of every live process in the group (the server, its scheduler and
        detokenizer), read from /proc."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)": state is field 3
                if int(fields[2]) == self.proc.pid:  # field 5: the process group
                    total += int(fields[11]) + int(fields[12])  # fields 14, 15: utime, stime
        return total / tick

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


class RealServer:
    """``python -m sglang.launch_server`` on the tiny checkpoint; the stand-in client's interface
    (``url``, ``post``, ``get``, ``submit``)."""

    kind = "real"

    def __init__(
        self,
        model_dir: str | Path,
        log_dir: Path,
        *extra: str,
        port: int | None = None,
        weight_version: str = "default",
    ):
        python = sglang_python()
        if python is None:
            raise RuntimeError(unavailable_reason())
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_dir = str(model_dir)
        env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
        # SGLang derives a gRPC port as --port + 10000 and refuses to start when that passes 65535 (a free
        # port above 55535: about one start in six); name one of its own
        env.setdefault("SGLANG_GRPC_PORT", str(free_port()))
        env.pop("PYTHONPATH", None)  # the project's path (slime, tests) is not the server's
        argv = [
            python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            self.model_dir,
            *SERVER_FLAGS,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--weight-version",
            weight_version,
            *extra,
        ]
        self.process = _Process(argv, Path(log_dir) / f"sglang_{self.port}.log", env)
        self.http = _http()
        self.pool = concurrent.futures.ThreadPoolExecutor(8)

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> "RealServer":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.process.alive():
                raise RuntimeError(
                    f"SGLang server exited (code {self.process.proc.returncode}); log "
                    f"{self.process.log_path}:\n{self.process.tail()}"
                )
            with contextlib.suppress(requests.RequestException):
                if self.http.get(self.url + "/health_generate", timeout=30).status_code == 200:
                    return self
            time.sleep(1.0)
        raise RuntimeError(
            f"SGLang server not healthy after {timeout:.0f} s; log {self.process.log_path}:\n{self.process.tail()}"
        )

    def post(self, path, body=None, **kw):
        kw.setdefault("timeout", 120)
        return self.http.post(self.url + path, json=body if body is not None else {}, **kw)

    def get(self, path, **kw):
        kw.setdefault("timeout", 120)
        return self.http.get(self.url + path, **kw)

    def submit(self, input_ids, max_new_tokens=MAX_NEW, temperature=1.0, top_p=1.0, **extra):
        """/generate in the background; a future of the JSON answer."""
        body = {
            "input_ids": input_ids,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p},
        }
        return self.pool.submit(lambda: self.post("/generate", {**body, **extra}).json())

    def weight_version(self) -> str:
        """The served weight version, from ``/model_info`` (``/get_weight_version`` is 404 in 0.5.15)."""
        return str(self.get("/model_info").json()["weight_version"])

    def alive(self) -> bool:
        return self.process.alive()

    def stop(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.process.stop()


class RealRouter:
    """``python -m sglang_router.launch_router`` in front of real servers."""

    def __init__(self, worker_urls: list[str], log_dir: Path, *extra: str, port: int | None = None):
        python = sglang_python()
        if python is None:
            raise RuntimeError(unavailable_reason())
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("PYTHONPATH", None)
        argv = [
            python,
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--prometheus-port",
            str(free_port()),
            *extra,
        ]
        if worker_urls:
            argv += ["--worker-urls", *worker_urls]
        self.process = _Process(argv, Path(log_dir) / f"router_{self.port}.log", env)
        self.http = _http()

    def wait_ready(self, timeout: float = 180) -> "RealRouter":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.process.alive():
                raise RuntimeError(f"sglang-router exited; log {self.process.log_path}:\n{self.process.tail()}")
            with contextlib.suppress(requests.RequestException):
                if self.http.get(self.url + "/workers", timeout=10).status_code == 200:
                    return self
            time.sleep(0.5)
        raise RuntimeError(f"sglang-router not ready after {timeout:.0f} s; log {self.process.log_path}")

    def workers(self) -> list[str]:
        """The worker URLs the router lists now."""
        body = self.http.get(self.url + "/workers", timeout=10).json()
        return sorted(w["url"] for w in body.get("workers", []))

    def wait_workers(self, expected: list[str], timeout: float = 60) -> list[str]:
        """``/workers`` POST and DELETE are queued (202): wait until the list is ``expected``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            listed = self.workers()
            if listed == sorted(expected):
                return listed
            time.sleep(0.25)
        raise AssertionError(f"router lists {self.workers()}, expected {sorted(expected)}")

    def stop(self) -> None:
        self.process.stop()


class RealEngines:
    """One real server behind the real router (the session fixture's value), shared by the tests.

    Construction exports the checkpoint and launches the server without waiting (the suite starts it at
    collection, so its 1.5-2 min of imports overlap other tests); ``ready()`` waits for it and starts
    the router in front of it."""

    def __init__(self, workdir: Path):
        from epic_slime.runtime.hf_export import export_initial_checkpoint

        self.workdir = Path(workdir)
        self.model_dir, self.model = export_initial_checkpoint(self.workdir / "tiny_qwen3_moe")
        self.server = RealServer(self.model_dir, self.workdir)
        self.router: RealRouter | None = None
        self.failure: str | None = None

    def ready(self) -> "RealEngines":
        if self.failure is not None:
            raise RuntimeError(self.failure)
        if self.router is None:
            try:
                self.server.wait_healthy()
                self.router = RealRouter([self.server.url], self.workdir).wait_ready()
                self.router.wait_workers([self.server.url])
            except Exception as exc:
                self.failure = f"{exc} (logs: {', '.join(self.logs())})"
                raise RuntimeError(self.failure) from exc
        return self

    def logs(self) -> list[str]:
        procs = [self.server.process] + ([self.router.process] if self.router else [])
        return [str(p.log_path) for p in procs]

    def stop(self) -> None:
        for part in (self.router, self.server):
            if part is not None:
                part.stop()


ATTACH_ENV = "EPIC_SLIME_REAL_ENGINES"


class _AttachedProcess:
    def __init__(self, log_path: str):
        self.log_path = Path(log_path)

    def alive(self) -> bool:
        return True


class AttachedEngines(RealEngines):
    """Engines already running (``python tests/support/real_sglang.py serve OUT.json`` wrote OUT.json),
    named by ``EPIC_SLIME_REAL_ENGINES=OUT.json``: a developer's rerun skips the 2-3 min start. Never
    stopped by the suite."""

    def __init__(self, described: str | Path):
        import json

        from epic_slime.runtime.hf_export import export_initial_checkpoint

        info = json.loads(Path(described).read_text())
        self.workdir = Path(info["workdir"])
        self.model_dir = info["model_dir"]
        _, self.model = export_initial_checkpoint(Path(info["workdir"]) / "reference_export")
        self.server = object.__new__(RealServer)
        self.server.url, self.server.port, self.server.model_dir = (
            info["server"],
            int(info["server"].rsplit(":", 1)[1]),
            self.model_dir,
        )
        self.server.http, self.server.pool = _http(), concurrent.futures.ThreadPoolExecutor(8)
        self.server.process = _AttachedProcess(info["server_log"])
        self.router = object.__new__(RealRouter)
        self.router.url, self.router.port = info["router"], int(info["router"].rsplit(":", 1)[1])
        self.router.http, self.router.process = _http(), _AttachedProcess(info["router_log"])
        self.failure = None

    def ready(self) -> "AttachedEngines":
        return self

    def stop(self) -> None:
        self.server.pool.shutdown(wait=False, cancel_futures=True)


def engines_for_session(workdir: Path) -> RealEngines:
    """The suite's engines: the running ones ``EPIC_SLIME_REAL_ENGINES`` names, else freshly launched."""
    described = os.environ.get(ATTACH_ENV)
    return AttachedEngines(described) if described else RealEngines(workdir)


def serve(out: str) -> None:
    """Launch the engines, describe them in ``out`` (JSON) and keep them up until interrupted."""
    import json
    import tempfile

    engines = RealEngines(Path(tempfile.mkdtemp(prefix="epic-slime-real-sglang-"))).ready()
    Path(out).write_text(
        json.dumps(
            {
                "server": engines.server.url,
                "router": engines.router.url,
                "model_dir": engines.model_dir,
                "workdir": str(engines.workdir),
                "server_log": str(engines.server.process.log_path),
                "router_log": str(engines.router.process.log_path),
            }
        )
    )
    print(f"engines up; {ATTACH_ENV}={out}", flush=True)
    try:
        while engines.server.alive():
            time.sleep(5)
    finally:
        engines.stop()


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(REPO))
    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        raise SystemExit("usage: real_sglang.py serve OUT.json")
    serve(sys.argv[2])
