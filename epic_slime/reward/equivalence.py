"""Symbolic equivalence through math-verify. Runs inside reward worker processes only.

math-verify's own timeouts use SIGALRM, which fails off the main thread; here they are
switched off (``parsing_timeout=None``, ``timeout_seconds=None``) because the worker process
is bounded from outside by the pool (kill on deadline).
"""

from __future__ import annotations

import functools
import logging


def _silence_math_verify() -> None:
    # It warns once that its timeouts are disabled: that is deliberate here.
    for name in ("math_verify", "math_verify.parser", "math_verify.grader", "math_verify.utils"):
        logging.getLogger(name).setLevel(logging.ERROR)


@functools.lru_cache(maxsize=1)
def _extraction_config():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


def parse_answer(answer: str):
    """math-verify's parse of an already-extracted answer (wrapped in a box so it is taken whole)."""
    from math_verify import parse

    return parse("\\boxed{" + answer + "}", extraction_config=_extraction_config(), parsing_timeout=None)


@functools.lru_cache(maxsize=4096)
def _parse_reference(reference: str):
    return parse_answer(reference)


def verify_equivalent(prediction: str, reference: str) -> bool:
    """True when math-verify judges ``prediction`` equal to ``reference`` (sets compare as sets)."""
    from math_verify import verify

    gold = _parse_reference(reference)
    pred = parse_answer(prediction)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=None))


def warm_up() -> None:
    """Pay the one-off costs (imports, grammar loading, regex compilation) before serving."""
    _silence_math_verify()
    verify_equivalent("\\frac{1}{2}", "0.5")
    verify_equivalent("1, 2", "2, 1")
