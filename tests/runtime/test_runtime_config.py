"""Configuration: defaults < YAML < flags, shared flag names, clear errors."""

from pathlib import Path

import pytest

from epic_slime.runtime.cli import train_main
from epic_slime.losses import LOSS_MODES
from epic_slime.runtime.config import ConfigError, parse_config

REPO = Path(__file__).resolve().parents[2]


def test_default_yaml_parses_and_flags_override(tmp_path):
    cfg = parse_config(["--config", str(REPO / "configs/local/default.yaml")])
    assert cfg.policy_loss == "epic" and cfg.update_depth == 8 and cfg.use_kl_loss
    cfg = parse_config(
        [
            "--config",
            str(REPO / "configs/local/default.yaml"),
            "--policy-loss",
            "grpo",
            "--update-depth",
            "4",
            "--max-staleness",
            "0",
            "--seed",
            "7",
            "--output-dir",
            str(tmp_path),
            "--grpo-clip-high",
            "0.28",
            "--stale-policy",
            "keep",
            "--rollout-mode",
            "sync",
        ]
    )
    assert (cfg.policy_loss, cfg.update_depth, cfg.max_staleness, cfg.seed) == ("grpo", 4, 0, 7)
    assert cfg.output_dir == str(tmp_path) and cfg.stale_policy == "keep" and cfg.rollout_mode == "sync"
    assert cfg.policy_loss_params == {"clip_high": 0.28}


def test_every_local_config_is_valid():
    import yaml

    paths = sorted((REPO / "configs/local").glob("*.yaml"))
    assert len(paths) >= 4
    for path in paths:
        cfg = parse_config(["--config", str(path)])
        # every key of the file reaches the resolved config (nothing silently dropped)
        resolved = {
            **cfg.to_dict(),
            **{
                f"{LOSS_MODES[cfg.policy_loss].flag_prefix.replace('-', '_')}_{k}": v
                for k, v in cfg.policy_loss_params.items()
            },
        }
        for key, value in yaml.safe_load(path.read_text()).items():
            want = (
                float(value)
                if isinstance(value, str)
                and key not in ("output_dir",)
                and value.replace(".", "").replace("e-", "").isdigit()
                else value
            )
            assert resolved[key] == want, (path.name, key, resolved[key], want)


def _yaml(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return str(p)


def test_yaml_values_and_scientific_notation(tmp_path):
    cfg = parse_config(
        ["--config", _yaml(tmp_path, "lr: 1e-4\nkl_loss_coef: 1e-3\nuse_kl_loss: true\nepic_delta_low: 1e-3\n")]
    )
    assert cfg.lr == 1e-4 and cfg.kl_loss_coef == 1e-3 and cfg.policy_loss_params == {"delta_low": 1e-3}
    # a flag beats the file
    assert parse_config(["--config", _yaml(tmp_path, "lr: 1e-4\n"), "--lr", "2e-4"]).lr == 2e-4


@pytest.mark.parametrize(
    "text,match",
    [
        ("learning_rate: 0.1\n", "unknown key 'learning_rate'"),
        ("update_depth: two\n", "update_depth must be an integer"),
        ("update_depth: 0\n", "update_depth: invalid value 0"),
        ("update_depth: 3\n", "update_depth=3 must divide"),
        ("stale_policy: ignore\n", "stale_policy must be one of"),
        ("use_kl_loss: yes please\n", "use_kl_loss must be true or false"),
        ("rollout_top_p: 1.5\n", "rollout_top_p: invalid value 1.5"),
        ("policy_loss: nope\n", "policy_loss must be one of"),
        ("kl_loss_coef: 0.01\nuse_kl_loss: false\n", "kl_loss_coef=0.01 has no effect"),
        ("- a\n- b\n", "top level must be a mapping"),
    ],
)
def test_bad_yaml_is_a_clear_error(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(["--config", _yaml(tmp_path, text)])


def test_loss_parameter_of_another_mode_is_rejected():
    with pytest.raises(ConfigError, match="grpo"):
        parse_config(["--policy-loss", "epic", "--grpo-clip-low", "0.2"])


def test_cli_returns_2_with_a_message(tmp_path, capsys):
    assert train_main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "file not found" in capsys.readouterr().err
    assert train_main(["--update-depth", "5", "--output-dir", str(tmp_path / "run")]) == 2
    assert "update_depth=5" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_main(["--max-staleness", "-x"])


def test_help_exits_cleanly(capsys):
    with pytest.raises(SystemExit) as e:
        train_main(["--help"])
    assert e.value.code == 0 and "--max-staleness" in capsys.readouterr().out


def test_sweep_rejects_per_run_flags_and_bad_values(tmp_path, capsys):
    from epic_slime.runtime.cli import sweep_main

    assert sweep_main(["--policy-loss", "grpo", "--output-dir", str(tmp_path)]) == 2
    assert "--policy-loss is set per run" in capsys.readouterr().err
    assert sweep_main(["--policy-losses", "epic,nope", "--output-dir", str(tmp_path)]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text,expected",
    [
        ("epic_delta_low: 0.001\n", {"delta_low": 0.001}),  # a YAML float
        ("epic_delta_low: 5e-4\n", {"delta_low": 5e-4}),  # PyYAML reads this one as a string
        ("epic_delta_high: 1\n", {"delta_high": 1}),  # a YAML int
        ("epic_delta_low: null\n", {}),  # null = the mode's default
        ("policy_loss: bandpo\nbandpo_generator: tv\nbandpo_delta: 0.1\n", {"generator": "tv", "delta": 0.1}),
        ("policy_loss: grpo\ngrpo_dual_clip: 3\n", {"dual_clip": 3}),
    ],
)
def test_loss_parameters_of_every_yaml_type(tmp_path, text, expected):
    assert parse_config(["--config", _yaml(tmp_path, text)]).policy_loss_params == expected


@pytest.mark.parametrize(
    "text,match",
    [
        ("epic_delta_low: 0\n", "delta_low=0 must be a finite number > 0"),
        ("epic_delta_low: -1.0\n", "delta_low=-1.0 must be a finite number > 0"),
        ("epic_delta_low: true\n", "epic_delta_low"),
        ("policy_loss: bandpo\nbandpo_generator: 3\n", "generator=3 must be one of"),
    ],
)
def test_bad_loss_parameter_in_yaml_is_a_clear_error(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(["--config", _yaml(tmp_path, text)])


@pytest.mark.parametrize(
    "flag,value,expected",
    [
        ("--epic-delta-low", "0.001", 0.001),
        ("--epic-delta-low", "5e-4", 5e-4),
        ("--epic-delta-high", "1", 1),
    ],
)
def test_loss_parameters_on_the_command_line(flag, value, expected):
    assert parse_config([flag, value]).policy_loss_params == {flag[len("--epic-") :].replace("-", "_"): expected}
    assert parse_config(["--epic-delta-low", "null"]).policy_loss_params == {}


def test_yaml_number_parameter_trains_through_the_cli(tmp_path, capsys):
    # the crash of the issue was an exit 1 with a traceback: now it is a config error naming the field
    # its own output folder: never the checkout's runs/local-default, which the README's command 1 fills
    assert train_main(["--config", _yaml(tmp_path, "epic_delta_low: 0\n"), "--output-dir", str(tmp_path / "run")]) == 2
    assert "delta_low=0" in capsys.readouterr().err


def test_every_sweep_option_has_help_and_its_default():
    from epic_slime.runtime.sweep import build_sweep_parser

    actions = [a for a in build_sweep_parser()._actions if a.dest != "help"]
    assert {a.dest for a in actions} == {"policy_losses", "update_depths", "seeds", "output_dir"}
    for a in actions:
        assert a.help and "default" in a.help, a.dest
    assert build_sweep_parser().parse_args([]).update_depths is None  # then the config's update_depth


def test_every_option_has_help_and_a_rule_or_a_reason_for_none():
    from epic_slime.runtime.config import FIELDS

    assert len(FIELDS) >= 60  # the table is read from the dataclass: an empty read would pass the loop
    for opt in FIELDS.values():
        assert opt.help.strip(), f"{opt.name}: no help text"
        checked = opt.rule is not None or opt.choices is not None or opt.type is bool  # bool: true or false
        assert checked or opt.unchecked.strip(), f"{opt.name}: no rule, no choices and no reason for none"
        assert not (checked and opt.unchecked), f"{opt.name}: a rule and a reason for none"
        assert opt.nullable == (opt.default is None), f"{opt.name}: null allowed iff it is the default"


def _help_entries(monkeypatch) -> dict[str, str]:
    """--help as flag -> its whole entry on one line (a wide terminal: argparse wraps nothing)."""
    from epic_slime.runtime.config import build_parser

    monkeypatch.setenv("COLUMNS", "10000")
    entries, current = {}, None
    for line in build_parser().format_help().splitlines():
        if line.startswith("  -"):
            current = line.split()[0].rstrip(",")
            entries[current] = line
        elif current is not None and line.startswith("   "):
            entries[current] += " " + line.strip()
    return entries


def test_help_lists_every_option_with_its_default(monkeypatch):
    from epic_slime.runtime.config import FIELDS

    entries = _help_entries(monkeypatch)
    for opt in FIELDS.values():
        entry = entries.get(opt.flag)
        assert entry is not None, f"{opt.flag} is not in --help"
        assert opt.help in entry, opt.flag
        if "default:" in opt.help:  # the text states its default itself (a derived one: <output-dir>/...)
            assert entry.count("default:") == 1, entry
        else:
            assert entry.endswith(f"(default: {opt.default})"), entry


def test_every_option_is_a_yaml_key_read_as_its_type(tmp_path):
    """A file that sets every option to its default parses back to the defaults (the keys, the types)."""
    import yaml

    from epic_slime.runtime.config import FIELDS

    text = yaml.safe_dump({name: opt.default for name, opt in FIELDS.items()})
    cfg = parse_config(["--config", _yaml(tmp_path, text)])
    for name, opt in FIELDS.items():
        value = getattr(cfg, name)
        assert value == opt.default and type(value) is type(opt.default), (name, value)
