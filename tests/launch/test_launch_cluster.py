"""The launchers' cluster settings (issue 17, section 6), driven with stand-in `ray` and `nvidia-smi`
executables on the PATH: NCCL_NVLS_ENABLE from NVLink detection, the socket interface names passed
through only when set, and a Ray cluster already running reused only when asked (--reuse-ray)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
LAUNCHERS = ["launch/qwen3_30b_epic.sh", "launch/smoke_1gpu.sh"]
CLUSTER_ENV = (
    "NCCL_NVLS_ENABLE",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "REUSE_RAY",
    "RAY_ROLE",
    "HEAD_ADDR",
    "WANDB_API_KEY",
    "ASYNC",
    "MAX_STALENESS",
)

# `nvidia-smi topo -m` as printed on an NVLink node, on a PCIe-only node (whose legend still says "NV#"),
# and a node where nvidia-smi fails (no driver)
NVLINK_TOPOLOGY = """\
\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV18\tNV18\t0-55\t0
GPU1\tNV18\t X \tNV18\t0-55\t0
GPU2\tNV18\tNV18\t X \t0-55\t0

Legend:
  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
  NV#  = Connection traversing a bonded set of # NVLinks
"""
PCIE_TOPOLOGY = """\
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity
GPU0\t X \tPIX\t0-31\t0
GPU1\tPIX\t X \t0-31\t0

Legend:
  X    = Self
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


class Cluster:
    """A stand-in `ray` (status succeeds once a cluster runs; job submit keeps the runtime-env file)
    and a stand-in `nvidia-smi` in one folder put first on the PATH."""

    def __init__(self, root: Path, *, running: bool = False, topology: str | None = NVLINK_TOPOLOGY):
        self.root = root
        self.calls = root / "ray_calls"
        self.running = root / "ray_running"
        self.runtime_env_copy = root / "submitted_runtime_env.yaml"
        bin_dir = root / "bin"
        bin_dir.mkdir(parents=True)
        if running:
            self.running.touch()
        ray = bin_dir / "ray"
        ray.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {self.calls}
case "$1" in
  status) [[ -e {self.running} ]] || exit 1; printf 'Resources\\n 0.0/64.0 GPU\\n' ;;
  start) touch {self.running} ;;
  job) while [[ $# -gt 0 ]]; do [[ "$1" == --runtime-env ]] && cp "$2" {self.runtime_env_copy}; shift; done ;;
esac
exit 0
""")
        smi = bin_dir / "nvidia-smi"
        topology_file = root / "topology.txt"
        if topology is None:
            smi.write_text("#!/usr/bin/env bash\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
        else:
            topology_file.write_text(topology)
            smi.write_text(f'#!/usr/bin/env bash\n[[ "$*" == "topo -m" ]] || exit 3\ncat {topology_file}\n')
        for tool in (ray, smi):
            tool.chmod(0o755)
        self.path = f"{bin_dir}:{os.environ['PATH']}"

    def launch(self, script: str, *args: str, dry_run: bool = False, **env: str) -> subprocess.CompletedProcess:
        full_env = {k: v for k, v in os.environ.items() if k not in CLUSTER_ENV}
        full_env.update(
            DRY_RUN="1" if dry_run else "0",
            PYTHON=sys.executable,
            PATH=self.path,
            SAVE_DIR=str(self.root / "save"),
            MASTER_ADDR="127.0.0.1",
            WAIT_NODES_S="5",
            **env,
        )
        return subprocess.run(
            ["bash", script, *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=120
        )

    def ray_calls(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    def submitted_env(self) -> dict[str, str]:
        assert self.runtime_env_copy.exists(), f"no job was submitted; ray calls: {self.ray_calls()}"
        return yaml.safe_load(self.runtime_env_copy.read_text())["env_vars"]


def _submitted(result: subprocess.CompletedProcess, cluster: Cluster) -> dict[str, str]:
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    return cluster.submitted_env()


@pytest.mark.parametrize("script", LAUNCHERS)
@pytest.mark.parametrize(
    "topology, nvls", [(NVLINK_TOPOLOGY, "1"), (PCIE_TOPOLOGY, "0"), (None, "0")], ids=["nvlink", "pcie", "no-driver"]
)
def test_nvls_follows_the_nvlink_topology_in_the_submitted_runtime_env(tmp_path, script, topology, nvls):
    cluster = Cluster(tmp_path, topology=topology)
    env = _submitted(cluster.launch(script), cluster)
    assert env["NCCL_NVLS_ENABLE"] == nvls


def test_nvls_set_by_the_caller_wins_and_a_bad_value_is_named(tmp_path):
    cluster = Cluster(tmp_path, topology=NVLINK_TOPOLOGY)
    assert _submitted(cluster.launch(LAUNCHERS[0], NCCL_NVLS_ENABLE="0"), cluster)["NCCL_NVLS_ENABLE"] == "0"
    bad = cluster.launch(LAUNCHERS[0], dry_run=True, NCCL_NVLS_ENABLE="yes")
    assert bad.returncode == 2 and "NCCL_NVLS_ENABLE must be 0 or 1, got 'yes'" in bad.stderr


@pytest.mark.parametrize("script", LAUNCHERS)
def test_socket_interfaces_pass_through_only_when_set(tmp_path, script):
    with_names = Cluster(tmp_path / "set")
    env = _submitted(with_names.launch(script, NCCL_SOCKET_IFNAME="^lo,docker0", GLOO_SOCKET_IFNAME="eth1"), with_names)
    assert (env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"]) == ("^lo,docker0", "eth1")
    only_nccl = Cluster(tmp_path / "nccl")
    env = _submitted(only_nccl.launch(script, NCCL_SOCKET_IFNAME="ib0"), only_nccl)
    assert env["NCCL_SOCKET_IFNAME"] == "ib0" and "GLOO_SOCKET_IFNAME" not in env
    without = Cluster(tmp_path / "unset")
    env = _submitted(without.launch(script), without)
    assert "NCCL_SOCKET_IFNAME" not in env and "GLOO_SOCKET_IFNAME" not in env


def test_an_interface_name_that_would_break_the_runtime_env_is_named(tmp_path):
    result = Cluster(tmp_path).launch(LAUNCHERS[0], dry_run=True, GLOO_SOCKET_IFNAME='eth0"\nX: "1')
    assert result.returncode == 2 and "GLOO_SOCKET_IFNAME" in result.stderr and "not an interface list" in result.stderr


def test_dry_run_prints_the_cluster_settings_and_still_redacts_the_key(tmp_path):
    result = Cluster(tmp_path, topology=NVLINK_TOPOLOGY).launch(
        LAUNCHERS[0], dry_run=True, NCCL_SOCKET_IFNAME="eth0", WANDB_API_KEY="sk-cluster-secret-7"
    )
    assert result.returncode == 0, result.stderr
    assert 'NCCL_NVLS_ENABLE: "1"' in result.stdout and "NCCL_NVLS_ENABLE=1: 6 NVLink entries" in result.stdout
    assert 'NCCL_SOCKET_IFNAME: "eth0"' in result.stdout and "GLOO_SOCKET_IFNAME" not in result.stdout
    assert "sk-cluster-secret-7" not in result.stdout + result.stderr
    assert "WANDB_API_KEY: <redacted>" in result.stdout


@pytest.mark.parametrize("script", [*LAUNCHERS, "launch/table1/epic.sh"])
def test_a_running_cluster_is_refused_unless_reuse_is_asked_for(tmp_path, script):
    refused = Cluster(tmp_path / "refused", running=True)
    result = refused.launch(script)
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    assert "a Ray cluster is already running" in result.stderr
    assert "--reuse-ray" in result.stderr and "ray stop" in result.stderr
    assert [c for c in refused.ray_calls() if not c.startswith("status")] == []  # no start, no submit

    for name, args, env in (("flag", ("--reuse-ray",), {}), ("env", (), {"REUSE_RAY": "1"})):
        reused = Cluster(tmp_path / name, running=True)
        _submitted(reused.launch(script, *args, **env), reused)
        assert not [c for c in reused.ray_calls() if c.startswith("start")]

    # no cluster running: a fresh head, its dashboard and job API on 127.0.0.1 only
    fresh = Cluster(tmp_path / "fresh")
    _submitted(fresh.launch(script), fresh)
    starts = [c for c in fresh.ray_calls() if c.startswith("start")]
    assert len(starts) == 1 and "--head" in starts[0] and "--dashboard-host 127.0.0.1" in starts[0]


def test_a_worker_node_already_in_a_cluster_is_refused_unless_reuse_is_asked_for(tmp_path):
    refused = Cluster(tmp_path / "refused", running=True)
    result = refused.launch(LAUNCHERS[0], RAY_ROLE="worker", HEAD_ADDR="10.0.0.1")
    assert result.returncode == 2 and "a Ray cluster is already running" in result.stderr
    assert not [c for c in refused.ray_calls() if c.startswith("start")]
    reused = Cluster(tmp_path / "reused", running=True)
    result = reused.launch(LAUNCHERS[0], "--reuse-ray", RAY_ROLE="worker", HEAD_ADDR="10.0.0.1")
    assert result.returncode == 0, result.stderr
    assert not [c for c in reused.ray_calls() if c.startswith("start")]
    fresh = Cluster(tmp_path / "fresh")
    result = fresh.launch(LAUNCHERS[0], RAY_ROLE="worker", HEAD_ADDR="10.0.0.1")
    assert result.returncode == 0, result.stderr
    assert [c for c in fresh.ray_calls() if c.startswith("start")] == [
        "start --address 10.0.0.1:6379 --num-gpus 8 --disable-usage-stats"
    ]


def test_a_bad_reuse_setting_is_named(tmp_path):
    result = Cluster(tmp_path).launch(LAUNCHERS[1], dry_run=True, REUSE_RAY="yes")
    assert result.returncode == 2 and "REUSE_RAY must be 0 or 1, got 'yes'" in result.stderr


@pytest.mark.parametrize("script", [*LAUNCHERS, "launch/table1/grpo.sh"])
def test_help_documents_the_cluster_settings(script):
    result = subprocess.run(["bash", script, "--help"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    for word in (
        "--reuse-ray",
        "REUSE_RAY",
        "ray stop",
        "NCCL_NVLS_ENABLE",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
    ):
        assert word in result.stdout, word
