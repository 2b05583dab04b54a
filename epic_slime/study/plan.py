"""The study's plan: its configuration file, the runs it implies, and each run's `epic-slime train` argv.

Pure and fast (no model, no Ray): the run phase (`study.run`) executes the plan, the report phase
(`study.report`, `study.ladder`) reads what the runs wrote.

Pairing: for a seed, every method gets the same warm start (`warm_start_seed`), the same data order
and rollout sampling streams (both keyed by the seed and the data position) and the same
validation / test prompts and evaluation streams (keyed by the seed and the version).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
QUICK_CONFIG = REPO / "configs" / "study" / "quick.yaml"
DEFAULT_CONFIG = REPO / "configs" / "study" / "default.yaml"
LADDER_CONFIG = REPO / "configs" / "study" / "ladder.yaml"
LADDER_QUICK_CONFIG = REPO / "configs" / "study" / "ladder_quick.yaml"
STRESS_CONFIG = REPO / "configs" / "study" / "stress.yaml"
STRESS_QUICK_CONFIG = REPO / "configs" / "study" / "stress_quick.yaml"
_STUDY_KEYS = {"seeds", "methods", "settings", "test_prompts", "train"}
_OPTIONAL_KEYS = {
    "ladder",
    "stress",
    "contrast",
}  # ladder: true adds the lag-ladder analysis (study.ladder); stress: its
# axes (ordered setting names, mildest first) add the stress-ladder analysis (study.stress); contrast: the
# pre-registered difference-in-differences (study.contrast)
# run keys the study sets itself (per run) and a config may not override
_RESERVED = {
    "seed",
    "output_dir",
    "policy_loss",
    "save_interval",
    "save",
    "load",
    "progress",
    "plots",
    "warm_start_cache_dir",
}


class StudyConfigError(ValueError):
    """Bad study configuration; the message names the field and the value."""


@dataclass(frozen=True)
class StudyConfig:
    seeds: list[int]
    methods: list[str]
    settings: list[dict]
    test_prompts: int
    train: dict
    path: str
    ladder: bool = False
    stress: dict | None = None  # {"axes": {axis: [setting, ...]}}, mildest first (study.stress)
    contrast: dict | None = None  # {"method", "baselines", "target", "reference"} (study.contrast)


@dataclass(frozen=True)
class RunSpec:
    setting: str
    method: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.setting}/{self.method}_s{self.seed}"


def load_study_config(path: str | Path) -> StudyConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise StudyConfigError(f"--config: file not found: {path}") from None
    except yaml.YAMLError as e:
        from epic_slime.yaml_errors import yaml_error_line

        raise StudyConfigError(f"--config {yaml_error_line(path, e)}") from None
    if not isinstance(data, dict):
        raise StudyConfigError(f"{path}: top level must be a mapping")
    unknown = set(data) - _STUDY_KEYS - _OPTIONAL_KEYS
    missing = _STUDY_KEYS - set(data)
    if unknown or missing:
        raise StudyConfigError(f"{path}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    seeds, methods, settings = data["seeds"], data["methods"], data["settings"]
    if not (
        isinstance(seeds, list)
        and seeds
        and all(isinstance(s, int) and s >= 0 for s in seeds)
        and len(set(seeds)) == len(seeds)
    ):
        raise StudyConfigError(f"{path}: seeds must be a list of distinct non-negative integers, got {seeds!r}")
    from epic_slime.losses import LOSS_MODES

    if not (isinstance(methods, list) and methods) or any(m not in LOSS_MODES for m in methods):
        raise StudyConfigError(f"{path}: methods must be loss modes of {sorted(LOSS_MODES)}, got {methods!r}")
    if "epic" not in methods:
        raise StudyConfigError(f"{path}: methods must include 'epic' (the paired baseline), got {methods!r}")
    if not (isinstance(settings, list) and settings) or any(
        not isinstance(s, dict) or not isinstance(s.get("name"), str) for s in settings
    ):
        raise StudyConfigError(f"{path}: settings must be a list of mappings with a 'name', got {settings!r}")
    if len({s["name"] for s in settings}) != len(settings):
        raise StudyConfigError(f"{path}: setting names must be distinct, got {[s['name'] for s in settings]}")
    train = data["train"]
    if not isinstance(train, dict):
        raise StudyConfigError(f"{path}: train must be a mapping of `epic-slime train` keys, got {train!r}")
    for where, keys in [("train", set(train)), *((f"settings[{s['name']}]", set(s) - {"name"}) for s in settings)]:
        if keys & _RESERVED:
            raise StudyConfigError(f"{path}: {where} sets {sorted(keys & _RESERVED)}, which the study sets per run")
    test_prompts = data["test_prompts"]
    if not isinstance(test_prompts, int) or test_prompts < 1:
        raise StudyConfigError(f"{path}: test_prompts must be a positive integer, got {test_prompts!r}")
    ladder = data.get("ladder", False)
    if not isinstance(ladder, bool):
        raise StudyConfigError(f"{path}: ladder must be true or false, got {ladder!r}")
    stress = _check_stress(path, data.get("stress"), [s["name"] for s in settings])
    contrast = _check_contrast(path, data.get("contrast"), [s["name"] for s in settings], methods)
    return StudyConfig(
        seeds=list(seeds),
        methods=list(methods),
        settings=[dict(s) for s in settings],
        test_prompts=test_prompts,
        train=dict(train),
        path=str(path),
        ladder=ladder,
        stress=stress,
        contrast=contrast,
    )


def _check_contrast(path: Path, contrast, names: list[str], methods: list[str]) -> dict | None:
    """`contrast: {method: M, baselines: [B, ...], target: S1, reference: S0}`: per seed
    (M - B)[S1] - (M - B)[S0], the first baseline the primary one."""
    if contrast is None:
        return None
    keys = {"method", "baselines", "target", "reference"}
    if not isinstance(contrast, dict) or set(contrast) != keys:
        raise StudyConfigError(f"{path}: contrast must be a mapping with keys {sorted(keys)}, got {contrast!r}")
    baselines = contrast["baselines"]
    if (
        contrast["method"] not in methods
        or not isinstance(baselines, list)
        or not baselines
        or any(b not in methods or b == contrast["method"] for b in baselines)
    ):
        raise StudyConfigError(
            f"{path}: contrast.method and contrast.baselines must be distinct methods of "
            f"{methods}, got {contrast['method']!r}, {baselines!r}"
        )
    for key in ("target", "reference"):
        if contrast[key] not in names:
            raise StudyConfigError(f"{path}: contrast.{key} must be a setting of {names}, got {contrast[key]!r}")
    return dict(contrast, baselines=list(baselines))


def _check_stress(path: Path, stress, names: list[str]) -> dict | None:
    """`stress: {axes: {axis: [setting, ...]}}`: each axis an ordered list (mildest first, at least two)
    of the config's setting names; every setting on some axis."""
    if stress is None:
        return None
    axes = stress.get("axes") if isinstance(stress, dict) else None
    if not isinstance(stress, dict) or set(stress) != {"axes"} or not isinstance(axes, dict) or not axes:
        raise StudyConfigError(f"{path}: stress must be a mapping {{axes: {{axis: [setting, ...]}}}}, got {stress!r}")
    for axis, levels in axes.items():
        if not (isinstance(levels, list) and len(levels) >= 2 and len(set(levels)) == len(levels)):
            raise StudyConfigError(
                f"{path}: stress.axes.{axis} must list at least two distinct settings, got {levels!r}"
            )
        unknown = [x for x in levels if x not in names]
        if unknown:
            raise StudyConfigError(
                f"{path}: stress.axes.{axis} names settings {unknown} that are not in settings {names}"
            )
    loose = [n for n in names if not any(n in levels for levels in axes.values())]
    if loose:
        raise StudyConfigError(f"{path}: settings {loose} are on no stress axis")
    return {"axes": {a: list(v) for a, v in axes.items()}}


def plan(cfg: StudyConfig) -> list[RunSpec]:
    """Seed-major order, so that a study cut short still holds complete pairs for its first seeds."""
    return [RunSpec(s["name"], m, seed) for seed in cfg.seeds for s in cfg.settings for m in cfg.methods]


def train_flags(values: dict) -> list[str]:
    argv = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            argv += [flag, str(value)]
    return argv


def run_argv(cfg: StudyConfig, spec: RunSpec, run_dir: Path, cache_dir: Path) -> list[str]:
    """The `epic-slime train` argv of one run (checkpoints at every evaluation, for selection)."""
    values = setting_values(cfg, spec.setting)
    interval = values.get("eval_interval", 25)
    return [
        *train_flags(values),
        "--policy-loss",
        spec.method,
        "--seed",
        str(spec.seed),
        "--output-dir",
        str(run_dir),
        "--save-interval",
        str(interval),
        "--no-progress",
        "--no-plots",
        "--warm-start-cache-dir",
        str(cache_dir),
    ]


def setting_values(cfg: StudyConfig, setting: str) -> dict:
    """The train keys of one setting (the shared `train` block overridden by the setting)."""
    s = next(s for s in cfg.settings if s["name"] == setting)
    return {**cfg.train, **{k: v for k, v in s.items() if k != "name"}}
