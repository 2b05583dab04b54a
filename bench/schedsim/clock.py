"""A virtual-time asyncio loop: ``await asyncio.sleep`` in the real code costs simulated seconds."""

from __future__ import annotations

import asyncio
import selectors


class _AdvancingSelector(selectors.SelectSelector):
    """select(timeout) advances the loop's virtual clock by timeout and reports no I/O."""

    def __init__(self):
        super().__init__()
        self.clock: list[float] = [0.0]

    def select(self, timeout=None):
        if timeout is None:
            raise RuntimeError("simulation deadlock: nothing is scheduled and nothing is ready")
        if timeout > 0:
            self.clock[0] += timeout
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self):
        sel = _AdvancingSelector()
        self._clock = sel.clock
        super().__init__(selector=sel)

    def time(self) -> float:
        return self._clock[0]
