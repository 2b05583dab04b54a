"""Ray's `worker_process_setup_hook` for slime's actor run under a real local Ray (issue 45 item 5,
tests/support/megatron_ray_run.py): what every worker process needs before slime's modules load
there, which slime's own `--custom-megatron-init-path` would apply too late (after the actor module's
imports).

Every worker: the paths; placeholders for the SGLang modules slime's rollout and actor modules import
(SGLang lives in its own venv); `slime.backends.sglang_utils.sglang_engine` replaced by `HttpEngine`
(the one stand-in of the rollout side, below); a log handler writing slime's per-step metric lines to
`EPIC_RAY_METRICS` (JSONL). A train actor (`EPIC_RAY_TRAIN_ACTOR=1`, set through slime's own
`--train-env-vars`) also gets the CPU Megatron harness: the patch set, the CPU accelerator, the local
layer names at slime's HF loader and converter (support.megatron_push) and numpy reported as 1.x for
slime's init assert (support.megatron_actor STANDINS)."""

from __future__ import annotations

import json
import logging
import os
import sys
import types
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


class HttpEngine:
    """slime's `SGLangEngine` Ray actor (slime/backends/sglang_utils/sglang_engine.py) as slime's external
    rollout mode and weight updater call it, forwarding to the real server over HTTP (slime's own engine
    actor imports SGLang, which cannot load in this venv). `init` takes the server's address as slime's
    `external_engine_init_kwargs` gives it: the server is already up and registered with the real router."""

    def __init__(
        self, args, rank, worker_type="regular", base_gpu_id=None, sglang_overrides=None, num_gpus_per_engine=1
    ):
        self.args, self.rank, self.worker_type = args, rank, worker_type
        self._http = None

    def init(
        self,
        dist_init_addr=None,
        port=None,
        nccl_port=None,
        host=None,
        disaggregation_bootstrap_port=None,
        router_ip=None,
        router_port=None,
    ):
        from support.slime_push import EngineActorStandIn

        self._http = EngineActorStandIn(f"http://{host}:{port}")

    def _call(self, name, *args, **kwargs):
        return getattr(self._http, f"_do_{name}")(*args, **kwargs)

    def pause_generation(self):
        return self._call("pause_generation")

    def continue_generation(self):
        return self._call("continue_generation")

    def flush_cache(self):
        return self._call("flush_cache")

    def init_weights_update_group(self, master_address, master_port, rank_offset, world_size, group_name, backend):
        return self._call(
            "init_weights_update_group",
            master_address=master_address,
            master_port=master_port,
            rank_offset=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
        )

    def destroy_weights_update_group(self, group_name):
        return self._call("destroy_weights_update_group", group_name)

    def update_weights_from_distributed(
        self, names, dtypes, shapes, group_name, flush_cache=False, weight_version=None, load_format=None
    ):
        return self._call(
            "update_weights_from_distributed",
            names,
            dtypes,
            shapes,
            group_name,
            flush_cache,
            weight_version,
            load_format,
        )

    def get_weight_version(self):
        from support.slime_push import _session

        return _session().get(f"{self._http.url}/model_info", timeout=30).json().get("weight_version")


class _MetricLines(logging.Handler):
    """slime's "step N: {...}" (train) and "perf N: {...}" (rollout) log lines, as JSONL."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def emit(self, record):
        import ast

        text = record.getMessage()
        head, _, body = text.partition(": {")
        parts = head.split(" ")
        if len(parts) == 2 and parts[0] in ("step", "perf") and parts[1].isdigit() and body:
            line = {"kind": parts[0], "id": int(parts[1]), "pid": os.getpid(), "metrics": ast.literal_eval("{" + body)}
            with open(self.path, "a") as f:
                f.write(json.dumps(line, default=str) + "\n")


def _converter_local_names() -> None:
    """slime's converter knows TransformerEngine's names only: the local spec's are rewritten first."""
    from slime.backends.megatron_utils.update_weight import update_weight_from_distributed as updater

    from support.megatron_push import _slime_name

    te_convert = updater.convert_to_hf

    def local_names(args, model_name, name, param, *rest):
        return te_convert(args, model_name, _slime_name(name), param, *rest)

    updater.convert_to_hf = local_names


def setup() -> None:
    for p in (str(TESTS.parent), str(TESTS)):
        if p not in sys.path:
            sys.path.insert(0, p)
    from support.megatron_actor import _placeholders

    _placeholders()
    engine_module = types.ModuleType("slime.backends.sglang_utils.sglang_engine")
    engine_module.SGLangEngine = HttpEngine
    sys.modules["slime.backends.sglang_utils.sglang_engine"] = engine_module
    if os.environ.get("EPIC_RAY_METRICS"):
        handler = _MetricLines(os.environ["EPIC_RAY_METRICS"])
        for name in ("slime.backends.megatron_utils.model", "slime.observability.rollout_metrics"):
            logging.getLogger(name).addHandler(handler)
    if os.environ.get("EPIC_RAY_TRAIN_ACTOR") == "1":
        import numpy

        from support.megatron_actor import _numpy_reporting_1x
        from support.megatron_cpu import apply_patches, install_cpu_accelerator
        from support.megatron_push import install_local_name_loader

        apply_patches()
        install_cpu_accelerator()
        import slime.backends.megatron_utils.initialize as slime_init

        slime_init.np = _numpy_reporting_1x(numpy)
        install_local_name_loader()
        _converter_local_names()
