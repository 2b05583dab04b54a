"""Run the suite in two lanes at once, each a pytest process of its own, and exit as the suite would.

    python .ci/lanes.py [pytest options...]

Most end-to-end tests wait on another process (the SGLang server, a Megatron worker, a Ray actor), so
one pytest keeps about one of CI's 2 cores busy. The lanes split the suite by tier markers
(tests/conftest.py), and every test falls in exactly one lane:

- ``server``: the tests that need the real SGLang server or run Megatron-core. The real server and
  router start once, in this lane only. The launcher's tests (bash processes) join it to even the two out:
  without them this lane took 2042 s of test time and the other 2942 s (a clean-clone run at load 10-14).
- ``rest``: everything else.

The ``rest`` lane prints as it runs; the ``server`` lane's output is kept in ``.ci-out/lane-server.log``
and printed after it. Each lane writes its tests' durations to ``.ci-out/durations-<lane>.tsv`` when
EPIC_SLIME_TEST_DURATIONS is set (``.ci/durations.py`` sums both). The exit status is the first
failing lane's; pytest's "no tests collected" (5) only when both lanes collected none.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LANES = {
    "server": "real_sglang or megatron or launch",
    "rest": "not (real_sglang or megatron or launch)",
}
NO_TESTS = 5  # pytest's exit status when it collected nothing


def combined_exit(codes: list[int]) -> int:
    """One exit status for the suite from its lanes': a lane that collected nothing is not a failure
    unless no lane collected anything."""
    if all(code == NO_TESTS for code in codes):
        return NO_TESTS
    failing = [code for code in codes if code not in (0, NO_TESTS)]
    return failing[0] if failing else 0


def lane_command(expression: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "--durations=15", "-m", expression, *extra]


def lane_env(name: str, out: Path) -> dict[str, str]:
    env = dict(os.environ)
    if env.get("EPIC_SLIME_TEST_DURATIONS"):
        env["EPIC_SLIME_TEST_DURATIONS"] = str(out / f"durations-{name}.tsv")
    return env


def main(extra: list[str]) -> int:
    out = Path(".ci-out")
    out.mkdir(exist_ok=True)
    log_path = out / "lane-server.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            lane_command(LANES["server"], extra), env=lane_env("server", out), stdout=log, stderr=subprocess.STDOUT
        )
        print(f"lanes: the server lane (-m {LANES['server']!r}) runs beside this one; its log: {log_path}", flush=True)
        try:
            rest = subprocess.run(lane_command(LANES["rest"], extra), env=lane_env("rest", out)).returncode
            print("lanes: the rest lane is done; waiting for the server lane", flush=True)
            server_code = server.wait()
        finally:
            if server.poll() is None:  # interrupted: the lane's pytest stops its own server and router
                server.terminate()
                server.wait(timeout=60)
    print(f"\n==== the server lane (-m {LANES['server']!r}) ====", flush=True)
    sys.stdout.write(log_path.read_text())
    print(f"lanes: server exited {server_code}, rest exited {rest}", flush=True)
    return combined_exit([server_code, rest])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
