"""A weight push from the test process into the real SGLang server over a gloo group, as slime's
distributed updater makes it (init the group, per bucket the metadata over HTTP while the tensors are
broadcast from rank 0, destroy the group): for the tests that need a push without a whole slime
session (``tests/slime_adapter/test_real_sglang_pushes.py``)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from datetime import timedelta

import torch

from support.real_sglang import free_port

GROUP = "epic_test_push"


def push_distributed(server, tensors: dict[str, torch.Tensor], version: str, flush_cache: bool = True) -> dict:
    """Push ``tensors`` (name -> tensor) to ``server`` (a ``RealServer``) in one bucket; SGLang's answer.
    ``flush_cache`` false for a push while generation is paused in place or retracted (push_mode.py)."""
    import torch.distributed as dist

    from slime.utils.distributed_utils import init_process_group

    port = free_port()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        joined = pool.submit(
            server.post,
            "/init_weights_update_group",
            {
                "master_address": "127.0.0.1",
                "master_port": port,
                "rank_offset": 1,
                "world_size": 2,
                "group_name": GROUP,
                "backend": "gloo",
            },
        )
        # slime's own group set-up (the trainer side of connect_rollout_engines_from_distributed): its
        # store keys are the real server's (a hand-made PrefixStore + ProcessGroupGloo never meets it)
        group = init_process_group(
            backend="gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            world_size=2,
            rank=0,
            group_name=GROUP,
            timeout=timedelta(seconds=120),
        )
        joined.result().raise_for_status()
        try:
            names = list(tensors)
            answer = pool.submit(
                server.post,
                "/update_weights_from_distributed",
                {
                    "names": names,
                    "dtypes": [str(tensors[n].dtype).replace("torch.", "") for n in names],
                    "shapes": [list(tensors[n].shape) for n in names],
                    "group_name": GROUP,
                    "flush_cache": flush_cache,
                    "weight_version": version,
                },
            )
            for name in names:
                opts = dist.BroadcastOptions()
                opts.rootRank, opts.rootTensor = 0, 0
                group.broadcast([tensors[name].detach().contiguous()], opts).wait()
            reply = answer.result()
            reply.raise_for_status()
            return reply.json()
        finally:
            server.post("/destroy_weights_update_group", {"group_name": GROUP}).raise_for_status()
            with contextlib.suppress(Exception):  # not in the default world's registry when none exists
                dist.destroy_process_group(group)


def restore_initial_weights(engines, version: str, timeout: float = 120) -> None:
    """The server back on the exported initial checkpoint at ``version``. The update carries
    ``flush_cache`` false and the cache is flushed after, once idle: SGLang's default flush after the load
    asserts that it succeeded, and a request still queued (a test's probe, a stray generate) made it fail
    and killed the server."""
    server = engines.server
    reply = server.post(
        "/update_weights_from_disk", {"model_path": engines.model_dir, "weight_version": version, "flush_cache": False}
    )
    reply.raise_for_status()
    if not reply.json().get("success"):
        raise RuntimeError(f"restoring the initial weights failed: {reply.json()}")
    deadline = time.monotonic() + timeout
    while server.get("/flush_cache").status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server.url}/flush_cache still refused after {timeout:.0f} s")
        time.sleep(0.5)
