"""The suite's real SGLang servers stay up for the whole session: idle, they must leave the CPU alone.

Without ``--sleep-on-idle`` an idle scheduler polls its sockets in a busy loop, a whole core per server;
two of them took both of CI's cores and stop 40's CI timed out. This measures the server's process group
over a few idle seconds."""

import time

import pytest

pytestmark = pytest.mark.slow

IDLE_S = 3.0
BUSY_LOOP_CPU_S = IDLE_S  # what one spinning scheduler takes in that window on a free core
IDLE_LIMIT_CPU_S = 0.25 * IDLE_S  # well above the measured 0.03 per 3 s, well below a spinning core


def test_an_idle_real_server_leaves_the_cpu_alone(real_engines):
    server = real_engines.server
    out = server.submit(list(range(1, 9)), max_new_tokens=4).result(timeout=120)  # a request has come and gone
    assert 1 <= out["meta_info"]["completion_tokens"] <= 4
    time.sleep(1.5)  # the scheduler's idle check passes
    before, t0 = server.process.cpu_seconds(), time.monotonic()
    time.sleep(IDLE_S)
    used, elapsed = server.process.cpu_seconds() - before, time.monotonic() - t0
    assert before > 0, "no CPU time read for the server's process group"
    assert used < IDLE_LIMIT_CPU_S, (
        f"the idle server used {used:.2f} CPU-s in {elapsed:.1f} s (a busy loop takes ~{BUSY_LOOP_CPU_S:.0f})"
    )
