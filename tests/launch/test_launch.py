"""Every launch script under DRY_RUN=1: a complete command, validated by the project's own parser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.launch_helpers import dry_run, flag_value, submit_command

REPO = Path(__file__).resolve().parents[2]
METHODS = sorted(p.stem for p in (REPO / "configs" / "methods").glob("*.yaml"))
TABLE1 = {"epic", "grpo", "dapo", "gspo", "ctpo", "ripo", "grpo_r2", "grpo_r3"}


def test_every_table1_row_has_a_method_config():
    assert TABLE1 <= set(METHODS)
    for method in TABLE1:
        assert (REPO / "launch" / "table1" / f"{method}.sh").is_file()


@pytest.mark.parametrize("method", sorted(TABLE1))
def test_companion_script_dry_run_is_complete_and_valid(method):
    result = dry_run(script=f"launch/table1/{method}.sh")
    assert result.returncode == 0, result.stderr
    argv = submit_command(result)
    assert argv[:5] == ["ray", "job", "submit", "--address", "http://127.0.0.1:8265"]
    driver = argv[argv.index("--") + 1 :]
    assert driver[:3] == ["python3", "-m", "epic_slime.slime.train"]
    assert flag_value(driver, "--loss-type") == "custom_loss"
    assert flag_value(driver, "--custom-loss-function-path") == "epic_slime.slime.loss.policy_loss"
    assert flag_value(driver, "--rollout-function-path") == "epic_slime.slime.rollout.generate_rollout"
    assert (flag_value(driver, "--rollout-batch-size"), flag_value(driver, "--n-samples-per-prompt")) == ("64", "8")
    assert (flag_value(driver, "--update-depth"), flag_value(driver, "--num-rollout")) == ("8", "300")
    # the paper's synchronous protocol colocated: Megatron and SGLang share all 32 GPUs (slime's --colocate)
    assert (flag_value(driver, "--actor-num-nodes"), flag_value(driver, "--rollout-num-gpus")) == ("4", "32")
    assert "--colocate" in driver
    assert flag_value(driver, "--num-gpus-per-node") == "8"  # slime's engine placement, not only the actor's
    assert flag_value(driver, "--rollout-seed") == flag_value(driver, "--seed") == "1234"
    assert flag_value(driver, "--eval-interval") == "5" and flag_value(driver, "--n-samples-per-eval-prompt") == "8"
    assert flag_value(driver, "--eval-top-p") == "0.7" and flag_value(driver, "--lr") == "1e-06"
    assert flag_value(driver, "--prompt-data") == "/root/data/train/dapo_math_17k.jsonl"
    eval_data = driver[driver.index("--eval-prompt-data") + 1 : driver.index("--eval-prompt-data") + 9]
    assert eval_data[::2] == ["aime_2024", "aime_2025", "amc_2023", "hmmt_feb_2025"]
    assert flag_value(driver, "--custom-config-path").endswith("/epic_run.yaml")
    assert f'epic_method: "{method}"' in result.stdout  # the eval hook's run identity
    assert "epic-slime flags OK" in result.stdout
    assert "global batch 64 of 512 samples" in result.stdout
    mode = flag_value(driver, "--policy-loss")
    assert f"policy_loss={mode}" in result.stdout
    assert mode == {"grpo_r2": "grpo", "grpo_r3": "grpo"}.get(method, method)
    assert ("--use-routing-replay" in driver) == (method == "grpo_r2")
    assert ("--use-rollout-routing-replay" in driver) == (method == "grpo_r3")
    # the driver maps --update-depth (and token-mean aggregation) onto slime's own flags
    slime_extra = result.stdout.split("the driver passes slime ")[1].splitlines()[0]
    assert slime_extra.startswith("--num-steps-per-rollout 8")
    # Table 1 rows run the paper's synchronous schedule (K = 0): no background generator, so the
    # oversampling ratio adds no groups in flight there (ASYNC=1 below gets them)
    assert flag_value(driver, "--max-staleness") == "0" and "schedule=synchronous" in result.stdout
    assert "--async-groups-in-flight" not in slime_extra and "--lr-warmup-iters 80" in slime_extra
    assert ("--calculate-per-token-loss" in slime_extra) == (method in ("dapo", "ripo"))
    assert f"aggregation={'token-mean' if method in ('dapo', 'ripo') else 'seq-mean-token-mean'}" in result.stdout


def test_async_table1_row_oversamples_only_when_asked():
    """ASYNC=1 runs the asynchronous schedule with the launcher's oversampling (0: the admission budget
    alone decides what starts, no groups-in-flight cap); OVERSAMPLE_RATIO=0.1 brings Table 2's cap of 72 back."""
    result = dry_run(script="launch/table1/epic.sh", ASYNC="1")
    assert result.returncode == 0, result.stderr
    slime_extra = result.stdout.split("the driver passes slime ")[1].splitlines()[0]
    assert "--async-groups-in-flight" not in slime_extra and "schedule=asynchronous" in result.stdout
    table2 = dry_run(script="launch/table1/epic.sh", ASYNC="1", OVERSAMPLE_RATIO="0.1")
    assert table2.returncode == 0, table2.stderr
    assert "--async-groups-in-flight 72" in table2.stdout.split("the driver passes slime ")[1].splitlines()[0]


def test_overrides_by_environment_and_flags():
    result = dry_run(
        "--update-depth",
        "4",
        "--seed",
        "7",
        "--",
        "--num-rollout",
        "3",
        NUM_NODES="2",
        GPUS_PER_NODE="4",
        MAX_STALENESS="none",
        METHOD="ctpo",
    )
    assert result.returncode == 0, result.stderr
    driver = submit_command(result)
    assert flag_value(driver, "--update-depth") == "4" and flag_value(driver, "--seed") == "7"
    assert flag_value(driver, "--actor-num-gpus-per-node") == "4" and flag_value(driver, "--rollout-num-gpus") == "4"
    assert flag_value(driver, "--num-gpus-per-node") == "4"  # a 4-GPU node is not placed as 8 by slime
    assert flag_value(driver, "--rollout-seed") == "7"
    assert "--max-staleness" not in driver and flag_value(driver, "--policy-loss") == "ctpo"
    assert driver[-2:] == ["--num-rollout", "3"]  # user flags come last and win in argparse
    assert "global batch 128 of 512 samples" in result.stdout
    assert "--lr-warmup-iters 40" in result.stdout  # 10 warmup rollouts x update depth 4
    assert "override: --num-rollout given 2 times: 300 -> 3 (the last one wins)" in result.stdout


def test_tis_turns_on_with_one_flag_and_keeps_slime_recompute():
    """``-- --use-tis --tis-clip 2``: the loss's ratio base becomes the trainer's recompute (the driver
    then keeps slime's recompute on: tests/slime_adapter/test_slime_accounting.py)."""
    plain = dry_run()
    assert plain.returncode == 0, plain.stderr
    assert "behavior_logprobs=rollout" in plain.stdout
    result = dry_run("--", "--use-tis", "--tis-clip", "2")
    assert result.returncode == 0, result.stderr
    assert "behavior_logprobs=recompute" in result.stdout
    assert flag_value(submit_command(result), "--tis-clip") == "2"


@pytest.mark.parametrize(
    "args, env, message",
    [
        ((), {"METHOD": "ppo"}, "unknown method 'ppo'"),
        (("--update-depth", "7"), {}, "must divide"),
        (("--nodes", "1"), {}, "NUM_NODES must be >= 2"),
        (("--max-staleness", "-3"), {}, "MAX_STALENESS must be"),
        (("--bogus",), {}, "unknown option --bogus"),
        (("--", "--stale-policy", "sometimes"), {}, "invalid choice"),
        (
            ("--", "--sglang-mem-frac", "0.5"),
            {},
            "--sglang-mem-frac is an abbreviation of --sglang-mem-fraction-static",
        ),
        (("--", "--num-rollouts", "3"), {}, "unknown flag --num-rollouts"),
        (
            ("--", "--use-opsm"),
            {},
            "--use-opsm is not supported by the epic-slime driver",
        ),  # the rest: test_slime_flag_hygiene.py
        (("--method", "dppo_topk_tv", "--", "--use-tis"), {}, "--use-tis with --policy-loss dppo_topk_tv"),
        (("--", "--advantage-estimator", "ppo"), {}, "trains a critic"),
        (("--", "--update-weight-mode", "delta"), {}, "--update-weight-mode delta is not supported"),
    ],
)
def test_bad_settings_fail_with_a_reason(args, env, message):
    result = dry_run(*args, **env)
    assert result.returncode == 2
    assert message in result.stderr


def test_paper_table2_values_reach_the_driver():
    driver = submit_command(dry_run())
    assert flag_value(driver, "--rollout-max-response-len") == flag_value(driver, "--eval-max-response-len") == "16384"
    assert flag_value(driver, "--rollout-max-prompt-len") == flag_value(driver, "--eval-max-prompt-len") == "2048"
    assert flag_value(driver, "--lr-warmup-rollouts") == "10" and flag_value(driver, "--lr-decay-style") == "constant"
    # Table 2's oversampling at K = 0 and 1; at K >= 2 the launcher's own (0, see OVERSAMPLE_RATIO) replaces it
    assert flag_value(submit_command(dry_run(MAX_STALENESS="1")), "--oversample-ratio") == "0.1"
    assert flag_value(driver, "--oversample-ratio") == "0"
    assert (
        flag_value(driver, "--lr"),
        flag_value(driver, "--rollout-temperature"),
        flag_value(driver, "--kl-loss-coef"),
    ) == ("1e-06", "1.0", "0.001")
    # prompt + response must fit one GPU's dynamic batch (CP 1)
    assert 2048 + 16384 <= int(flag_value(driver, "--max-tokens-per-gpu"))


def _slime_dataset_class():
    path = os.environ.get("SLIME_PATH") or str(REPO.parent / "shared" / "vendor" / "slime-624b824a")
    if os.path.isdir(path) and path not in sys.path:
        sys.path.append(path)
    return pytest.importorskip("slime.utils.data", reason="slime is not importable (SLIME_PATH)").Dataset


def test_two_seeds_train_two_prompt_orders(tmp_path):
    """slime's own prompt shuffle (its Dataset, seeded by --rollout-seed) under the launch script's flags."""
    Dataset = _slime_dataset_class()
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"problem {i}", "label": str(i)}) + "\n" for i in range(40)))

    def prompt_order(driver: list[str]) -> list[str]:
        assert "--rollout-shuffle" in driver
        rollout_seed = (
            int(flag_value(driver, "--rollout-seed")) if "--rollout-seed" in driver else 42
        )  # slime's default
        dataset = Dataset(
            str(data),
            tokenizer=None,
            processor=None,
            max_length=None,
            prompt_key="prompt",
            label_key="label",
            seed=rollout_seed,
        )
        dataset.shuffle(0)  # what slime's RolloutDataSource does at epoch 0 with --rollout-shuffle
        return [sample.prompt for sample in dataset.samples]

    seed1, seed2 = submit_command(dry_run(SEED="1")), submit_command(dry_run(SEED="2"))
    first, again, second = prompt_order(seed1), prompt_order(seed1), prompt_order(seed2)
    assert first == again and sorted(first) == sorted(second)
    assert first != second


def test_dockerfile_installs_the_light_dependencies_as_pyproject_names_them():
    """The image's explicit installs are pyproject's own requirement strings (an extra spelt otherwise,
    as `math-verify[antlr4_13_2]` was, installs without it)."""
    import re
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    required = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    by_name = {re.split(r"[\[<>=]", r, maxsplit=1)[0]: r.split("#")[0].strip() for r in required}
    installs = re.findall(r'"([A-Za-z0-9_.-]+(?:\[[^\]]*\])?[<>=][^"]*)"', (REPO / "Dockerfile").read_text())
    assert installs, "no quoted requirement in the Dockerfile"
    for requirement in installs:
        name = re.split(r"[\[<>=]", requirement, maxsplit=1)[0]
        assert name in by_name and requirement == by_name[name], (requirement, by_name.get(name))


def test_dockerfile_build_check_imports_the_loss_hook_and_slime():
    dockerfile = (REPO / "Dockerfile").read_text()
    checks = [line for line in dockerfile.splitlines() if 'python -c "import ' in line]
    assert len(checks) == 1, checks
    statement = checks[0].split('python -c "', 1)[1].rsplit('"', 1)[0]
    modules = {m.strip() for m in statement.removeprefix("import ").split(",")}
    assert {"epic_slime.slime.loss", "epic_slime.slime.train", "slime", "slime.utils.arguments"} <= modules
    # the part that imports on CPU runs here (slime.utils.arguments needs SGLang: the image has it)
    _slime_dataset_class()
    light = sorted(m for m in modules if m != "slime.utils.arguments")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *[p for p in sys.path if "slime" in p]])}
    result = subprocess.run(
        [sys.executable, "-c", "import " + ", ".join(light)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_wandb_key_is_never_printed_and_ray_stays_local():
    result = dry_run(WANDB_API_KEY="sk-very-secret-123")
    assert result.returncode == 0, result.stderr
    assert "sk-very-secret-123" not in result.stdout + result.stderr
    assert "WANDB_API_KEY: <redacted>" in result.stdout and "--use-wandb" in result.stdout
    script = (REPO / "launch" / "qwen3_30b_epic.sh").read_text()
    assert "0.0.0.0" not in script and "--dashboard-host 127.0.0.1" in script


@pytest.mark.parametrize("script", ["launch/qwen3_30b_epic.sh", "launch/smoke_1gpu.sh"])
def test_a_real_launch_checks_the_flags_before_ray_starts(tmp_path, script):
    """Without DRY_RUN a typo fails at once (exit 2), before any Ray command: a stand-in `ray` on the
    PATH records any call."""
    calls = tmp_path / "ray_calls"
    fake_ray = tmp_path / "ray"
    fake_ray.write_text(f'#!/usr/bin/env bash\necho "$@" >> {calls}\nexit 1\n')
    fake_ray.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    env.update(DRY_RUN="0", PYTHON=sys.executable, PATH=f"{tmp_path}:{env['PATH']}", SAVE_DIR=str(tmp_path / "save"))
    result = subprocess.run(
        ["bash", script, "--", "--num-rollouts", "3"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "--num-rollout" in result.stderr and not calls.exists()


@pytest.mark.parametrize("script", ["launch/qwen3_30b_epic.sh", "launch/smoke_1gpu.sh", "launch/table1/epic.sh"])
def test_a_dry_run_ends_saying_nothing_was_submitted(script):
    passed, failed = dry_run(script=script), dry_run("--", "--colocate", "--max-staleness", "2", script=script)
    by_flag = dry_run("--dry-run", script=script, DRY_RUN="0")
    assert passed.returncode == 0 and failed.returncode == 2 and by_flag.returncode == 0
    for result in (passed, failed, by_flag):
        assert result.stdout.splitlines()[-1].startswith("# dry run (DRY_RUN=1): nothing was submitted")
    # the footer names what asked for the dry run: DRY_RUN=1 in the environment, or the --dry-run flag
    assert passed.stdout.splitlines()[-1].endswith("to submit, run again without DRY_RUN=1 (DRY_RUN=0 or unset)")
    assert by_flag.stdout.splitlines()[-1].endswith("to submit, run again without --dry-run")
    assert "to submit" not in failed.stdout  # a failed check is no go-ahead
    assert failed.stdout.splitlines()[-1].endswith(
        "the flag check failed (exit 2): fix the error above, then dry-run again"
    )


@pytest.mark.parametrize("script", ["launch/qwen3_30b_epic.sh", "launch/smoke_1gpu.sh"])
def test_without_the_project_environment_one_line_says_what_to_activate(tmp_path, script):
    """A python without torch (the venv's interpreter without its site-packages, under `env -i`)."""
    bare = tmp_path / "python3"
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S -E "$@"\n')
    bare.chmod(0o755)
    result = subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", f"PYTHON={bare}", "bash", script, "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "cannot import torch" in lines[0] and "activate the project's virtual environment" in lines[0]
    missing = subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", f"PYTHON={tmp_path / 'none'}", "bash", script, "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1 and "is not a command" in missing.stderr


PREDICTIONS = REPO / "bench" / "schedsim" / "launch_predictions.json"


def _last_value(argv: list[str], name: str) -> str:
    return argv[len(argv) - 1 - argv[::-1].index(name) + 1]


@pytest.mark.skipif(not PREDICTIONS.exists(), reason="python bench/schedule_sim.py launch-table builds it")
def test_the_paper_launcher_uses_the_planners_pick_and_prints_its_price():
    """At K = 2 on 4 x 8 GPUs the split and engine size are the planner's pick (the precomputed table's),
    the dry run prints the simulator's s/rollout and speedup for exactly those settings, and flags and
    environment override the pick (and the printed price follows them)."""
    table = json.loads(PREDICTIONS.read_text())
    pick = table["picks"]["4x8"]
    result = dry_run()
    assert result.returncode == 0, result.stderr
    driver = submit_command(result)
    assert flag_value(driver, "--actor-num-nodes") == str(pick["actor_nodes"])
    assert flag_value(driver, "--rollout-num-gpus") == str((4 - pick["actor_nodes"]) * 8)
    assert _last_value(driver, "--rollout-num-gpus-per-engine") == str(pick["gpus_per_engine"])
    assert _last_value(driver, "--weight-push-mode") == "abort" and _last_value(driver, "--oversample-ratio") == "0"
    price = [line for line in result.stdout.splitlines() if line.startswith("# simulator")]
    assert len(price) == 1, result.stdout
    assert f"{pick['s_per_rollout']:.1f} s/rollout, {pick['speedup']:.2f}x sync colocated" in price[0]
    assert "the planner's pick for 4 x 8 GPUs" in result.stdout

    other = dry_run("--actor-nodes", "2", "--gpus-per-engine", "4", "--push-mode", "in_place", MAX_STALENESS="4")
    assert other.returncode == 0, other.stderr
    driver = submit_command(other)
    assert (
        flag_value(driver, "--actor-num-nodes") == "2" and _last_value(driver, "--rollout-num-gpus-per-engine") == "4"
    )
    assert _last_value(driver, "--weight-push-mode") == "in_place"
    row = table["prices"]["4x8|train 2|engine 4|K 4|in_place|oversample 0"]
    assert f"{row['s_per_rollout']:.1f} s/rollout" in other.stdout


@pytest.mark.skipif(not PREDICTIONS.exists(), reason="python bench/schedule_sim.py launch-table builds it")
def test_the_price_is_for_the_oversampling_the_command_submits():
    """At K = 0 and 1 the command submits Table 2's --oversample-ratio 0.1 from the config; the price is
    for 0.1 too (it was for 0), and against the best synchronous baseline with its band at K = 2."""
    for k in ("0", "1", "2"):
        result = dry_run(MAX_STALENESS=k)
        assert result.returncode == 0, result.stderr
        submitted = _last_value(submit_command(result), "--oversample-ratio")
        assert submitted == ("0.1" if k in ("0", "1") else "0")
        price = [line for line in result.stdout.splitlines() if line.startswith("# simulator")]
        # at K = 0 the dry run prices this command's layout first, then the other layout
        assert len(price) == (2 if k == "0" else 1), result.stdout
        assert f"K={k}, push abort, oversampling {submitted}:" in price[0], result.stdout
        assert "sync colocated" in price[0] and "at its best engine size" in price[0]
        if k == "2":
            assert "over tp_alpha" in price[0], price[0]


def test_the_synchronous_paper_run_is_colocated_unless_split_is_asked_for():
    """K = 0 shares the GPUs by default (slime's --colocate, which implies its offload); --layout split
    (or LAYOUT=split) gives the old layout, half the nodes training; the dry run prices both."""
    result = dry_run(MAX_STALENESS="0")
    assert result.returncode == 0, result.stderr
    driver = submit_command(result)
    assert "--colocate" in driver and flag_value(driver, "--actor-num-nodes") == "4"
    assert flag_value(driver, "--rollout-num-gpus") == "32" and flag_value(driver, "--actor-num-gpus-per-node") == "8"
    assert "--oversample-ratio 0 " not in " ".join(driver) + " "
    assert "# price of this command (colocate):" in result.stdout and "# the split layout instead" in result.stdout
    for split in (dry_run("--layout", "split", MAX_STALENESS="0"), dry_run(MAX_STALENESS="0", LAYOUT="split")):
        assert split.returncode == 0, split.stderr
        driver = submit_command(split)
        assert "--colocate" not in driver and flag_value(driver, "--actor-num-nodes") == "2"
        assert flag_value(driver, "--rollout-num-gpus") == "16" and "no planner pick" in split.stdout
        assert "# price of this command (split):" in split.stdout and "# the colocated layout instead" in split.stdout
    asynchronous = submit_command(dry_run(MAX_STALENESS="2"))
    assert "--colocate" not in asynchronous  # the asynchronous schedule cannot share GPUs


@pytest.mark.parametrize(
    "args, env, message",
    [
        (("--layout", "colocate"), {"MAX_STALENESS": "2"}, "LAYOUT=colocate needs the synchronous schedule"),
        (("--actor-nodes", "1"), {"MAX_STALENESS": "0"}, "ACTOR_NODES=1 sets the split layout's training nodes"),
        (("--push-mode", "in_place"), {"MAX_STALENESS": "0"}, "PUSH_MODE=in_place needs separate rollout GPUs"),
        (("--layout", "shared"), {}, "LAYOUT must be colocate or split, got 'shared'"),
    ],
)
def test_a_layout_that_cannot_run_is_named(args, env, message):
    result = dry_run(*args, **env)
    assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.parametrize("env", [{"MAX_STALENESS": "0"}, {"MAX_STALENESS": "1"}, {"MAX_STALENESS": "2"}])
def test_the_launcher_passes_its_own_settings_once(env):
    """The engine size and (at K >= 2) the oversampling are the launcher's: the YAML's values are left
    out rather than overridden, so a dry run warns of no override the user did not make; the user's
    own repeat after -- is still reported."""
    result = dry_run(**env)
    assert result.returncode == 0, result.stderr
    driver = submit_command(result)
    assert driver.count("--rollout-num-gpus-per-engine") == 1 and driver.count("--oversample-ratio") == 1
    assert "override:" not in result.stdout + result.stderr
    own = dry_run("--", "--rollout-num-gpus-per-engine", "2", **env)
    assert "override: --rollout-num-gpus-per-engine given 2 times" in own.stdout
    bad = dry_run("--push-mode", "retract")
    assert bad.returncode == 2 and "PUSH_MODE must be abort or in_place" in bad.stderr
