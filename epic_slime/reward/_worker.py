"""Reward worker process: ``python -m epic_slime.reward._worker READ_FD WRITE_FD BACKSTOP_S``.

Runs math-verify on its own main thread and answers requests over two pipes. It exits when
the parent closes its pipe (parent exit, even on SIGKILL), and a per-request SIGALRM
backstop ends it should a request outlive the parent's deadline by far (orphaned worker).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection


def _serve(reader: Connection, writer: Connection, backstop_s: int) -> None:
    from epic_slime.reward.equivalence import verify_equivalent, warm_up

    warm_up()
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
            result = ("ok", verify_equivalent(prediction, reference))
        except Exception as error:  # math-verify failures must not kill the worker
            result = ("error", f"{type(error).__name__}: {error}"[:500])
        finally:
            signal.alarm(0)
        writer.send(result)


def main(argv: list[str]) -> int:
    read_fd, write_fd, backstop_s = int(argv[0]), int(argv[1]), int(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    reader, writer = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        _serve(reader, writer, backstop_s)
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
