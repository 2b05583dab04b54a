"""The opt-in ``python`` tool: model-written code in a child process with limits.

What the child gets (tests/tools/test_python_sandbox.py tries an escape through each layer):
  - new user, mount and network namespaces: no network (its own loopback, down); its root is a fresh
    tmpfs holding only the interpreter's install and the system libraries (read-only binds) and an
    empty, writable ``/work`` (its working directory), reached by ``pivot_root`` with the old root
    unmounted, so no path leads to the run's files; it runs as uid 1000 of its namespace, which
    drops every capability at exec (it cannot mount, chroot or pivot back);
  - a fresh interpreter (``-I -S``), an empty environment;
  - resource limits: CPU seconds, address space, file size, open files; a wall-clock timeout after
    which its whole session is killed; output read up to a cap;
  - an audit hook (PEP 578; the hook's rules are constants in its code, which cannot be replaced
    without an audited ``__code__`` write that it refuses) that refuses starting processes and ctypes.
    Fork bombs are bounded by the audit hook and the timeout only: RLIMIT_NPROC does not bind a
    process whose real user is root outside the namespace.
Where the kernel refuses the namespaces, the tool refuses to run (``SandboxUnavailable``); it never
runs without them. Not a boundary against kernel or CPython exploits: no seccomp filter, no cgroup.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
INSIDE_UID = 1000  # not 0: exec drops every capability in the namespace
SETUP_FAILED = 97  # the child's exit status when the isolation could not be set up


class SandboxUnavailable(RuntimeError):
    """The kernel refused the isolation the tool needs (the tool then never runs)."""


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 5.0
    cpu_seconds: int = 2
    memory_bytes: int = 512 * 1024 * 1024
    file_bytes: int = 1024 * 1024
    open_files: int = 64
    output_chars: int = 2000


# Runs in the child before the model's code (``sys.argv[1]``). Every rule is a constant of the hook's
# code; a refusal raises, which the code may catch, but the operation never happens.
_PRELUDE = r"""
import sys
def _hook(event, args):
    if event.startswith(("os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
                         "subprocess.Popen", "ctypes.", "pty.spawn", "os.startfile")):
        raise PermissionError("sandbox: " + event + " is not allowed")
    if event == "object.__setattr__" and args[1] in ("__code__", "__defaults__", "__kwdefaults__"):
        raise PermissionError("sandbox: replacing a function's code is not allowed")
sys.addaudithook(_hook)
del _hook
_code = sys.argv[1]
del sys.argv[1:]
exec(compile(_code, "<tool>", "exec"), {"__name__": "__main__"})
"""


def _read_only_dirs() -> list[str]:
    """What the interpreter needs: its install and the system libraries (merged /usr: /lib links)."""
    base = os.path.realpath(sys.base_prefix)
    return [d for d in dict.fromkeys([base, "/usr/lib", "/usr/lib64"]) if os.path.isdir(d)]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        os.write(2, f"sandbox: {what} failed: {os.strerror(err)}\n".encode())
        os._exit(SETUP_FAILED)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _isolate(jail: str, limits: SandboxLimits, outer_uid: int, outer_gid: int):
    """preexec_fn: new session (killable as a group), namespaces, the new root, then the limits."""
    read_only = _read_only_dirs()
    pivot = SYS_PIVOT_ROOT.get(platform.machine())

    def run_in_child():
        os.setsid()
        libc = ctypes.CDLL(None, use_errno=True)
        _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET), "unshare(user, mount, net)")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{INSIDE_UID} {outer_uid} 1")
        _write("/proc/self/gid_map", f"{INSIDE_UID} {outer_gid} 1")
        mount = libc.mount
        _check(mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
        _check(mount(b"tmpfs", jail.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64m,mode=755"), "tmpfs")
        for source in read_only:
            target = (jail + source).encode()
            os.makedirs(target, exist_ok=True)
            _check(mount(source.encode(), target, None, MS_BIND | MS_REC, None), f"binding {source}")
            _check(mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID, None), f"{source} ro")
        for link, to in (("lib", "usr/lib"), ("lib64", "usr/lib64")):
            os.symlink(to, os.path.join(jail, link))
        os.mkdir(os.path.join(jail, "work"), 0o777)
        os.mkdir(os.path.join(jail, ".old"))
        if pivot is None:
            os.write(2, f"sandbox: no pivot_root number for {platform.machine()}\n".encode())
            os._exit(SETUP_FAILED)
        _check(libc.syscall(pivot, jail.encode(), (jail + "/.old").encode()), "pivot_root")
        os.chdir("/")
        _check(libc.umount2(b"/.old", MNT_DETACH), "unmounting the old root")
        os.rmdir("/.old")
        os.chdir("/work")
        for name, value in (
            (resource.RLIMIT_CPU, limits.cpu_seconds),
            (resource.RLIMIT_AS, limits.memory_bytes),
            (resource.RLIMIT_FSIZE, limits.file_bytes),
            (resource.RLIMIT_NOFILE, limits.open_files),
            (resource.RLIMIT_CORE, 0),
        ):
            resource.setrlimit(name, (value, value))

    return run_in_child


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> str:
    """Run ``code``; return its output (stdout and stderr, capped), or a one-line reason it was stopped.

    Raises SandboxUnavailable when the kernel refuses the isolation."""
    if not isinstance(code, str):
        raise TypeError(f"code must be text, got {type(code).__name__}")
    interpreter = os.path.realpath(sys.executable)  # the install itself: the venv is not in the new root
    with tempfile.TemporaryDirectory(prefix="epic-tool-") as jail:
        proc = subprocess.Popen(
            [interpreter, "-I", "-S", "-c", _PRELUDE, code],
            cwd=jail,
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_isolate(jail, limits, os.getuid(), os.getgid()),
            close_fds=True,
        )
        try:
            out, _ = proc.communicate(timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return f"error: timed out after {limits.wall_seconds:g} s"
    text = out.decode("utf-8", errors="replace")
    if proc.returncode == SETUP_FAILED and text.startswith("sandbox: "):
        raise SandboxUnavailable(text.strip())
    if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return f"error: stopped by the CPU limit ({limits.cpu_seconds} s)"
    if len(text) > limits.output_chars:
        text = text[: limits.output_chars] + "\n[output truncated]"
    return text if proc.returncode == 0 else f"{text}\nerror: exit status {proc.returncode}".strip()
