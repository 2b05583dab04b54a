"""`python -m epic_slime.study.gate --config X.yaml --output-dir D --setting S`: train (into the study's
warm-start cache) and measure setting S's warm start before any of its runs, record it in
`D/warm_start.json` exactly as the run phase would (`by_setting`), and exit 0 when the setting is
testable (its warm start more than `stress.BREAK_MARGIN` above its task's chance level), 3 when not.

A study queue calls it before an expensive stage, so that runs from a warm start at chance (which can
show nothing, `stress.testable`) are not made: the mechanism study's long task (docs/study/mechanism).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NOT_TESTABLE = 3


def decide(entry: dict) -> bool:
    from .stress import testable

    return testable(entry["test_mean"], entry["chance"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m epic_slime.study.gate")
    p.add_argument("--config", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--setting", required=True)
    a = p.parse_args(argv)
    from .files import WARM_START, read_warm_start, write_json_atomically
    from .plan import load_study_config
    from .run import measure_warm_start, missing_warm_start_seeds, warm_starts_by_setting

    cfg = load_study_config(a.config)
    if a.setting not in [s["name"] for s in cfg.settings]:
        print(f"gate: --setting {a.setting!r} is not a setting of {a.config}", file=sys.stderr)
        return 2
    out = Path(a.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = read_warm_start(out)
    if record is None or missing_warm_start_seeds(cfg, record):
        record = measure_warm_start(cfg, out, previous=record)
    warm_starts_by_setting(cfg, out, record, [a.setting], train=True)
    write_json_atomically(out / WARM_START, record)
    entry = record["by_setting"][a.setting]
    ok = decide(entry)
    print(
        f"[gate] {a.setting}: warm start test {entry['test_mean']:.3f} (by seed {entry['test_by_seed']}), "
        f"chance {entry['chance']:.3f}: {'testable' if ok else 'NOT testable (within the margin of chance)'}"
    )
    return 0 if ok else NOT_TESTABLE


if __name__ == "__main__":
    raise SystemExit(main())
