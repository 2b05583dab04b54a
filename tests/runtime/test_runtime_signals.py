"""Ctrl-C and SIGTERM in the embedded runtime (epic_slime.runtime.signals): mid-run the first signal asks
for a checkpoint and a second exits at once; before any step one stops at once (a real `epic-slime train`
in its warm start included); installing twice restores the caller's handlers."""

from __future__ import annotations

import pytest


def test_first_signal_asks_for_a_checkpoint_and_a_second_exits_at_once(capsys):
    import os
    import signal

    from epic_slime.runtime.signals import StopRequest

    stop = StopRequest()
    before = signal.getsignal(signal.SIGTERM)
    stop.install()
    stop.begin_steps()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal_name == "SIGTERM"
        assert "finishing the step in flight" in capsys.readouterr().out
        with pytest.raises(KeyboardInterrupt, match="second SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_during_start_up_stops_at_once_without_promising_a_step(capsys):
    """Before the driver's loop there is no step in flight: the first Ctrl-C stops (it used to print
    "finishing the step in flight" and let the warm start and Ray's start run on)."""
    import os
    import signal

    from epic_slime.runtime.signals import StopRequest

    stop = StopRequest()
    stop.install()
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGINT during start-up"):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.restore()
    out = capsys.readouterr().out
    assert "during start-up, before any step: stopping now" in out and "step in flight" not in out


def test_installing_twice_restores_the_handlers_from_before_the_first(capsys):
    """The driver installs again after ray.init: restore must put back the caller's handler, not the
    first install's own (which stayed installed after the run)."""
    import signal

    from epic_slime.runtime.signals import StopRequest

    before = signal.getsignal(signal.SIGINT)
    stop = StopRequest()
    stop.install()
    stop.install()
    stop.restore()
    assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_during_the_warm_start_exits_in_seconds(tmp_path):
    """A real `epic-slime train` (its warm start, no Ray yet) sent SIGINT while it trains: exit 130
    at once, no "finishing the step in flight", no run files left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from support.runtime_helpers import TINY_FLAGS

    flags = [f for f in TINY_FLAGS if f != "--no-progress"]
    argv = [
        sys.executable,
        "-m",
        "epic_slime.cli",
        "train",
        *flags,
        "--warm-start-steps",
        "100000",
        "--output-dir",
        str(tmp_path / "run"),
        "--warm-start-cache-dir",
        str(tmp_path / "cache"),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "warm start: training" in line:  # the next thing it does is train
                break
        time.sleep(1.0)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(seen) + rest
    assert proc.returncode == 130, text
    assert "during start-up, before any step: stopping now" in text and "step in flight" not in text, text
    assert "nothing to resume" in text and took < 20, (took, text)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
