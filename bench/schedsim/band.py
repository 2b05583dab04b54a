"""The band of a predicted speedup: the same row against the same baseline (synchronous colocated at its
own best engine size), with one uncertain input moved at a time to each end of its range.

The ranges:
- tp_alpha: what sglang#5839's TP4 rows allow (``calibration.tp_alpha_range``: 0.43-1.0);
- the push over NCCL (``push_s_split``): 5-40 s ("tens of seconds per push for 30B-A3B", issue 20;
  verl publishes 15.76 s without and 4.38 s with its checkpoint engine);
- the batch-1 decode step (``t_base``): 5-20 ms, assumed: half to twice the A100 TP1 measurement
  (tenstorrent/tt-inference-server#340, 9.6-10.6 ms) that the preset takes for an H100 TP engine;
- the train MFU: 0.12-0.25 (0.25 is the preset's assumption; 0.12 is verl's fitted MFU on 128 GPUs).
The baseline is re-simulated under each setting too (its engine size re-chosen), so a band is what a
user who doubts one input would see. One at a time, not jointly: the ends are each input's own."""

from __future__ import annotations

import dataclasses

from .presets import Preset

PUSH_S_RANGE = (5.0, 40.0)
T_BASE_RANGE = (0.005, 0.020)
TRAIN_MFU_RANGE = (0.12, 0.25)


def variations(p: Preset) -> list[tuple[str, str, float]]:
    """(label, preset field, value) for each end of each range."""
    from .calibration import tp_alpha_range

    out = [(f"tp_alpha {a:g}", "tp_alpha", a) for a in tp_alpha_range(p)]
    out += [(f"push {s:g} s", "push_s_split", s) for s in PUSH_S_RANGE]
    out += [(f"batch-1 step {t * 1000:g} ms", "t_base", t) for t in T_BASE_RANGE]
    out += [(f"train MFU {m:g}", "train_mfu", m) for m in TRAIN_MFU_RANGE]
    return out


def ranges_text(p: Preset) -> str:
    from .calibration import tp_alpha_range

    lo, hi = tp_alpha_range(p)
    return (
        f"tp_alpha {lo:g}-{hi:g}, push {PUSH_S_RANGE[0]:g}-{PUSH_S_RANGE[1]:g} s, batch-1 step "
        f"{T_BASE_RANGE[0] * 1000:g}-{T_BASE_RANGE[1] * 1000:g} ms, train MFU {TRAIN_MFU_RANGE[0]:g}-{TRAIN_MFU_RANGE[1]:g}"
    )


def varied(p: Preset, field: str, value: float) -> Preset:
    """The preset with one input moved, its engine constants derived again."""
    extra = {"train_mfu_at": None} if field == "train_mfu" else {}
    return dataclasses.replace(p, **{field: value}, **extra, c_tok=0.0, c_kv=0.0, kv_capacity_tokens=0.0).derived()


class Band:
    """Speedups of rows of one preset under every variation; the baselines are simulated once per variation."""

    def __init__(self, p: Preset, rollouts: int, log=None):
        self.p, self.rollouts, self.log = p, rollouts, log
        self._sync: dict = {}

    def sync(self, label: str, q: Preset) -> float:
        from .frontier import best_sync

        if label not in self._sync:
            self._sync[label] = best_sync(q, self.rollouts)["s_per_rollout"]
        return self._sync[label]

    def row(self, q: Preset, schedule: str, warmup: int, rollouts: int | None = None) -> dict:
        """``q``: the row's preset (its split, engine size, push mode, oversampling), a variant of ``self.p``.
        Returns nominal (given), lo, hi and every variation's speedup."""
        from .schedules import simulate

        n = rollouts or max(self.rollouts, warmup + 10)
        cells = []
        for label, field, value in variations(self.p):
            v = varied(q, field, value)
            base = varied(self.p, field, value)
            ratio = self.sync(label, base) / simulate(v, schedule, n, warmup=warmup)["s_per_rollout"]
            cells.append((label, ratio))
            if self.log:
                self.log(
                    f"   {schedule} {q.total_gpus - q.train_gpus_split}:{q.train_gpus_split}x{q.gpus_per_engine} "
                    f"{label}: {ratio:.2f}x"
                )
        ratios = [r for _, r in cells]
        return dict(lo=min(ratios), hi=max(ratios), cells=cells)


def band_text(nominal: float, band: dict) -> str:
    """``1.42x (1.34-1.56x over the ranges)``; the band includes the nominal value."""
    lo, hi = min(band["lo"], nominal), max(band["hi"], nominal)
    return f"{nominal:.2f}x ({lo:.2f}-{hi:.2f}x over the ranges)"


def format_cells(band: dict) -> str:
    return ", ".join(f"{label}: {r:.2f}x" for label, r in band["cells"])
