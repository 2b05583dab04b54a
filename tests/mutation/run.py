"""A curated mutation check: does the suite fail when one line is made wrong in a realistic way?

Run it before you stop (it is not part of CI)::

    . /work/venv/bin/activate
    python tests/mutation/run.py              # every mutant in tests/mutation/mutants.yaml
    python tests/mutation/run.py --only kl_sign,eval_index   # a few, by id
    python tests/mutation/run.py --list       # the list, nothing run

Each entry of ``mutants.yaml`` names a source ``file``, an ``original`` text (a unique substring of
one line, or exactly one occurrence picked with ``occurrence: N``), its ``replacement``, the
``tests`` (files) that cover it and ``user_meets``: what a user would meet if the change shipped.
The runner copies the working tree (tracked and untracked-not-ignored files, as they are now, so
uncommitted edits are included) into a temporary folder once per job, applies one mutant at a time
there, runs ``python -m pytest -x -q -p no:cacheprovider <tests>`` and restores the file. The
checkout itself is never written to.

Results per mutant: ``killed`` (a test failed, or a collection error / timeout), ``survived`` (all
covering tests passed: write the missing test, or mark the entry ``equivalent: <why>``), ``not
applicable`` (the original text is not in the file, or not once: the list is stale, fix the entry)
and ``error`` (pytest could not run the tests, e.g. a test file was renamed). A mutant's test run has a
time limit (``--timeout``, 180 s; its process group is killed, Ray and servers included) and each test
its own (pytest-timeout, from pyproject.toml and tests/conftest.py): a hang is a kill, named. The kill rate is
killed / (killed + survived); equivalent mutants are run and reported but not counted. Before the
mutants, the covering test files are run once unmutated: a file failing there would make every
mutant look killed, so the run stops (``--no-baseline`` skips that check).

The real engine: paths that only the real SGLang server or router reaches are covered by the
real-engine files (``REAL_ENGINE_TESTS``: each file and the source it covers). When the real SGLang venv
is on this machine (``EPIC_SLIME_SGLANG_PYTHON`` or ``.ci/sglang_venv.sh``'s cached venv, found as
tests/support/real_sglang.py finds it), a mutant of a file they cover that survives its own tests is run
again against them, one such run at a time, with ``EPIC_SLIME_REQUIRE_REAL_SGLANG=1`` (a server that does
not start fails, never skips) and its own limit (``--real-timeout``): "killed (real engine)"; a run whose
servers did not start is an "error", never a kill, and a real-engine kill counts only when the same run
passes right after with the mutant taken out (a slow start on a loaded machine is no kill). Without the
venv the runner says so once and those files are not run (``--real-engine off`` does the same).

Why not ``mutmut``: it generates its own operator mutants over whole modules and has no way to run a
fixed, reviewed list of specific one-line changes, which is what this check is.

Budget: the list runs in a few minutes on 2 cores (``--jobs 2``, the default; ``--jobs 1`` when the
machine is shared and busy). Exit status: 0 when no counted mutant survived and none is stale, else 1.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
REQUIRED = ("id", "file", "original", "replacement", "tests", "user_meets")

# The real-engine files (they need the real SGLang venv) and the source each one reaches: a file, or a
# folder ending in "/". tests/project/test_mutation_list.py checks every real-engine file is listed here.
REAL_ENGINE_TESTS: dict[str, tuple[str, ...]] = {
    "tests/slime_adapter/test_engine_faults_real.py": (
        "epic_slime/slime/stream/engine_faults.py",
        "epic_slime/slime/stream/group_stream.py",
        "epic_slime/slime/data_source.py",
        "epic_slime/slime/rollout.py",
    ),
    "tests/slime_adapter/test_real_router_driver_faults.py": (
        "epic_slime/slime/stream/engine_faults.py",
        "epic_slime/slime/stream/group_stream.py",
        "epic_slime/slime/data_source.py",
        "epic_slime/slime/rollout.py",
        "epic_slime/slime/stream/push_recovery.py",
        "epic_slime/slime/stream/checkpoint_marks.py",
    ),
    "tests/slime_adapter/test_real_sglang_pushes.py": (
        "epic_slime/slime/push_mode.py",
        "epic_slime/runtime/hf_export.py",
    ),
    # Megatron's converted tensors pushed into the real server under each push mode
    "tests/slime_adapter/test_megatron_push.py": (
        "epic_slime/slime/push_mode.py",
        "epic_slime/slime/stream/served_weights.py",
    ),
    "tests/slime_adapter/test_real_sglang_retract.py": (
        "epic_slime/slime/stream/group_stream.py",
        "epic_slime/slime/push_mode.py",
    ),
    "tests/slime_adapter/test_real_sglang.py": ("epic_slime/runtime/hf_export.py", "epic_slime/runtime/task.py"),
    "tests/slime_adapter/test_sglang_conformance.py": ("epic_slime/runtime/task.py",),
    "tests/slime_adapter/test_sglang_conformance_weights.py": ("epic_slime/runtime/hf_export.py",),
    # a whole slime session (rollout, stream, push, loss) against the real server and router
    "tests/slime_adapter/test_slime_e2e_real.py": ("epic_slime/slime/", "epic_slime/losses/"),
    # slime's Megatron actor under Ray: the driver, the stream and the loss against the real server
    "tests/slime_adapter/test_megatron_ray_actor.py": (
        "epic_slime/slime/train.py",
        "epic_slime/slime/rollout.py",
        "epic_slime/slime/stream/group_stream.py",
        "epic_slime/slime/loss.py",
    ),
    "tests/evaluation/test_evaluate_real_sglang.py": ("epic_slime/evaluation/",),
    # the project's multi-turn generate function and its tools under the stream, on the real server and router
    "tests/slime_adapter/test_slime_e2e_agent.py": ("epic_slime/slime/agent_generate.py", "epic_slime/tools/"),
    # these check the stand-ins and the server's own behaviour: no project source of theirs to mutate
    "tests/slime_adapter/test_router_conformance.py": (),
    "tests/slime_adapter/test_real_sglang_idle.py": (),
}


def real_engine_tests(source: str, own: list[str]) -> list[str]:
    """The real-engine files that reach ``source``, less those the mutant already names."""
    return [
        test
        for test, covered in REAL_ENGINE_TESTS.items()
        if test not in own and any(source == c or (c.endswith("/") and source.startswith(c)) for c in covered)
    ]


def sglang_python() -> str | None:
    """The real SGLang venv's python, found as the tests find it (tests/support/real_sglang.py)."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from support import real_sglang
    finally:
        sys.path.remove(str(REPO / "tests"))
    return real_sglang.sglang_python()


def load_mutants(path: Path) -> list[dict]:
    entries = yaml.safe_load(path.read_text())
    if not isinstance(entries, list):
        raise SystemExit(f"{path}: expected a list of mutants")
    seen = set()
    for i, m in enumerate(entries):
        missing = [k for k in REQUIRED if k not in m]
        if missing:
            raise SystemExit(f"{path}: entry {i} ({m.get('id', '?')}) lacks {', '.join(missing)}")
        if m["id"] in seen:
            raise SystemExit(f"{path}: id {m['id']!r} twice")
        seen.add(m["id"])
        if m["original"] == m["replacement"]:
            raise SystemExit(f"{path}: {m['id']}: replacement equals original")
        if isinstance(m["tests"], str):
            m["tests"] = [m["tests"]]
    return entries


def mutate(text: str, m: dict) -> tuple[str | None, str]:
    """The mutated text, or None and why the entry does not apply to ``text``."""
    original = m["original"]
    if "\n" in original.strip("\n"):
        return None, "original spans several lines (one-line mutants only)"
    count = text.count(original)
    occurrence = m.get("occurrence")
    if count == 0:
        return None, "original text not found"
    if occurrence is None and count > 1:
        return None, f"original text found {count} times (give occurrence: N)"
    n = occurrence or 1
    if not 1 <= n <= count:
        return None, f"occurrence {n} asked, text found {count} times"
    start = -1
    for _ in range(n):
        start = text.index(original, start + 1)
    return text[:start] + m["replacement"] + text[start + len(original) :], ""


def copy_tree(dest: Path) -> Path:
    """The working tree's tracked + untracked-not-ignored files, as they are now, under dest/repo."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.decode()
    root = dest / "repo"
    for rel in filter(None, out.split("\0")):
        src = REPO / rel
        if not src.is_file():  # deleted in the working tree, or a submodule
            continue
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    shared = REPO.parent / "shared"  # tests look for ../shared (data, vendored slime); keep the layout
    if shared.exists():
        (dest / "shared").symlink_to(shared)
    return root


def run_tests(
    root: Path, tests: list[str], timeout: float, extra_env: dict | None = None, unavailable: str | None = None
) -> tuple[int, float, str]:
    """pytest's exit status, seconds and last line; status 3 and the line naming ``unavailable`` when the
    output holds it (the real engine did not start: neither a kill nor a survival)."""
    env = dict(os.environ) | (extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no stale .pyc: a same-size edit within a second would be missed
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *tests]
    start = time.monotonic()
    # its own process group, so that a timeout ends pytest and everything it started (Ray, servers):
    # subprocess.run's timeout kills pytest only, and its children would run on beside the next mutants
    p = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = p.communicate(timeout=timeout)
        rc, tail = p.returncode, out.strip().splitlines()
    except subprocess.TimeoutExpired:
        _kill_group(p)
        rc, tail = -1, [f"timed out after {timeout:.0f}s (the mutant's whole test run)"]
    finally:
        _kill_group(p)  # whatever the tests left running
    missing = [line for line in tail if unavailable and unavailable in line]
    if missing:
        rc, tail = 3, missing[:1]
    return rc, time.monotonic() - start, tail[-1] if tail else ""


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # a child that left the group still holds the pipe: stop reading
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()
        p.wait()


def check_imports_from(root: Path) -> None:
    """The copy's package must be the one imported (not an installed or editable checkout)."""
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    got = subprocess.run(
        [sys.executable, "-c", "import epic_slime; print(epic_slime.__file__)"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(got).resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"the temporary copy imports epic_slime from {got}, not from {root}: mutants would not apply")


class RealEngine:
    """Where the real-engine files run: the venv's python (None: not run), one run at a time (each
    starts its own servers), and their limit."""

    def __init__(self, python: str | None, timeout: float):
        self.python, self.timeout = python, timeout
        self.lock = threading.Lock()
        self.env = {"EPIC_SLIME_SGLANG_PYTHON": python or "", "EPIC_SLIME_REQUIRE_REAL_SGLANG": "1"}
        # alone, a real-engine file's first test waits for the whole server start, which the full suite
        # overlaps with the tests before it: its limit is scaled (tests/conftest.py) unless one is set
        self.env["EPIC_SLIME_TEST_TIMEOUT_SCALE"] = os.environ.get("EPIC_SLIME_TEST_TIMEOUT_SCALE") or "4"

    # how a real-engine fixture reports a server that did not start, or no venv (tests/conftest.py): such a
    # run is an error, not a kill (a loaded machine's slow start would otherwise count as a killed mutant)
    UNAVAILABLE = "EPIC_SLIME_REQUIRE_REAL_SGLANG=1 and "

    def run(self, root: Path, tests: list[str], scale: float = 1.0) -> tuple[int, float, str]:
        with self.lock:
            return run_tests(root, tests, self.timeout * scale, self.env, unavailable=self.UNAVAILABLE)


def check_one(root: Path, m: dict, timeout: float, real: RealEngine | None = None) -> dict:
    path = root / m["file"]
    if not path.is_file():
        return {"result": "not applicable", "why": f"{m['file']} does not exist", "seconds": 0.0}
    text = path.read_text()
    mutated, why = mutate(text, m)
    if mutated is None:
        return {"result": "not applicable", "why": why, "seconds": 0.0}
    missing = [t for t in m["tests"] if not (root / t.split("::")[0]).exists()]
    if missing:
        return {"result": "error", "why": f"test file(s) missing: {', '.join(missing)}", "seconds": 0.0}
    try:
        path.write_text(mutated)
        rc, seconds, last = run_tests(root, m["tests"], timeout)
        extra = real_engine_tests(m["file"], m["tests"]) if real is not None and real.python else []
        if rc == 0 and extra:  # survived its own tests: the real engine's turn
            rc, more, last = real.run(root, extra)
            seconds += more
            last = f"(real engine) {last}"
            if rc not in (0, 3):  # a kill only if the same run passes without the mutant (not a slow start)
                path.write_text(text)
                control, more, control_last = real.run(root, extra)
                seconds += more
                if control != 0:
                    rc, last = 3, f"(real engine) fails without the mutant too: {control_last}"
    finally:
        path.write_text(text)
    if rc == 0:
        result = "survived"
    elif rc in (1, 2):  # a failing test, or an import / collection error the mutant caused
        result = "killed"
    elif rc == -1:
        result = "killed"  # a hang is a failure a user meets too
    else:
        result = "error"
    return {"result": result, "why": last, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mutants", type=Path, default=HERE / "mutants.yaml")
    parser.add_argument("--only", default=None, help="comma-separated ids")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per mutant's test run")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the covering tests")
    parser.add_argument("--list", action="store_true", help="print the list and exit")
    parser.add_argument("--real-engine", choices=("auto", "off"), default="auto", help="run REAL_ENGINE_TESTS")
    parser.add_argument("--real-timeout", type=float, default=1800.0, help="seconds per real-engine run")
    args = parser.parse_args(argv)

    mutants = load_mutants(args.mutants)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {m["id"] for m in mutants}
        if unknown:
            raise SystemExit(f"unknown id(s): {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m["id"] in wanted]
    if args.list:
        for m in mutants:
            print(f"{m['id']:32s} {m['file']}: {m['original'].strip()!r} -> {m['replacement'].strip()!r}")
            print(f"{'':32s} user meets: {m['user_meets']}")
        return 0

    real = RealEngine(sglang_python() if args.real_engine == "auto" else None, args.real_timeout)
    reached = sorted({t for m in mutants for t in real_engine_tests(m["file"], m["tests"])})
    if reached and real.python:
        print(f"real engine: {real.python}; a survivor is run again against {len(reached)} real-engine file(s)")
    elif reached:
        why = "--real-engine off" if args.real_engine == "off" else "the real SGLang venv is not on this machine"
        print(f"real engine: not run ({why}); {len(reached)} real-engine file(s) would cover these mutants")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="epic-mutation-") as tmp:
        roots = [copy_tree(Path(tmp) / f"job{j}") for j in range(max(1, args.jobs))]
        for root in roots:
            check_imports_from(root)
        if not args.no_baseline:
            tests = sorted({t for m in mutants for t in m["tests"]})
            rc, seconds, last = run_tests(roots[0], tests, args.timeout * 3)
            print(f"baseline (unmutated, {len(tests)} test files): rc={rc} in {seconds:.0f}s: {last}", flush=True)
            if rc == 0 and reached and real.python:
                rc, seconds, last = real.run(roots[0], reached, scale=3)  # every real-engine file at once
                print(f"baseline (unmutated, {len(reached)} real-engine files): rc={rc} in {seconds:.0f}s: {last}")
            if rc != 0:
                print("the covering tests fail without any mutant: fix that first (or --no-baseline)")
                return 1
        results: dict[str, dict] = {}
        free = list(roots)
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(roots)) as pool:
            pending = {}
            queue = list(mutants)
            while queue or pending:
                while queue and free:
                    m, root = queue.pop(0), free.pop()
                    pending[pool.submit(check_one, root, m, args.timeout, real)] = (m, root)
                done, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for fut in done:
                    m, root = pending.pop(fut)
                    free.append(root)
                    r = results[m["id"]] = fut.result()
                    note = " (equivalent)" if m.get("equivalent") else ""
                    print(f"{r['result']:15s}{note} {m['id']:32s} {r['seconds']:5.1f}s  {r['why'][:90]}", flush=True)

    counted = [m for m in mutants if not m.get("equivalent")]
    killed = [m["id"] for m in counted if results[m["id"]]["result"] == "killed"]
    survived = [m["id"] for m in counted if results[m["id"]]["result"] == "survived"]
    stale = [m["id"] for m in mutants if results[m["id"]]["result"] == "not applicable"]
    errors = [m["id"] for m in mutants if results[m["id"]]["result"] == "error"]
    equivalent = [m["id"] for m in mutants if m.get("equivalent")]
    total = len(killed) + len(survived)
    print()
    print(
        f"kill rate: {len(killed)} of {total} ({100 * len(killed) / max(total, 1):.0f}%) in "
        f"{time.monotonic() - started:.0f}s; equivalent (not counted): {len(equivalent)}"
    )
    for name, ids in (("survived", survived), ("not applicable (stale list)", stale), ("error", errors)):
        if ids:
            print(f"{name}: {', '.join(ids)}")
    for m in mutants:
        if m["id"] in survived:
            print(f"  {m['id']}: a user would meet: {m['user_meets']}")
    return 0 if not survived and not stale and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
