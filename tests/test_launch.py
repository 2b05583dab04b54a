"""Every launch script under DRY_RUN=1: a complete command, validated by the project's own parser."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
METHODS = sorted(p.stem for p in (REPO / "configs" / "methods").glob("*.yaml"))
TABLE1 = {"epic", "grpo", "dapo", "gspo", "ctpo", "ripo", "grpo_r2", "grpo_r3"}


def _dry_run(*args: str, script: str = "launch/qwen3_30b_epic.sh", **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    full_env.update(DRY_RUN="1", PYTHON=sys.executable, **env)
    return subprocess.run(["bash", script, *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=120)


def _command(result: subprocess.CompletedProcess) -> list[str]:
    lines = [line for line in result.stdout.splitlines() if line.startswith("ray job submit")]
    assert len(lines) == 1, result.stdout
    return shlex.split(lines[0])


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_every_table1_row_has_a_method_config():
    assert TABLE1 <= set(METHODS)
    for method in TABLE1:
        assert (REPO / "launch" / "table1" / f"{method}.sh").is_file()


@pytest.mark.parametrize("method", sorted(TABLE1))
def test_companion_script_dry_run_is_complete_and_valid(method):
    result = _dry_run(script=f"launch/table1/{method}.sh")
    assert result.returncode == 0, result.stderr
    argv = _command(result)
    assert argv[:5] == ["ray", "job", "submit", "--address", "http://127.0.0.1:8265"]
    driver = argv[argv.index("--") + 1 :]
    assert driver[:3] == ["python3", "-m", "epic_slime.slime.train"]
    assert _flag(driver, "--loss-type") == "custom_loss"
    assert _flag(driver, "--custom-loss-function-path") == "epic_slime.slime.loss.policy_loss"
    assert _flag(driver, "--rollout-function-path") == "epic_slime.slime.rollout.generate_rollout"
    assert (_flag(driver, "--rollout-batch-size"), _flag(driver, "--n-samples-per-prompt")) == ("64", "8")
    assert (_flag(driver, "--update-depth"), _flag(driver, "--num-rollout")) == ("8", "300")
    assert (_flag(driver, "--actor-num-nodes"), _flag(driver, "--rollout-num-gpus")) == ("2", "16")
    assert _flag(driver, "--eval-interval") == "5" and _flag(driver, "--n-samples-per-eval-prompt") == "8"
    assert _flag(driver, "--eval-top-p") == "0.7" and _flag(driver, "--lr") == "1e-06"
    assert _flag(driver, "--prompt-data") == "/root/data/train/dapo_math_17k.jsonl"
    eval_data = driver[driver.index("--eval-prompt-data") + 1 : driver.index("--eval-prompt-data") + 9]
    assert eval_data[::2] == ["aime_2024", "aime_2025", "amc_2023", "hmmt_feb_2025"]
    assert _flag(driver, "--custom-config-path").endswith("/epic_run.yaml")
    assert f'epic_method: "{method}"' in result.stdout  # the eval hook's run identity
    assert "epic-slime flags OK" in result.stdout
    assert "global batch 64 of 512 samples" in result.stdout
    mode = _flag(driver, "--policy-loss")
    assert f"policy_loss={mode}" in result.stdout
    assert mode == {"grpo_r2": "grpo", "grpo_r3": "grpo"}.get(method, method)
    assert ("--use-routing-replay" in driver) == (method == "grpo_r2")
    assert ("--use-rollout-routing-replay" in driver) == (method == "grpo_r3")
    # the driver maps --update-depth (and token-mean aggregation) onto slime's own flags
    slime_extra = result.stdout.split("the driver passes slime ")[1].splitlines()[0]
    assert slime_extra.startswith("--num-steps-per-rollout 8")
    assert ("--calculate-per-token-loss" in slime_extra) == (method in ("dapo", "ripo"))
    assert f"aggregation={'token-mean' if method in ('dapo', 'ripo') else 'seq-mean-token-mean'}" in result.stdout


def test_overrides_by_environment_and_flags():
    result = _dry_run("--update-depth", "4", "--seed", "7", "--", "--num-rollout", "3",
                      NUM_NODES="2", GPUS_PER_NODE="4", MAX_STALENESS="none", METHOD="ctpo")
    assert result.returncode == 0, result.stderr
    driver = _command(result)
    assert _flag(driver, "--update-depth") == "4" and _flag(driver, "--seed") == "7"
    assert _flag(driver, "--actor-num-gpus-per-node") == "4" and _flag(driver, "--rollout-num-gpus") == "4"
    assert "--max-staleness" not in driver and _flag(driver, "--policy-loss") == "ctpo"
    assert driver[-2:] == ["--num-rollout", "3"]  # user flags come last and win in argparse
    assert "global batch 128 of 512 samples" in result.stdout


@pytest.mark.parametrize(
    "args, env, message",
    [
        ((), {"METHOD": "ppo"}, "unknown method 'ppo'"),
        (("--update-depth", "7"), {}, "must divide"),
        (("--nodes", "1"), {}, "NUM_NODES must be >= 2"),
        (("--max-staleness", "-3"), {}, "MAX_STALENESS must be"),
        (("--bogus",), {}, "unknown option --bogus"),
        (("--", "--stale-policy", "sometimes"), {}, "invalid choice"),
    ],
)
def test_bad_settings_fail_with_a_reason(args, env, message):
    result = _dry_run(*args, **env)
    assert result.returncode != 0
    assert message in result.stderr


def test_wandb_key_is_never_printed_and_ray_stays_local():
    result = _dry_run(WANDB_API_KEY="sk-very-secret-123")
    assert result.returncode == 0, result.stderr
    assert "sk-very-secret-123" not in result.stdout + result.stderr
    assert "WANDB_API_KEY: <redacted>" in result.stdout and "--use-wandb" in result.stdout
    script = (REPO / "launch" / "qwen3_30b_epic.sh").read_text()
    assert "0.0.0.0" not in script and "--dashboard-host 127.0.0.1" in script
