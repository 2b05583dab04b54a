"""The opt-in python tool: each escape attempt is refused (issue 44, item 3).

A secret file next to the run, a server on 127.0.0.1 of this machine, the parent's environment,
process creation, ctypes, a way back out of the new root, and the CPU, memory and wall limits."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from epic_slime.tools.sandbox import SandboxLimits, SandboxUnavailable, run_python


def _run(code: str, **limits) -> str:
    try:
        return run_python(code, SandboxLimits(**limits)) if limits else run_python(code)
    except SandboxUnavailable as exc:  # the kernel refuses user namespaces: the tool never runs
        pytest.skip(f"no user/mount/net namespaces on this kernel: {exc}")


def test_plain_code_runs_and_sees_only_its_empty_work_dir():
    out = _run("import os, math, json; print(math.factorial(20), json.dumps(os.listdir('.')), os.getcwd())")
    assert out == "2432902008176640000 [] /work\n"
    assert _run("open('n.txt', 'w').write('7'); print(int(open('n.txt').read()) * 6)") == "42\n"


def test_the_runs_files_are_out_of_reach(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the-secret")
    out = _run(f"print(open({str(secret)!r}).read())")
    assert "the-secret" not in out and "No such file or directory" in out
    here = os.path.abspath(__file__)
    out = _run(f"import os; print(os.path.exists({here!r}), os.path.exists('/work/wt'), sorted(os.listdir('/')))")
    assert out.startswith("False False ") and "'tmp'" not in out and "'etc'" not in out
    # the way back: chroot and mount need capabilities, which uid 1000 of the namespace lost at exec
    for attempt in ("import os; os.chroot('/usr')", "import os; os.mkdir('d'); os.chroot('d')"):
        assert "Operation not permitted" in _run(attempt)


def test_no_network_even_to_this_machines_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    try:
        out = _run(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')")
        assert "connected" not in out and ("unreachable" in out or "refused" in out), out
        assert not accepted
    finally:
        server.close()


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("EPIC_TEST_TOKEN", "do-not-leak")
    assert _run("import os; print('EPIC_TEST_TOKEN' in os.environ, 'PATH' in os.environ)") == "False False\n"


@pytest.mark.parametrize(
    "code, refused",
    [
        ("import os; os.system('id')", "os.system is not allowed"),
        ("import subprocess; subprocess.run(['id'])", "subprocess.Popen is not allowed"),
        ("import os; os.fork()", "os.fork is not allowed"),
        ("import os; os.execv('/bin/sh', ['sh'])", "os.exec is not allowed"),
        ("import ctypes; ctypes.CDLL(None)", "ctypes.dlopen is not allowed"),
        ("import sys; f = sys.audit; (lambda: 0).__code__ = (lambda: 1).__code__", "replacing a function's code"),
    ],
)
def test_process_creation_and_ctypes_are_refused(code, refused):
    assert refused in _run(code)


def test_limits_stop_runaway_code():
    start = time.perf_counter()
    assert _run("while True: pass", wall_seconds=20, cpu_seconds=1) == "error: stopped by the CPU limit (1 s)"
    assert _run("import time; time.sleep(60)", wall_seconds=1) == "error: timed out after 1 s"
    assert "MemoryError" in _run("x = bytearray(2 * 1024**3)")
    assert "File too large" in _run("open('big', 'wb').write(b'0' * (4 * 1024**2))")
    long = _run("print('x' * 100000)")
    assert long.endswith("[output truncated]") and len(long) < 2100
    assert time.perf_counter() - start < 15
