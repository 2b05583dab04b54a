import os
import pathlib
import sys

import pytest

TESTS_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data" / "math"

# Import the package from this checkout even when another copy is installed, and the stand-ins and
# helpers as `support.<module>` from every test folder.
for path in (REPO_ROOT, TESTS_DIR):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


@pytest.fixture
def shared_math_dir():
    """../shared/data/math when present; skip otherwise (the tests must run without it)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared math data not present at {SHARED_DATA}")
    return SHARED_DATA


# ---- a time limit on every test, and what the slow ones are doing ----
#
# pytest-timeout (pyproject: `timeout`, method "signal"): a test past its limit fails with its name
# and a traceback of where it waited, and the suite goes on. The default (120 s) is for unit tests:
# the slowest outside the files below took 16 s at load average 8-12 on 2 cores. The files below run
# Ray, child processes or whole trainings; their limits are 2.5x or more their slowest test measured
# at load average 8-12 on 2 cores (2026-12-02; in brackets), several times that idle.
# EPIC_SLIME_TEST_TIMEOUT_SCALE multiplies every limit (e.g. 3 on a very busy machine); `--timeout N`
# on the command line sets one limit for all (0: none, e.g. under a debugger).
SLOW_FILE_TIMEOUT_S: dict[str, float] = {
    "tests/runtime/test_runtime_e2e.py": 300,  # [20 s idle; the loaded run: 122 s]
    # the calc agent task: one tiny async run (6 steps), one pool session [344 s the file at load average ~30]
    "tests/runtime/test_runtime_agent_e2e.py": 600,
    "tests/slime_adapter/test_slime_e2e.py": 300,  # [98 s the two-engine run through the router]
    "tests/slime_adapter/test_slime_e2e_deciles.py": 300,  # one 8-rollout K = 2 session
    "tests/slime_adapter/test_slime_e2e_agent.py": 600,  # [142 s a 4-rollout multi-turn session at load ~10]
    "tests/study/test_study_runner.py": 600,  # [116 s the tiny study]
    "tests/evaluation/test_evaluation_cli.py": 300,  # [11 s]
    "tests/evaluation/test_reward_isolation.py": 300,  # [9 s]
    "tests/launch/test_launch_reeval.py": 300,
    "tests/bench/test_gpu_check.py": 300,  # [43 s its module's set-up]
    "tests/slime_adapter/test_slime_contract.py": 300,  # [19 s]
    "tests/slime_adapter/test_router_standin.py": 300,  # [35 s starting two SGLang stand-ins at load 8-10]
    # the first test to use `real_engines` may wait for the real server's start (~2.5 min at load 6)
    "tests/slime_adapter/test_real_sglang.py": 600,
    "tests/integrations/test_trl.py": 300,  # [25 s the 8-step GRPOTrainer run at load 17-22]
    "tests/integrations/test_verl.py": 300,  # [21 s a fresh process importing verl at load 17-22]
    "tests/slime_adapter/test_real_sglang_retract.py": 600,  # as above when it runs first
    "tests/evaluation/test_evaluate_real_sglang.py": 900,  # two starts of sglang.Engine on CPU, 2 x 256 samples
    # one e2e session against the real server (plus its start when this file runs first)
    "tests/slime_adapter/test_slime_e2e_real.py": 1200,
    "tests/slime_adapter/test_sglang_conformance.py": 600,
    "tests/slime_adapter/test_sglang_conformance_weights.py": 600,
    "tests/slime_adapter/test_router_conformance.py": 300,  # a real router (~30 s to start) before two stand-ins
    # a real server of its own (started beside the router outage session) and three real-engine sessions
    # [209 s the outage session's set-up; the whole file 510-596 s at load average 15-25 on 2026-12-06]
    "tests/slime_adapter/test_real_router_driver_faults.py": 1500,
    # a second real server's start (when this file runs first), a restart of one, rollouts across faults
    "tests/slime_adapter/test_engine_faults_real.py": 900,
    # Megatron-core on CPU in worker processes of their own (tests/support/megatron_worker.py):
    # [measured below, idle and at load]
    "tests/slime_adapter/test_megatron_cpu_patches.py": 900,
    "tests/slime_adapter/test_megatron_loss.py": 1200,
    "tests/slime_adapter/test_megatron_r3.py": 1200,
    # a TP 2 conversion worker, then pushes into the real server (plus its start when this file runs first)
    # [223-293 s the whole file at load average 25-60, 2026-12-07]
    "tests/slime_adapter/test_megatron_push.py": 1200,
    # slime's actor: a train process and one without a patch, then a load process and one without a patch
    # [378 s at load average ~25, 625 s at 44-63, 2026-12-07]
    "tests/slime_adapter/test_megatron_actor.py": 1500,
    # slime's actor group under a real Ray: 4 rollouts, 5 pushes into the real server, one save (plus the
    # server's start when this file runs first) [495 s the run at load average ~33, 2026-12-07]
    "tests/slime_adapter/test_megatron_ray_actor.py": 1500,
    # slime's actor killed at each boundary of a checkpoint's two saves: four processes of it in turn
    # [357 s at load average 30-39; 1044 s at 20-32 beside two more copies of it, 2026-12-07]
    "tests/slime_adapter/test_megatron_checkpoint_kill.py": 1800,
}
# single tests beyond their file's limit
SLOW_TEST_TIMEOUT_S: dict[str, float] = {
    "tests/study/test_study_runner.py::test_quick_ladder_end_to_end": 1500,  # [378 s; ~15 min at load 5-11]
    # a fresh process of verl's own venv importing verl, torch and Hydra's compose [30-48 s at load 17-23]
    "tests/integrations/test_verl_user_path.py::test_verl_installed_as_the_page_says_loads_the_plugin_and_reads_the_setting": 300,
    # the real server's start (when this test is the first to ask for it) and a 3-rollout multi-turn session
    "tests/slime_adapter/test_slime_e2e_agent.py::test_multi_turn_trajectories_on_the_real_server": 1200,
}
TIMEOUT_SCALE_ENV = "EPIC_SLIME_TEST_TIMEOUT_SCALE"


def _timeout_scale() -> float:
    raw = os.environ.get(TIMEOUT_SCALE_ENV, "1")
    try:
        scale = float(raw)
    except ValueError:
        scale = -1.0
    if not scale > 0:
        raise pytest.UsageError(f"{TIMEOUT_SCALE_ENV}={raw!r}: must be a number > 0")
    return scale


def _test_file(item) -> str:
    return pathlib.Path(str(item.fspath)).resolve().relative_to(REPO_ROOT).as_posix()


def time_limit_s(item, default_s: float) -> float:
    """The limit pytest-timeout applies to this test: its own, else its file's, else the default;
    times the scale."""
    path = _test_file(item)
    name = item.nodeid.split("::", 1)[1].split("[")[0] if "::" in item.nodeid else ""
    own = SLOW_TEST_TIMEOUT_S.get(f"{path}::{name}")
    return (own or SLOW_FILE_TIMEOUT_S.get(path, default_s)) * _timeout_scale()


# ---- the test tiers ----
#
# The list above that sets a slow file's time limit also sets its tier: each of its tests is marked `slow`
# (`-m "not slow"` is the fast tier). A test that needs the real SGLang server is also `real_sglang`, and
# one whose module imports slime's own code (or calls support.slime_env.require_slime) is `needs_slime`, and
# one in a Megatron file (MEGATRON_FILES: Megatron-core on CPU in processes of its own) is `megatron`, and
# one under LAUNCH_TESTS (the launch scripts and their dry runs, each in a bash process) is `launch`.
# Markers are added before -m deselects (tryfirst), so `-m` sees them.
TIER_MARKERS = ("slow", "real_sglang", "needs_slime", "megatron", "launch")
MEGATRON_FILES = "tests/slime_adapter/test_megatron_"  # the prefix of every such file
LAUNCH_TESTS = "tests/launch/"


def tier_markers(item) -> list[str]:
    """The tier markers this test gets from the lists and its fixtures (in TIER_MARKERS' order)."""
    path = _test_file(item)
    own = SLOW_TEST_TIMEOUT_S.get(f"{path}::{item.nodeid.split('::', 1)[-1].split('[')[0]}")
    tiers = []
    if path in SLOW_FILE_TIMEOUT_S or own is not None:
        tiers.append("slow")
    if _needs_real_engines(item) or "victim_server" in getattr(item, "fixturenames", ()):
        tiers.append("real_sglang")
    if _imports_slime(getattr(item, "module", None)):
        tiers.append("needs_slime")
    if path.startswith(MEGATRON_FILES):
        tiers.append("megatron")
    if path.startswith(LAUNCH_TESTS):
        tiers.append("launch")
    return tiers


def _imports_slime(module) -> bool:
    """The test module holds one of slime's own modules, or a function or class from one (imported at
    its top: a module that would skip without slime has already skipped at collection)."""
    if module is None:
        return False
    if getattr(module, "NEEDS_SLIME", False):
        return True
    for value in vars(module).values():
        name = getattr(value, "__name__", "") if isinstance(value, type(sys)) else getattr(value, "__module__", "")
        if isinstance(name, str) and (name == "slime" or name.startswith("slime.")):
            return True
    return False


class _TierMarkers:
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config, items):
        for item in items:
            for name in tier_markers(item):
                if item.get_closest_marker(name) is None:
                    item.add_marker(getattr(pytest.mark, name))


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: no server for tests not run
def pytest_collection_modifyitems(config, items):
    _launch_real_engines_if_needed(items)
    _ANNOUNCE.clear()
    _ANNOUNCE.update(announcements(items, float(config.getini("timeout") or 0)))
    if config.getoption("timeout", None) is not None:  # --timeout N given: one limit for all
        return
    default_s = float(config.getini("timeout") or 0)
    if default_s <= 0:
        return
    for item in items:
        if item.get_closest_marker("timeout") is None:  # a test's own marker wins
            item.add_marker(pytest.mark.timeout(time_limit_s(item, default_s)))


def announcements(items, default_s: float) -> dict[str, str]:
    """nodeid -> the line printed as that test starts: the first test of each slow file names the file,
    and each end-to-end test (marked `slow`) names itself, so that a long pause in `-q` output (the
    suite's slow tail) says what is running. Other tests stay dots."""
    out, files_seen = {}, set()
    per_file: dict[str, int] = {}
    for item in items:
        per_file[_test_file(item)] = per_file.get(_test_file(item), 0) + 1
    for item in items:
        path = _test_file(item)
        limit = f"limit {time_limit_s(item, default_s):.0f} s" if default_s > 0 else "no limit"
        if item.get_closest_marker("slow") is not None:
            out[item.nodeid] = f"running {item.nodeid} (end-to-end; {limit})"
        elif path in SLOW_FILE_TIMEOUT_S and path not in files_seen:
            out[item.nodeid] = f"running {path} ({per_file[path]} tests of a slow file; {limit} each)"
        files_seen.add(path)
    return out


def pytest_runtest_logstart(nodeid, location):
    line = _ANNOUNCE.get(nodeid)
    tr = _REPORTER.get("tr")
    if line is None or tr is None:
        return
    if getattr(getattr(tr, "_tw", None), "width_of_current_line", 0):  # after -q's dots: a line of its own
        tr.write("\n")
    tr.write_line(line)


_ANNOUNCE: dict[str, str] = {}
_REPORTER: dict = {}


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    _REPORTER["tr"] = config.pluginmanager.get_plugin("terminalreporter")
    if not config.pluginmanager.has_plugin("epic-slime-tiers"):
        config.pluginmanager.register(_TierMarkers(), "epic-slime-tiers")
    durations = os.environ.get(DURATIONS_ENV)
    if durations and not config.pluginmanager.has_plugin("epic-slime-durations"):
        config.pluginmanager.register(_DurationsFile(pathlib.Path(durations)), "epic-slime-durations")


# ---- each test's duration, as data ----
#
# With EPIC_SLIME_TEST_DURATIONS=<file> (.ci/run sets it), every test's set-up + call + tear-down time is
# written there as a tab-separated line: seconds, outcome, tier markers, node id, slowest first.
# `python .ci/durations.py <file>` sums it by tier (the slow share of the suite).
DURATIONS_ENV = "EPIC_SLIME_TEST_DURATIONS"


class _DurationsFile:
    def __init__(self, path: pathlib.Path):
        self.path, self.rows, self.tiers = path, {}, {}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        self.tiers = {item.nodeid: [m for m in TIER_MARKERS if item.get_closest_marker(m)] for item in items}

    def pytest_runtest_logreport(self, report):
        seconds, outcome = self.rows.get(report.nodeid, (0.0, "passed"))
        if report.outcome != "passed" and outcome == "passed":
            outcome = report.outcome
        self.rows[report.nodeid] = (seconds + report.duration, outcome)

    def pytest_sessionfinish(self, session, exitstatus):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = ["seconds\toutcome\ttiers\tnodeid"]
        for nodeid, (seconds, outcome) in sorted(self.rows.items(), key=lambda kv: -kv[1][0]):
            lines.append(f"{seconds:.3f}\t{outcome}\t{','.join(self.tiers.get(nodeid, [])) or '-'}\t{nodeid}")
        self.path.write_text("\n".join(lines) + "\n")


# ---- the real SGLang server and sglang-router (tests/support/real_sglang.py) ----
#
# One server behind one router for the whole session, launched right after collection when a collected
# test asks for `real_engines` (its imports take 1.5-2 min, overlapping the tests before it); stopped at
# the end. Its logs stay in the folder printed at the end when a test failed.

_REAL: dict = {}


def _needs_real_engines(item) -> bool:
    """Asks for ``real_engines``, or is the real-server half of a conformance test (``engine``
    parametrised over the stand-in and the real server, tests/support/conformance.py)."""
    if "real_engines" in getattr(item, "fixturenames", ()):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("engine") == "real"


def _launch_real_engines_if_needed(items) -> None:
    if _REAL or not any(_needs_real_engines(item) for item in items):
        return
    import tempfile

    from support import real_sglang

    reason = real_sglang.unavailable_reason()
    if reason is not None:
        _REAL["reason"] = reason
        return
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="epic-slime-real-sglang-"))
    _REAL["workdir"] = workdir
    try:
        _REAL["engines"] = real_sglang.engines_for_session(workdir)
    except Exception as exc:  # noqa: BLE001 - reported by the fixture, where a test asks for it
        _REAL["reason"] = f"could not launch the real SGLang server: {exc!r} (logs in {workdir})"
        return
    # a second server, the victim the engine-fault tests kill (test_engine_faults_real.py): launched now
    # too, so its start overlaps the tests before it
    if any("victim_server" in getattr(item, "fixturenames", ()) for item in items):
        try:
            _REAL["victim"] = real_sglang.RealServer(_REAL["engines"].model_dir, workdir, weight_version="1")
        except Exception as exc:  # noqa: BLE001 - reported by the fixture
            _REAL["victim_reason"] = f"could not launch the victim SGLang server: {exc!r} (logs in {workdir})"


def _skip_or_fail(reason: str) -> None:
    """A real-engine fixture that has no engine: a skip with the reason, or a failure under
    EPIC_SLIME_REQUIRE_REAL_SGLANG=1 (CI)."""
    from support import real_sglang

    if real_sglang.required():
        pytest.fail(f"{real_sglang.REQUIRE_ENV}=1 and {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def real_engines():
    """The real server and router (started once), or a skip with the reason; under
    EPIC_SLIME_REQUIRE_REAL_SGLANG=1 (CI) a failure instead of a skip."""
    from support import real_sglang

    engines = _REAL.get("engines")
    if engines is None:
        _skip_or_fail(_REAL.get("reason") or real_sglang.unavailable_reason() or "real engines not launched")
    try:
        return engines.ready()
    except RuntimeError as exc:
        pytest.fail(f"the real SGLang server did not come up: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def victim_server(real_engines):
    """A second real server at weight version "1", behind no router yet, for the tests that kill it (they
    own it: it may be dead after them); a skip or, in CI, a failure as for ``real_engines``."""
    victim = _REAL.get("victim")
    if victim is None:
        _skip_or_fail(_REAL.get("victim_reason") or "the victim server was not launched")
    try:
        return victim.wait_healthy()
    except RuntimeError as exc:
        pytest.fail(f"the victim SGLang server did not come up: {exc}", pytrace=False)


def pytest_sessionfinish(session, exitstatus):
    import shutil

    victim = _REAL.pop("victim", None)
    if victim is not None:
        victim.stop()
    engines = _REAL.pop("engines", None)
    if engines is not None:
        engines.stop()
    workdir = _REAL.pop("workdir", None)
    _REAL.clear()
    if workdir is None:
        return
    if session.testsfailed:
        tr = _REPORTER.get("tr")
        if tr is not None:
            tr.write_line(f"real SGLang server and router logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
