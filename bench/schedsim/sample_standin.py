"""slime's ``Sample`` where slime is not installed.

The simulator is arithmetic on a model: the only thing of slime's it touches is the ``Sample`` record
(``slime.utils.types``) that the real GroupStream and staleness code read and write. Without slime
(the README's venv), ``use_standin_if_needed`` registers a small record with the fields that code
uses under that module name, so ``plan``, ``calibrate`` and the other commands run; with slime on the
path (``SLIME_PATH``) slime's own class is used and nothing is registered. The committed simulator
outputs are made with slime's own."""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import sys
import types

NOTE = (
    "note: slime is not installed here: the simulator uses its own stand-in for slime's Sample record "
    "(bench/schedsim/sample_standin.py); for slime's own, PYTHONPATH=.:$SLIME_PATH with a slime checkout"
)


class Status(enum.Enum):
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclasses.dataclass
class Sample:
    """The fields of slime's Sample that the stream, the staleness gate and the simulator use."""

    group_index: int | None = None
    index: int | None = None
    response_length: int = 0
    weight_versions: list = dataclasses.field(default_factory=list)
    metadata: dict = dataclasses.field(default_factory=dict)
    status: Status = Status.PENDING
    tokens: list = dataclasses.field(default_factory=list)
    reward: float | None = None
    rollout_routed_experts: object = None

    Status = Status


def slime_installed() -> bool:
    return "slime" in sys.modules or importlib.util.find_spec("slime") is not None


def use_standin_if_needed() -> str | None:
    """Registers the stand-in as ``slime.utils.types`` when slime cannot be imported; returns NOTE then."""
    if slime_installed():
        return None
    package = types.ModuleType("slime")
    package.__path__ = []  # a package: ``import slime.x`` of anything else fails as not installed
    utils = types.ModuleType("slime.utils")
    utils.__path__ = []
    mod = types.ModuleType("slime.utils.types")
    mod.Sample = Sample
    package.utils, utils.types = utils, mod
    sys.modules.update({"slime": package, "slime.utils": utils, "slime.utils.types": mod})
    return NOTE
