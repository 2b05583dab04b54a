"""The two engines the conformance suite (tests/slime_adapter/test_sglang_conformance*.py) runs each
test on: the SGLang stand-in (tests/support/sglang_standin.py, float32) and the real SGLang
0.5.15.post1 server (the session's ``real_engines``, bf16). Both are reached only over HTTP, with the
same client methods (``post``, ``get``, ``submit``); what differs is recorded here: the served
precision (so the log-prob tolerance), the checkpoint each starts from, and how to make a request
run long enough to meet a pause (``ignore_eos``, as SGLang takes it)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from support.sglang_group import sglang_process_group

LONG_NEW = 40  # a request that must still run when a pause comes (prompt + 40 < the model's 64 positions)


@dataclass
class Engine:
    kind: str  # "standin" | "real"
    server: object  # StandIn or RealServer: url, post, get, submit
    dtype: str  # the served precision: checkpoints for it are saved in it
    original_dir: str  # the checkpoint it serves at start (restored after a test that changed weights)
    max_gap: float  # |engine log-prob - float32 forward| per token, at most (the initial weights)
    mean_gap: float
    pushed_gap: float  # the same for the pushed weights (larger: bf16 noise grows with them)


def reference_model(seed: int = 0):
    """The runtime's tiny policy as both engines start from it (float32)."""
    from epic_slime.runtime.model import ModelConfig, build_policy
    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    return build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=seed).eval()


def perturbed_checkpoint(folder: Path, dtype: str, scale: float = 0.1, seed: int = 7):
    """Weights far from the initial ones, saved as a Hugging Face folder in ``dtype``; returns
    (folder, the float32 model equal to what was saved)."""
    from epic_slime.runtime.hf_export import export_checkpoint

    model = reference_model()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
            p.copy_(p.to(getattr(torch, dtype)).float())  # what the engine will hold
    return export_checkpoint(model, folder, dtype), model


@torch.no_grad()
def forward_logprobs(model, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / T)[token] of each token under one unpadded float32 forward (float64 out)."""
    ids = torch.tensor([prompt + tokens])
    logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1].double() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


@torch.no_grad()
def spliced_logprobs(old, new, sequence: list[int], old_positions: int, start: int) -> torch.Tensor:
    """The log-probs of ``sequence[start:]`` when the KV of its first ``old_positions`` positions was
    computed by ``old`` and the rest by ``new`` (a request paused in place across a weight update)."""
    ids = torch.tensor([sequence])
    past = old(input_ids=ids[:, :old_positions], use_cache=True).past_key_values
    tail = new(input_ids=ids[:, old_positions:], past_key_values=past, use_cache=True).logits[0].double()
    logits = torch.cat([old(input_ids=ids[:, :old_positions], use_cache=False).logits[0].double(), tail])
    rows = torch.log_softmax(logits[start - 1 : -1], -1)
    return rows.gather(1, torch.tensor(sequence[start:])[:, None])[:, 0]


def loads(server) -> tuple[int, int]:
    """(running, waiting) from ``/v1/loads`` (one DP rank)."""
    core = server.get("/v1/loads").json()["loads"][0]
    return core["num_running_reqs"], core["num_waiting_reqs"]


def wait_running(server, n: int = 1, timeout: float = 60, answer=None) -> bool:
    """Until n requests run; False when ``answer`` (a future) ended first: an idle CPU decodes a whole
    request on the real server in about 0.2 s, between two polls."""
    deadline = time.monotonic() + timeout
    while loads(server)[0] < n:
        if answer is not None and answer.done():
            return False
        assert time.monotonic() < deadline, f"{n} request(s) never ran: {loads(server)}"
        time.sleep(0.01)
    return True


def pause_while_running(server, prompt: list[int], body: dict, tries: int = 10):
    """A long request and a ``/pause_generation`` (``body``) that lands while it runs: (future, seconds
    the pause took). When the request ended first (an idle CPU), continue and try again. An abort pause
    must end it with the abort reason; a pause that holds it (in_place, retract) must leave it counted."""
    for _ in range(tries):
        answer = long_request(server, prompt)
        if wait_running(server, answer=answer):
            started = time.monotonic()
            assert server.post("/pause_generation", body).status_code == 200
            took = time.monotonic() - started
            if body.get("mode", "abort") == "abort":
                if answer.result(120)["meta_info"]["finish_reason"]["type"] == "abort":
                    return answer, took
            elif sum(loads(server)) == 1:
                return answer, took
            server.post("/continue_generation", {})
        answer.result(120)
    raise AssertionError(f"the request ended before the pause {body} in {tries} tries")


def long_request(server, prompt: list[int], new_tokens: int = LONG_NEW):
    """A request that runs its whole length (``ignore_eos``), submitted in the background."""
    body = {
        "input_ids": prompt,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 1.0, "ignore_eos": True},
    }
    return server.pool.submit(lambda: server.post("/generate", body).json())


class GlooPusher:
    """The trainer side of ``/update_weights_from_distributed`` (rank 0 of a gloo group with one
    engine): what slime's distributed updater does, without Megatron."""

    def __init__(self, server, group_name: str = "conformance_push"):
        # one name per group in this process (torch keeps a registry; destroying one frees its name)
        self.server, self.group_name = server, group_name
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        answer = {}
        joined = threading.Thread(
            target=lambda: answer.update(
                reply=server.post(
                    "/init_weights_update_group",
                    {
                        "master_address": "127.0.0.1",
                        "master_port": port,
                        "rank_offset": 1,
                        "world_size": 2,
                        "group_name": group_name,
                        "backend": "gloo",
                    },
                )
            )
        )
        joined.start()
        self.group = sglang_process_group("127.0.0.1", port, 0, 2, group_name)
        joined.join(150)
        reply = answer["reply"]
        assert reply.status_code == 200 and reply.json()["success"], reply.text

    def push(self, named: list[tuple[str, torch.Tensor]], weight_version: str | None = None) -> dict:
        """One bucket: the metadata by HTTP (flush_cache false, as slime sends), the tensors by broadcast."""
        import torch.distributed as dist

        body = {
            "names": [n for n, _ in named],
            "dtypes": [str(t.dtype).replace("torch.", "") for _, t in named],
            "shapes": [list(t.shape) for _, t in named],
            "group_name": self.group_name,
            "flush_cache": False,
        }
        if weight_version is not None:
            body["weight_version"] = weight_version
        answer = {}
        sent = threading.Thread(
            target=lambda: answer.update(reply=self.server.post("/update_weights_from_distributed", body))
        )
        sent.start()
        for _, tensor in named:
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.rootTensor = 0, 0
            self.group.broadcast([tensor.detach().contiguous()], opts).wait()
        sent.join(150)
        reply = answer["reply"]
        assert reply.status_code == 200, reply.text
        return reply.json()

    def close(self) -> None:
        import torch.distributed as dist

        self.server.post("/destroy_weights_update_group", {"group_name": self.group_name})
        dist.destroy_process_group(self.group)


class TensorPayload:
    """``serialized_named_tensors`` for ``/update_weights_from_tensor``, made in a child process
    (``tensor_sender.py``) that holds the shared tensors until ``close``. The child uses torch's
    ``file_system`` sharing strategy: under the default ``file_descriptor`` the server cannot
    rebuild CPU tensors and its scheduler dies. The child's output (and the ``torch_shm_manager`` it
    starts) goes to a log file, never to the test's stdout (a held pipe hung a piped run)."""

    def __init__(self, workdir: Path, named: list[tuple[str, torch.Tensor]], strategy: str = "file_system"):
        import subprocess
        import sys

        workdir.mkdir(parents=True, exist_ok=True)
        source, out = workdir / "named.pt", workdir / "payload.txt"
        torch.save(named, source)
        self.log = open(workdir / "sender.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("tensor_sender.py")), str(source), str(out), strategy],
            stdin=subprocess.PIPE,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while not out.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, (workdir / "sender.log").read_text()
            time.sleep(0.05)
        self.serialized = out.read_text()

    def close(self) -> None:
        import os
        import signal

        if self.proc.poll() is None:
            self.proc.stdin.close()  # the child exits when its stdin closes
            try:
                self.proc.wait(20)
            except Exception:  # noqa: BLE001
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


@pytest.fixture(scope="module", params=["standin", "real"])
def engine(request, tmp_path_factory):
    """Each conformance test once per engine: the stand-in (one per test module, slowed to 0.05 s a
    decode step so a pause meets a running request, as the real server's CPU speed does) and the
    session's real server (``real_engines``: skipped without its venv, a failure in CI)."""
    if request.param == "real":
        engines = request.getfixturevalue("real_engines")
        yield Engine(
            "real", engines.server, "bfloat16", str(engines.model_dir), max_gap=0.03, mean_gap=0.01, pushed_gap=0.08
        )
        return
    from epic_slime.runtime.hf_export import export_checkpoint
    from support.sglang_client import standin_factory

    workdir = tmp_path_factory.mktemp("standin")
    original = export_checkpoint(reference_model(), workdir / "initial", "float32")
    with standin_factory(workdir) as start:
        yield Engine(
            "standin",
            start("--step-seconds", "0.05"),
            "float32",
            original,
            max_gap=1e-4,
            mean_gap=1e-5,
            pushed_gap=1e-4,
        )


@pytest.fixture(autouse=True)
def never_left_paused(request):
    """After each conformance test, a /continue_generation to its engine (harmless when not paused): a test
    that fails between its pause and its continue would otherwise leave the shared real server paused, and
    every later test's requests would wait on it (seen once: five tests failed after one such pause)."""
    yield
    # Only the conformance engine (it has a server); a module may define its own fixture named engine.
    server = getattr((request.node.funcargs or {}).get("engine"), "server", None)
    if server is not None:
        import contextlib

        import requests

        with contextlib.suppress(requests.RequestException):
            server.post("/continue_generation", {})
