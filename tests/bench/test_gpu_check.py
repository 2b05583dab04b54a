"""bench/gpu_check.py: the --cpu run passes as one command, and each of its checks can fail."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.loss_reference import loss_and_grad, roots
from epic_slime.losses import LOSS_MODES

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "bench" / "gpu_check.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gc = _load_script()
# The sections' modules, importable once the script has put bench/ on the path.
from gpu_check_sections import common, correctness, graph, host_sync, kl_bounds, slime_loss, speed  # noqa: E402


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """The one command, as CI and a person run it (about 20 s on 2 cores)."""
    out = tmp_path_factory.mktemp("gpu_check") / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu", "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return proc, json.loads(out.read_text()) if out.is_file() else None


def test_cpu_run_passes_and_writes_every_figure(cpu_run):
    proc, figures = cpu_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert figures["device"] == "cpu"
    assert set(figures["sections"]) == set(gc.SECTIONS)
    assert "all checks passed or skipped" in proc.stdout


def test_cpu_run_checks_every_mode_in_both_dtypes(cpu_run):
    _, figures = cpu_run
    section = figures["sections"]["correctness"]
    assert section["status"] == "pass"
    got = {(r["mode"], r["dtype"]) for r in section["modes"]}
    assert got == {(m, d) for m in LOSS_MODES for d in ("float32", "bfloat16")}
    for r in section["modes"]:
        assert r["ok"] and r["finite"], r
        assert r["loss_rel_err"] <= correctness.LOSS_RTOL
    # the fixture clips somewhere, or agreement on clip decisions would say nothing
    assert max(r["clipfrac"] for r in section["modes"]) > 0.01
    assert section["grpo_vs_plain_ppo"]["ok"]


def test_cpu_run_bounds_sync_speed_and_slime(cpu_run):
    _, figures = cpu_run
    sections = figures["sections"]
    for row in sections["bounds"]["rows"]:
        assert row["ok"] and row["special_ok"], row
    sync = sections["sync"]
    assert {r["mode"] for r in sync["modes"]} == set(LOSS_MODES)
    assert "skipped" in sync["cuda_parts"]  # CUDA parts skip with a reason
    timing = sections["speed"]
    rows = {r["mode"]: r for r in timing["modes"]}
    assert set(rows) == {*speed.SPEED_MODES, common.PLAIN}
    assert rows["grpo"]["x_grpo"] == 1.0 and rows[common.PLAIN]["x_plain"] == 1.0
    assert all(r["ms"] > 0 and r["ms_no_metrics"] > 0 for r in rows.values())
    compiled = timing["compiled"]
    assert compiled and all(c["compiled"] and c["bitwise"] for c in compiled), compiled
    assert sections["graph"]["status"] == "skip" and "CUDA" in sections["graph"]["reason"]
    slime = sections["slime"]
    assert slime["status"] in ("pass", "skip")
    if slime["status"] == "skip":
        assert slime["reason"]
    else:
        assert {r["mode"] for r in slime["modes"]} == set(slime_loss.SLIME_CASES)


# ----------------------------------------------------------------------------------------------
# Each check can fail
# ----------------------------------------------------------------------------------------------


def test_correctness_check_flags_a_wrong_device_result():
    dev, ref = common.device_inputs(4, 64, torch.float32, "cpu", seed=1, with_topk=False)
    assert correctness.check_mode("epic", dev, ref, torch.float32)["ok"]
    lp, blp, adv, mask = dev["inputs"]
    wrong = dict(dev, inputs=(lp - 1e-3, blp, adv, mask))  # what a device kernel off by 1e-3 would give
    row = correctness.check_mode("epic", wrong, ref, torch.float32)
    assert not row["ok"] and row["loss_rel_err"] > correctness.LOSS_RTOL


def test_plain_ppo_clip_matches_the_independent_reference():
    """The 6-line baseline is PPO clip (eps 0.2), seq-mean-token-mean: the float64 reference's grpo."""
    dev, _ = common.device_inputs(3, 20, torch.float64, "cpu", seed=2, with_topk=False)
    lp, blp, adv, mask = dev["inputs"]
    loss, grad = common.forward_backward(common.PLAIN, dev["inputs"], {})
    adv_bt = adv[:, None].expand_as(lp)
    ref_loss, ref_grad = loss_and_grad(
        "grpo",
        lp.tolist(),
        blp.tolist(),
        adv_bt.tolist(),
        mask.tolist(),
        dict(LOSS_MODES["grpo"].defaults),
        "seq-mean-token-mean",
    )
    assert float(loss.detach()) == pytest.approx(ref_loss, rel=1e-12)
    torch.testing.assert_close(grad, torch.tensor(ref_grad, dtype=torch.float64), rtol=1e-10, atol=1e-14)


def test_bounds_reference_solver_matches_mpmath_and_the_check_can_fail(monkeypatch):
    log_c = torch.tensor([-20.0, -3.0, 0.0, 5.0, 60.0], dtype=torch.float64)
    lower, upper = kl_bounds.solver_roots(log_c)
    for x, lo, hi in zip(log_c.tolist(), lower.tolist(), upper.tolist()):
        want_lo, want_hi = roots(math.exp(x))
        assert lo == pytest.approx(want_lo, rel=1e-13) and hi == pytest.approx(want_hi, rel=1e-13)
    sizes = common.CPU_SIZES
    assert kl_bounds.section_bounds("cpu", sizes)["status"] == "pass"
    real = kl_bounds.exact_kl_log_bounds
    monkeypatch.setattr(kl_bounds, "exact_kl_log_bounds", lambda x: tuple(r * (1 + 1e-6) for r in real(x)))
    assert kl_bounds.section_bounds("cpu", sizes)["status"] == "fail"


def test_sync_detector_sees_reads_data_dependent_ops_and_host_built_device_tensors():
    x = torch.randn(8)
    detector = host_sync.SyncDetector()
    with detector.watching_tensor_constructors(), detector:
        (x * 2).sum()
        torch.full((), 1.5, device="meta")  # a fill kernel: no copy
    assert detector.sites == []
    for act in (
        lambda: x.sum().item(),
        lambda: bool(x.max() > 0),
        lambda: torch.nonzero(x > 0),
        lambda: torch.tensor(1.5, device="meta"),
        lambda: x.to("meta"),
    ):
        detector = host_sync.SyncDetector()
        with detector.watching_tensor_constructors(), detector:
            act()
        assert len(detector.sites) >= 1, act


def test_sync_section_fails_on_a_sync_only_when_required(monkeypatch):
    monkeypatch.setattr(host_sync, "LOSS_MODES", {"epic": LOSS_MODES["epic"]})
    monkeypatch.setattr(
        host_sync, "detect_syncs", lambda *a, on_meta, **k: ["aten.nonzero at x.py:1"] if on_meta else []
    )
    assert host_sync.section_sync("cpu", common.CPU_SIZES, require_sync_free=False)["status"] == "pass"
    failed = host_sync.section_sync("cpu", common.CPU_SIZES, require_sync_free=True)
    assert failed["status"] == "fail" and failed["not_sync_free"] == ["epic"]


@pytest.mark.parametrize("compute_metrics", [False, True])
def test_every_mode_is_free_of_host_syncs_on_accelerators(compute_metrics):
    dev, _ = common.device_inputs(2, 32, torch.float32, "cpu", seed=5)
    found = {
        mode: host_sync.detect_syncs(mode, dev["inputs"], dev["topk"], on_meta=True, compute_metrics=compute_metrics)
        for mode in sorted(LOSS_MODES)
    }
    if compute_metrics:  # and on the CPU with the accelerator branches forced (ops without meta kernels)
        found.update(
            {
                f"{mode} (cpu)": host_sync.detect_syncs(
                    mode, dev["inputs"], dev["topk"], on_meta=False, compute_metrics=True
                )
                for mode in sorted(LOSS_MODES)
            }
        )
    assert {m: s for m, s in found.items() if s} == {}


def test_sync_section_counts_a_metrics_only_sync(monkeypatch):
    """A sync that only the metrics path makes (the old bincount / p95 count) fails --require-sync-free."""
    monkeypatch.setattr(host_sync, "LOSS_MODES", {"grpo": LOSS_MODES["grpo"]})
    real = host_sync.detect_syncs
    monkeypatch.setattr(
        host_sync,
        "detect_syncs",
        lambda *a, compute_metrics, **k: (
            ["aten.bincount at metrics.py:1"] if compute_metrics else real(*a, compute_metrics=compute_metrics, **k)
        ),
    )
    failed = host_sync.section_sync("cpu", common.CPU_SIZES, require_sync_free=True)
    assert failed["status"] == "fail" and failed["not_sync_free"] == ["grpo"]
    assert failed["modes"][0]["meta_metrics_sites"] == ["aten.bincount at metrics.py:1"]


def test_a_broken_section_is_a_failure_with_its_error_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    def broken(*args):
        raise RuntimeError("device fell over")

    monkeypatch.setattr(gc, "section_bounds", broken)
    out = tmp_path / "f.json"
    rc = gc.main(["--cpu", "--sections", "bounds", "correctness", "--out", str(out)])
    figures = json.loads(out.read_text())
    assert rc == 1
    assert figures["sections"]["bounds"]["status"] == "fail"
    assert "device fell over" in figures["sections"]["bounds"]["error"]
    assert figures["sections"]["correctness"]["status"] == "pass"
    assert "FAILED: bounds" in capsys.readouterr().out


def test_missing_module_without_wheels_names_module_and_folder(tmp_path):
    with pytest.raises(ImportError, match=r"no_such_module_gpu13.*" + str(tmp_path)):
        slime_loss.import_with_local_wheels("no_such_module_gpu13", tmp_path)
    assert slime_loss.import_with_local_wheels("json", tmp_path) == "installed"


def test_slime_is_found_beside_the_script_or_the_repository(tmp_path, monkeypatch):
    monkeypatch.delenv("SLIME_PATH", raising=False)
    fake = tmp_path / "slime-src"
    (fake / "slime" / "backends" / "megatron_utils").mkdir(parents=True)
    (fake / "slime" / "backends" / "megatron_utils" / "loss.py").write_text("")
    assert slime_loss.find_slime(str(fake)) == fake
    assert slime_loss.find_slime(str(tmp_path / "nothing")) in (
        None,
        common.BENCH_DIR / "slime-624b824a",
        common.REPO_ROOT.parent / "shared" / "vendor" / "slime-624b824a",
    )


def test_graph_section_orders_flagged_modes_last_and_stops_when_cuda_breaks(monkeypatch):
    """The CUDA-graph bookkeeping, with a stand-in for capture: clean modes (and the control) run
    first; after a failed capture that leaves CUDA unusable the rest are recorded as not run.
    The core is sync-free now, so the detector is told which modes to flag."""
    monkeypatch.setattr(
        graph, "detect_syncs", lambda mode, *a, **k: ["stand-in sync"] if mode in ("grpo", "gspo") else []
    )
    calls = []

    def capture(mode, inputs, topk):
        calls.append(mode)
        if mode == "grpo":
            return dict(captured=False, error="operation not permitted when stream is capturing")
        return dict(captured=True, loss_rel_err=0.0, grad_rel_err=0.0 if mode != "epic" else 1e-3)

    out = graph.section_graph("cpu", common.CPU_SIZES, False, capture=capture, healthy=lambda: calls[-1] != "grpo")
    rows = {r["mode"]: r for r in out["modes"]}
    assert calls[0] == common.PLAIN and set(rows) == {common.PLAIN, *LOSS_MODES}
    flagged = [m for m in calls if rows[m]["expected_syncs"]]
    assert flagged and calls[-len(flagged) :] == flagged  # the meta detector's modes come last
    assert not rows["epic"]["ok"] and out["status"] == "fail"  # a replay that disagrees with eager
    after = calls[calls.index("grpo") + 1 :] if "grpo" in calls else []
    assert after == []
    assert all("not run" in r["error"] for m, r in rows.items() if m not in calls)


def test_slime_section_flags_a_disagreement_with_the_core(monkeypatch):
    real = slime_loss.core_loss_and_grads

    def off_by_a_little(mode, samples):
        loss, grads = real(mode, samples)
        return loss * (1 + 1e-3), grads

    monkeypatch.setattr(slime_loss, "SLIME_CASES", ("epic",))
    monkeypatch.setattr(slime_loss, "core_loss_and_grads", off_by_a_little)
    out = slime_loss.section_slime("cpu", common.CPU_SIZES, None, common.BENCH_DIR / "wheels")
    if out["status"] == "skip":
        pytest.skip(out["reason"])
    assert out["status"] == "fail" and out["modes"][0]["loss_rel_err"] > 1e-5
