"""SGLang's ``/update_weights_from_tensor`` with CPU tensors (a CPU engine; on GPUs slime's colocated
updater sends CUDA IPC handles instead), made safe.

Measured against the real SGLang 0.5.15.post1 server (../shared/docs/sglang-cpu.md, and
``tests/slime_adapter/test_real_sglang_pushes.py``):

- the payload is the named tensors pickled by ``multiprocessing``'s ``ForkingPickler`` (torch's
  reductions: the tensor's storage moves to shared memory and only a handle travels), base64, one
  entry per tensor-parallel rank;
- under torch's default ``file_descriptor`` sharing strategy the handle is a file descriptor passed over
  a connection whose authentication SGLang's scheduler rejects (``AuthenticationError: digest sent was
  rejected``) and the whole server exits. Under ``file_system`` the handle is a file name, and it loads;
- ``file_system`` starts torch's ``torch_shm_manager`` on first use in the sending process. It outlives
  the sender: the server's scheduler keeps its connection to it, so one manager per sending process stays
  until the server stops (measured with torch 2.13 as the sender). Its stdout is its own hand-shake pipe
  and stdin / stderr /dev/null, so it holds no pipe of the sender's caller (a test reading the sender's
  output through a pipe returns when the sender exits: tested); the hang seen once (sglang-cpu.md) was
  not reproduced with this torch.

``cpu_tensor_update`` returns the request body and the shared copies, which must stay referenced until
the server has answered. No slime import. Test-only: the real-server push tests send with it.
"""

from __future__ import annotations

import base64
import contextlib
import io

FILE_SYSTEM = "file_system"


@contextlib.contextmanager
def file_system_sharing():
    """torch's ``file_system`` sharing strategy inside the block, the previous one after it."""
    import torch.multiprocessing as mp

    before = mp.get_sharing_strategy()
    mp.set_sharing_strategy(FILE_SYSTEM)
    try:
        yield
    finally:
        mp.set_sharing_strategy(before)


def _serialise(named: list) -> str:
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's reductions with ForkingPickler)

    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(named)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def cpu_tensor_update(tensors: dict, weight_version: str | None = None, tp_size: int = 1) -> tuple[dict, list]:
    """The ``/update_weights_from_tensor`` body for CPU ``tensors`` (name -> tensor), sent with
    ``flush_cache`` false (a flushing update kills the server while a request is held), and the shared
    copies to keep alive until the answer. The caller's tensors are copied, never moved to shared memory."""
    if any(t.device.type != "cpu" for t in tensors.values()):
        raise ValueError("cpu_tensor_update: every tensor must be on the CPU (GPU pushes go by CUDA IPC)")
    named = [(name, t.detach().to(copy=True).contiguous()) for name, t in tensors.items()]
    with file_system_sharing():
        entry = _serialise(named)
    body = {"serialized_named_tensors": [entry] * tp_size, "load_format": None, "flush_cache": False}
    if weight_version is not None:
        body["weight_version"] = weight_version
    return body, named
