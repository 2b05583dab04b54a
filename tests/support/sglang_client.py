"""A client of the SGLang stand-in for tests: start it in a subprocess, call its HTTP endpoints,
build prompts of the tiny task and the models to check its log-probs against."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import requests
import torch

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "support" / "sglang_standin.py"
MAX_NEW = 48  # the tiny model holds 64 positions


class StandIn:
    """The stand-in in a subprocess on 127.0.0.1 (stopped by its pid)."""

    def __init__(self, workdir: Path, *args: str):
        port_file = workdir / f"port_{time.monotonic_ns()}"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        self.log = open(workdir / "standin.log", "a")
        self.proc = subprocess.Popen(
            [sys.executable, str(STANDIN), "--port-file", str(port_file), *args],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 120
        while not port_file.exists():
            assert self.proc.poll() is None and time.time() < deadline, f"stand-in did not start: {self.log.name}"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{int(port_file.read_text())}"
        self.http = requests.Session()
        self.http.trust_env = False
        self.pool = concurrent.futures.ThreadPoolExecutor(8)

    def post(self, path, body=None, **kw):
        return self.http.post(self.url + path, json=body if body is not None else {}, timeout=60, **kw)

    def get(self, path, **kw):
        return self.http.get(self.url + path, timeout=60, **kw)

    def submit(self, input_ids, max_new_tokens=MAX_NEW, temperature=1.0, top_p=1.0, **extra):
        """/generate in the background; a future of the JSON answer."""
        body = {
            "input_ids": input_ids,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p},
        }
        return self.pool.submit(lambda: self.post("/generate", {**body, **extra}).json())

    def stats(self):
        return self.get("/stats").json()

    def wait_for(self, predicate, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            stats = self.stats()
            if predicate(stats):
                return stats
            time.sleep(0.01)
        raise AssertionError(f"condition not reached: {self.stats()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.log.close()


@contextlib.contextmanager
def standin_factory(workdir: Path):
    """``start(*flags)`` -> a started StandIn; all of them stopped on exit."""
    started = []

    def start(*args):
        server = StandIn(workdir, *args)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


def tokens_of(text: str) -> list[int]:
    from epic_slime.runtime.task import BOS, Tokenizer

    tok = Tokenizer()
    return [tok.token_to_id[BOS]] + [tok.token_to_id[c] for c in text]


def perturbed_models(tmp_path):
    """The stand-in's initial weights and perturbed ones (saved for /update_weights_from_disk)."""
    from epic_slime.runtime.model import ModelConfig, build_policy
    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    old = build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=0).eval()
    new = build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=0).eval()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    path = tmp_path / "new.pt"
    torch.save(new.state_dict(), path)
    return old, new, str(path), tok


@torch.no_grad()
def logprobs_under(model, tok, prompt, tokens, mask_stop: bool) -> list[float]:
    """log_softmax(logits)[token] of each response token under ``model`` (T = 1), end-of-sequence
    masked as the stand-in's min_new_tokens does."""
    out = []
    for j, t in enumerate(tokens):
        ids = torch.tensor([prompt + tokens[:j]])
        logits = model(input_ids=ids, use_cache=False).logits[0, -1].float()
        if mask_stop:
            logits[tok.eos_id] = float("-inf")
        out.append(float(torch.log_softmax(logits, -1)[t]))
    return out
