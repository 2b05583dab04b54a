"""The driver's flag translation / validation, its overlap schedule, and the YAML -> flags helper (no slime)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from epic_slime.slime.cli.config_flags import config_argv, mapping_to_argv
from epic_slime.slime.cli.command_line import translate_argv
from epic_slime.slime.cli.dry_run import check_argv
from epic_slime.slime.cli.flags import ProjectFlagError
from epic_slime.slime.train import async_training_loop

BASE = [
    "--loss-type",
    "custom_loss",
    "--custom-loss-function-path",
    "epic_slime.slime.loss.policy_loss",
    "--rollout-function-path",
    "epic_slime.slime.rollout.generate_rollout",
    "--rollout-batch-size",
    "64",
    "--n-samples-per-prompt",
    "8",
    "--some-slime-flag",
    "x",  # slime flags the project does not read pass through
]


def test_update_depth_becomes_num_steps_per_rollout():
    out = translate_argv(BASE + ["--update-depth", "8"])
    assert out[-2:] == ["--num-steps-per-rollout", "8"]
    assert "--calculate-per-token-loss" not in out
    with pytest.raises(ProjectFlagError, match="disagrees"):
        translate_argv(BASE + ["--update-depth", "8", "--num-steps-per-rollout", "4"])


def test_token_mean_modes_switch_slime_to_per_token_loss():
    out = translate_argv(BASE + ["--policy-loss", "dapo"])
    assert "--calculate-per-token-loss" in out
    out = translate_argv(BASE + ["--policy-loss", "epic", "--policy-loss-aggregation", "token-mean"])
    assert "--calculate-per-token-loss" in out


def test_valid_command_reports_the_config():
    config, args, rest = check_argv(BASE + ["--policy-loss", "epic", "--update-depth", "8", "--max-staleness", "2"])
    assert (config.policy_loss, config.update_depth, config.max_staleness, config.stale_policy) == (
        "epic",
        8,
        2,
        "drop",
    )
    assert config.aggregation == "seq-mean-token-mean" and config.behavior_logprobs == "rollout"
    assert config.policy_loss_params == {"delta_low": 5e-4, "delta_high": 2e-3}  # the core's defaults, resolved
    assert rest == ["--some-slime-flag", "x"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--update-depth", "7"], "must divide"),
        (["--update-depth", "0"], "update-depth must be >= 1"),
        (["--max-staleness", "-1"], "max-staleness must be >= 0"),
        (["--update-depth", "8", "--global-batch-size", "32"], "global-batch-size 32 disagrees"),
        (["--behavior-logprobs", "recompute", "--use-rollout-logprobs"], "use-rollout-logprobs"),
        (
            ["--policy-loss", "dapo", "--policy-loss-aggregation", "seq-mean-token-mean", "--calculate-per-token-loss"],
            "calculate-per-token-loss",
        ),
        (["--update-weights-interval", "2"], "update-weights-interval"),
        (["--colocate"], "colocate"),
        (["--async-groups-in-flight", "0"], "async-groups-in-flight"),
        (["--use-routing-replay", "--use-rollout-logprobs"], "R2"),
        (["--policy-loss", "ripo", "--grpo-clip-low", "0.1"], "applies to the 'grpo' modes"),
        (["--epic-delta-low", "-1"], "delta_low=-1"),
    ],
)
def test_bad_flags_are_named(extra, message):
    with pytest.raises(ProjectFlagError, match=message):
        check_argv(BASE + extra)


def test_loss_hook_and_rollout_function_are_required():
    argv = [a if a != "epic_slime.slime.loss.policy_loss" else "my.loss" for a in BASE]
    with pytest.raises(ProjectFlagError, match="custom-loss-function-path"):
        check_argv(argv)
    argv = [a if a != "epic_slime.slime.rollout.generate_rollout" else "slime.x.f" for a in BASE]
    with pytest.raises(ProjectFlagError, match="max-staleness is enforced"):
        check_argv(argv + ["--max-staleness", "1"])
    with pytest.raises(ProjectFlagError, match="custom_loss"):
        check_argv(["--loss-type", "policy_loss", "--rollout-batch-size", "4"])


def test_argparse_choices_reject_bad_values():
    with pytest.raises(SystemExit):
        check_argv(BASE + ["--stale-policy", "sometimes"])
    with pytest.raises(SystemExit):
        check_argv(BASE + ["--behavior-logprobs", "engine"])


class _Remote:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def remote(self, *args, **kwargs):
        self.log.append((self.name, args))
        return (self.name, args)


class _FakeRolloutManager:
    def __init__(self, log):
        self.generate, self.eval, self.save = _Remote(log, "generate"), _Remote(log, "eval"), _Remote(log, "save")


class _FakeActor:
    def __init__(self, log):
        self.log = log

    def async_train(self, rollout_id, data_ref):
        assert data_ref == ("generate", (rollout_id,)), "trains on the data of its own rollout"
        self.log.append(("train", (rollout_id,)))
        return "train-ref"

    def save_model(self, rollout_id, force_sync=False):
        self.log.append(("save_model", (rollout_id, force_sync)))

    def update_weights(self):
        self.log.append(("update_weights", ()))


def test_schedule_generates_ahead_and_updates_after_every_rollout():
    log = []
    args = SimpleNamespace(
        start_rollout_id=0,
        num_rollout=6,
        eval_interval=5,
        save_interval=4,
        rollout_global_dataset=True,
        skip_eval_before_train=False,
    )
    trace = async_training_loop(args, _FakeRolloutManager(log), _FakeActor(log), None, get=lambda ref: ref)
    events = [e for e, _ in trace]
    # rollout r+1 is requested before rollout r trains, so generation overlaps training
    for r in range(5):
        assert trace.index(("generate", r + 1)) < trace.index(("train", r))
    assert events.count("update_weights") == 6 and events.count("train") == 6
    assert [r for e, r in trace if e == "eval"] == [0, 4]  # before training, then every 5 rollouts
    assert [r for e, r in trace if e == "save"] == [3, 5]  # every 4 and the last
    assert ("save_model", (5, True)) in log
    # each checkpoint: the data state (slime's data source and the untrained groups) first, then the model
    saves = [(e, a) for e, a in log if e in ("save", "save_model")]
    assert saves == [("save", (3,)), ("save_model", (3, False)), ("save", (5,)), ("save_model", (5, True))], saves


def test_overlap_schedule_without_global_dataset_saves_only_the_model():
    log = []
    args = SimpleNamespace(
        start_rollout_id=0,
        num_rollout=2,
        eval_interval=None,
        save_interval=1,
        rollout_global_dataset=False,
        skip_eval_before_train=False,
    )
    async_training_loop(args, _FakeRolloutManager(log), _FakeActor(log), None, get=lambda ref: ref)
    assert [e for e, _ in log if e in ("save", "save_model")] == ["save_model", "save_model"]


def test_r3_with_the_project_rollout_gets_the_train_hook_and_refuses_another():
    from epic_slime.slime.cli.command_line import driver_argv
    from epic_slime.slime.routing import HOOK_PATH as R3_TRAIN_HOOK

    from epic_slime.slime.cli.flags import PUSH_TRAIN_HOOK_PATH

    out = driver_argv(BASE + ["--use-rollout-routing-replay"])
    assert out[out.index("--custom-megatron-init-path") + 1] == PUSH_TRAIN_HOOK_PATH  # installs R3's hook too
    config, args, _ = check_argv(BASE + ["--use-rollout-routing-replay", "--custom-megatron-init-path", R3_TRAIN_HOOK])
    args.custom_megatron_init_path = "my.own.init"
    from epic_slime.slime.cli.checks import validate_project_args

    with pytest.raises(
        ProjectFlagError, match="--custom-megatron-init-path epic_slime.slime.routing.install_train_hook"
    ):
        validate_project_args(args)


def test_yaml_flags(tmp_path):
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    a.write_text("flags:\n  lr: 1.0e-6\n  use-kl-loss: true\n  sizes: [1, 2]\n  colocate: true\n")
    b.write_text("flags:\n  colocate: false\n  lr: 2.0e-6\n")
    assert config_argv([a, b]) == ["--use-kl-loss", "--sizes", "1", "2", "--lr", "2e-06"]
    with pytest.raises(ValueError, match="leading dashes"):
        config_argv([_write(tmp_path, "flags:\n  --lr: 1\n")])
    with pytest.raises(ValueError, match="empty list"):
        mapping_to_argv({"sizes": []})


def _write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_the_command_line_is_parsed_once_for_every_rewrite(monkeypatch):
    import argparse

    from epic_slime.slime.cli.command_line import read_command_line

    parsed = []
    parse_known_args = argparse.ArgumentParser.parse_known_args

    def counting(self, args=None, namespace=None):
        parsed.append(list(args))
        return parse_known_args(self, args, namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", counting)
    argv = BASE[:-2] + [
        "--policy-loss",
        "dapo",
        "--update-depth",
        "4",
        "--oversample-ratio",
        "0.1",
        "--max-staleness",
        "2",
        "--lr-warmup-rollouts",
        "10",
        "--use-rollout-routing-replay",
    ]
    line = read_command_line(argv)
    # update depth, aggregation, oversampling, warmup; rollout log-probs, data source, the train hook (R3 in it)
    assert line.slime_flags == [
        "--num-steps-per-rollout",
        "4",
        "--calculate-per-token-loss",
        "--async-groups-in-flight",
        "72",
        "--lr-warmup-iters",
        "40",
    ]
    assert line.driver_flags == [
        "--use-rollout-logprobs",
        "--data-source-path",
        "epic_slime.slime.data_source.StreamingDataSource",
        "--custom-megatron-init-path",
        "epic_slime.slime.push_mode.install_train_hook",
    ]
    assert parsed == [argv]  # the checks included (spelling, then the values of slime flags)
