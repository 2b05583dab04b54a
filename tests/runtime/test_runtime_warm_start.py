"""The embedded runtime's warm start (epic_slime.runtime.warmstart) as a user meets it: it runs on one
torch thread (or EPIC_SLIME_TORCH_THREADS) and gives the caller's count back, and it says it is trained
once, then cached, with an ETA. Its trainer is stood in: these run in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest


def _tiny_warm_start(tmp_path, monkeypatch, seen: dict):
    """load_or_train_warm_start with a stand-in trainer that records torch's thread count while it runs."""
    import torch

    from epic_slime.runtime import warmstart
    from epic_slime.runtime.model import ModelConfig
    from epic_slime.runtime.task import TaskConfig

    def recording(model_cfg, task_cfg, *, on_step=None, **kw):
        seen["threads"] = torch.get_num_threads()
        for i in range(1, kw["steps"] + 1):
            on_step(i, 1.0)
        return {"w": torch.zeros(1)}

    monkeypatch.setattr(warmstart, "supervised_warm_start", recording)
    return warmstart.load_or_train_warm_start(
        ModelConfig(),
        TaskConfig(),
        steps=20,
        lr=1e-3,
        batch_size=2,
        seed=0,
        cache_dir=tmp_path / "cache",
        progress=True,
    )


def test_the_warm_start_runs_on_one_torch_thread_and_restores_the_callers(tmp_path, monkeypatch, capsys):
    """torch's default (one per core) made the first-run warm start 7.5x slower than 1 thread with 6
    busy processes on 2 cores (bench/warm_start_threads.py): OpenMP barriers spinning."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = {}
        monkeypatch.delenv("EPIC_SLIME_TORCH_THREADS", raising=False)
        _tiny_warm_start(tmp_path, monkeypatch, seen)
        assert seen["threads"] == 1 and torch.get_num_threads() == 2
        monkeypatch.setenv("EPIC_SLIME_TORCH_THREADS", "3")
        _tiny_warm_start(tmp_path / "b", monkeypatch, seen)
        assert seen["threads"] == 3
        monkeypatch.setenv("EPIC_SLIME_TORCH_THREADS", "zero")
        with pytest.raises(ValueError, match="EPIC_SLIME_TORCH_THREADS='zero': must be a positive integer"):
            _tiny_warm_start(tmp_path / "c", monkeypatch, seen)
    finally:
        torch.set_num_threads(before)


def test_the_warm_start_says_it_is_trained_once_and_cached_with_an_eta(tmp_path, monkeypatch, capsys):
    seen = {}
    _, provenance = _tiny_warm_start(tmp_path, monkeypatch, seen)
    out = capsys.readouterr().out
    path = provenance.split(":", 1)[1]
    assert provenance.startswith("trained:") and Path(path).exists()
    assert "training 20 supervised steps, once for this config" in out and f"later runs load it from {path}" in out
    assert "[warm start (trained once, then cached)] step 2/20" in out and "ETA" in out
    _, again = _tiny_warm_start(tmp_path, monkeypatch, seen)
    assert again == f"cache:{path}" and f"warm start: cached at {path}" in capsys.readouterr().out
