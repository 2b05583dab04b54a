"""Reward worker process: ``python -m epic_slime.reward._worker READ_FD WRITE_FD BACKSTOP_S [VERIFIER]``.

Runs math-verify on its own main thread and answers requests over two pipes. It exits when
the parent closes its pipe (parent exit, even on SIGKILL), and a per-request SIGALRM
backstop ends it should a request outlive the parent's deadline by far (orphaned worker).
``VERIFIER`` ("module:function", default math-verify's ``verify_equivalent``) judges each pair; an
exception, or an answer that is not a bool, is an error reply, never a verdict.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection


def _load_verifier(spec: str):
    import importlib

    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)


def _serve(
    reader: Connection,
    writer: Connection,
    backstop_s: int,
    verifier: str = "epic_slime.reward.equivalence:verify_equivalent",
) -> None:
    from epic_slime.reward.equivalence import warm_up

    warm_up()
    verify = _load_verifier(verifier)
    writer.send(("ready", os.getpid()))
    while True:
        try:
            request = reader.recv()
        except (EOFError, OSError):
            return  # parent gone
        kind = request[0]
        if kind == "stop":
            return
        if kind != "verify":
            writer.send(("error", f"unknown request {kind!r}"))
            continue
        _, prediction, reference = request
        signal.alarm(backstop_s)
        try:
            value = verify(prediction, reference)
            result = (
                ("ok", value)
                if isinstance(value, bool)
                else ("error", f"verifier answered {type(value).__name__} {value!r:.100}, not True/False")
            )
        except Exception as error:  # math-verify failures must not kill the worker
            result = ("error", f"{type(error).__name__}: {error}"[:500])
        finally:
            signal.alarm(0)
        writer.send(result)


def main(argv: list[str]) -> int:
    read_fd, write_fd, backstop_s = int(argv[0]), int(argv[1]), int(argv[2])
    verifier = argv[3] if len(argv) > 3 else "epic_slime.reward.equivalence:verify_equivalent"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    reader, writer = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        _serve(reader, writer, backstop_s, verifier)
    except (BrokenPipeError, EOFError):
        return 0
    except Exception:
        try:
            writer.send(("fatal", traceback.format_exc()[-2000:]))
        except OSError:
            pass
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
