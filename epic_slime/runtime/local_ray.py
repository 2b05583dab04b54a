"""The local Ray instance the embedded runtime runs on (loopback only, no dashboard)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

RAY_AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


def init_local_ray(num_cpus: int = 4) -> None:
    """Start the local Ray instance (a run's own, or one runs share: `run_training(..., reuse_ray=True)`).
    Local Ray only: no dashboard, loopback address, no runtime_env features that need the network."""
    import ray

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray 2.60 turns token authentication on for a new local cluster (RAY_AUTH_MODE unset) and logs a notice
    # saying so on every run: keep Ray's choice (or the user's RAY_AUTH_MODE) and quiet only that notice.
    # Setting RAY_AUTH_MODE=token here instead breaks the run: Ray read its config at import, so this
    # process stays at 'disabled' while the cluster it starts demands a token.
    logging.getLogger(RAY_AUTH_NOTICE_LOGGER).setLevel(logging.ERROR)
    # workers must import this checkout's epic_slime (the project is not necessarily pip-installed)
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=True,
        configure_logging=False,
        logging_level="ERROR",
        _node_ip_address="127.0.0.1",
    )
