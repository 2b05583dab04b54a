"""slime's training actor in a `train_async.py`-shaped run under a real local Ray (issue 45 item 5):
`python tests/support/megatron_ray_run.py ENGINES.json OUT.json WORKDIR` (ENGINES.json as
`real_sglang.py serve` writes it: the real SGLang server behind the real router).

The driver is the project's (`epic_slime.slime.train.parse` and `run`: slime's
`create_placement_groups`, `create_rollout_manager`, `create_training_models`, the initial push and the
overlap schedule at K = 2). Ray is real, on 127.0.0.1 with the dashboard off; it is told of
`NUM_FAKE_GPUS` GPUs it does not have, so slime's placement group ({"GPU": 1, "CPU": 1} bundles) and
`RayTrainGroup` (`num_gpus` per train actor, `ray.get_gpu_ids()` for LOCAL_RANK) run unmodified. slime's
RolloutManager runs in external mode (`--rollout-external-engine-addrs`, `--sglang-router-ip/port`) with
the project's rollout function and streaming data source against the real server and router.

Stood in for: slime's `SGLangEngine` actor only (support.megatron_ray_hook.HttpEngine: same methods,
HTTP to the real server), and what support.megatron_actor.STANDINS lists for the Megatron actor on CPU;
the hook (`worker_process_setup_hook`) applies them in each Ray worker before slime's modules load.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
NUM_FAKE_GPUS = 1  # external rollout: slime's placement group holds the train actor's GPU only
NUM_ROLLOUT = 4
MAX_STALENESS = 2
PROMPTS = 40  # more than the run takes: the ones never started stay in the data source


def run_argv(engines: dict, workdir: Path) -> list[str]:
    from support.megatron_actor import actor_argv

    server = engines["server"].removeprefix("http://")
    router_host, router_port = engines["router"].removeprefix("http://").rsplit(":", 1)
    model = engines["model_dir"]
    base = [a for a in actor_argv(model, str(workdir / "ckpt"), model, 1)[1:] if a != "--debug-train-only"]
    return base + [
        "--prompt-data", str(workdir / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--metadata-key", "metadata",
        "--custom-rm-path", "support.slime_e2e_setup.reward",
        "--rollout-function-path", "epic_slime.slime.rollout.generate_rollout",
        "--rollout-max-response-len", "16",
        "--rollout-temperature", "1.0",
        "--rollout-num-gpus-per-engine", "1",
        "--sglang-server-concurrency", "8",
        "--max-staleness", str(MAX_STALENESS),
        "--async-groups-in-flight", "3",
        "--num-rollout", str(NUM_ROLLOUT),
        "--save-interval", str(NUM_ROLLOUT),  # one save, after the last rollout
        "--rollout-external-engine-addrs", server,
        "--sglang-router-ip", router_host, "--sglang-router-port", router_port,
        "--train-env-vars", json.dumps({"EPIC_RAY_TRAIN_ACTOR": "1"}),
        "--save-debug-rollout-data", str(workdir / "rollout_{rollout_id}.pt"),
    ]  # fmt: skip


def start_ray(workdir: Path) -> None:
    import ray

    os.environ["EPIC_RAY_METRICS"] = str(workdir / "metrics.jsonl")
    # Ray's node address in every worker (slime's weight-update group and train master bind to it) is
    # then 127.0.0.1, not the address of the host's outward interface (services.get_node_ip_address)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    paths = [str(REPO), str(TESTS), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    ray.init(
        num_cpus=4,
        num_gpus=NUM_FAKE_GPUS,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=True,
        runtime_env={"worker_process_setup_hook": "support.megatron_ray_hook.setup"},
    )


def trained_rollouts(workdir: Path) -> list[dict]:
    """What slime's RolloutManager handed to training, rollout by rollout (its --save-debug-rollout-data):
    per sample the prompt id, the group and the weight versions it was generated under."""
    import torch

    out = []
    for r in range(NUM_ROLLOUT):
        path = workdir / f"rollout_{r}.pt"
        if not path.is_file():
            break
        saved = torch.load(path, weights_only=False)
        out.append(
            {
                "rollout_id": saved["rollout_id"],
                "samples": [
                    {
                        "pid": s["metadata"]["pid"],
                        "group_index": s["group_index"],
                        "weight_versions": list(s.get("weight_versions") or []),
                    }
                    for s in saved["samples"]
                ],
            }
        )
    return out


def main(argv: list[str]) -> int:
    for p in (str(REPO), str(TESTS)):
        if p not in sys.path:
            sys.path.insert(0, p)
    engines_json, out, workdir = Path(argv[0]), Path(argv[1]), Path(argv[2])
    engines = json.loads(engines_json.read_text())
    result: dict = {"reached": []}
    began = time.monotonic()
    try:
        from support.megatron_actor import _placeholders
        from support.real_sglang import _http
        from support.slime_e2e_setup import write_prompts

        write_prompts(str(workdir / "train.jsonl"), PROMPTS, seed=1)
        result["version_before"] = _http().get(f"{engines['server']}/model_info", timeout=30).json()["weight_version"]
        _placeholders()
        from support import sglang_cli
        from support.real_sglang import sglang_python

        sglang_cli.install(sglang_cli.record(sglang_python(), workdir.parent / "sglang_cli.json"))
        from epic_slime.slime.train import parse, run

        args = parse(run_argv(engines, workdir))
        result["reached"].append("parse")
        start_ray(workdir)
        result["reached"].append("ray")
        run(args)
        result["reached"].append("run")
        result["version_after"] = _http().get(f"{engines['server']}/model_info", timeout=30).json()["weight_version"]
    except BaseException as exc:  # noqa: BLE001 - the blocker is the result
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-6000:]
    finally:
        result["seconds"] = time.monotonic() - began
        result["rollouts"] = trained_rollouts(workdir)
        metrics = workdir / "metrics.jsonl"
        result["metrics"] = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
        out.write_text(json.dumps(result, indent=1, default=str))
        import ray

        if ray.is_initialized():
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
