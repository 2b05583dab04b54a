"""What a test module needs before it can run, checked in one place: slime's source on ``sys.path``
(``SLIME_PATH``, else the pinned snapshot beside the checkout) and the packages the module imports; a
module-level skip naming what is missing otherwise (a test run without slime skips, never errors)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from support.slime_args import slime_path


# slime's source and what the slime-contract extra adds for slime's rollout side (sglang_rollout,
# http_utils, the reward's latex parsing): the end-to-end files' precondition
SLIME_CONTRACT = ("slime", "megatron.core", "httpx", "aiohttp", "pylatexenc")


def put_slime_on_path() -> str | None:
    """slime's source folder, put first on ``sys.path`` when it exists; None when there is none."""
    path = slime_path()
    if path and path not in sys.path:
        sys.path.insert(0, path)
    return path


def missing(*modules: str) -> list[str]:
    """The modules whose top-level package is not importable here. A dotted name is checked by its top
    package: ``find_spec("megatron.core")`` raises, not answers None, when ``megatron`` is absent."""
    return [m for m in modules if importlib.util.find_spec(m.split(".")[0]) is None]


def skip_unless(*modules: str, why: str) -> None:
    """Put slime's source on the path, then skip the calling test module unless every one of ``modules``
    can be imported; the reason is ``why`` followed by the missing list."""
    __tracebackhide__ = True  # pytest reports the skip at the calling test module's line
    put_slime_on_path()
    gone = missing(*modules)
    if gone:
        pytest.skip(f"{why}; missing: {gone}", allow_module_level=True)


class slime_or_skip:  # lower case: read as a statement, ``with slime_or_skip(why):``
    """For a module that imports slime's own code at its top::

        with slime_or_skip("needs slime's source (set SLIME_PATH)"):
            from slime.utils.types import Sample

    slime's source goes on the path first (``as`` gives its folder, or None); any failure to import
    inside the block skips the module with ``why`` and the error. A missing ``slime`` is found by
    ``find_spec`` before the block runs (megatron, which a block may import first, imports slowly).
    A class, not a generator: pytest reports the skip at the test module's line, not contextlib's."""

    def __init__(self, why: str):
        self.why = why

    def __enter__(self) -> str | None:
        __tracebackhide__ = True
        path = put_slime_on_path()
        if importlib.util.find_spec("slime") is None:
            pytest.skip(f"{self.why}: no module named 'slime'", allow_module_level=True)
        return path

    def __exit__(self, kind, exc, tb) -> bool:
        __tracebackhide__ = True
        if isinstance(exc, Exception):  # any import failure means the precondition is absent
            pytest.skip(f"{self.why}: {exc!r}", allow_module_level=True)
        return False
