"""Cheap, linear-time normalisation of answer strings before equivalence checking.

Everything here is plain string work (no sympy): it runs in the calling process and decides
the common cases (integers, identical LaTeX) without touching math-verify.
"""

from __future__ import annotations

import re
from fractions import Fraction

# Units and filler words that follow a number in an answer ("27 miles", "5\text{ cm}^2").
_UNIT_WORDS = (
    "units",
    "unit",
    "square",
    "sq",
    "cubic",
    "degrees",
    "degree",
    "deg",
    "radians",
    "rad",
    "cm",
    "mm",
    "km",
    "m",
    "meters",
    "meter",
    "metres",
    "inches",
    "inch",
    "in",
    "feet",
    "foot",
    "ft",
    "yards",
    "yd",
    "miles",
    "mile",
    "mph",
    "kmh",
    "hours",
    "hour",
    "hrs",
    "hr",
    "minutes",
    "minute",
    "min",
    "seconds",
    "second",
    "sec",
    "s",
    "days",
    "day",
    "weeks",
    "years",
    "dollars",
    "dollar",
    "cents",
    "cent",
    "points",
    "ways",
    "integers",
    "numbers",
    "students",
    "people",
    "pounds",
    "lbs",
    "grams",
    "g",
    "kg",
    "liters",
    "l",
    "ml",
    "gallons",
    "percent",
    "tiles",
    "games",
    "digits",
)
_UNIT_TAIL = re.compile(
    r"(?<=[\d}\s])\s*(?:"
    + "|".join(sorted(_UNIT_WORDS, key=len, reverse=True))
    + r")(?:\^\{?[23]\}?|\s*\^\s*\{?[23]\}?)?\s*$"
)
_TEXT_COMMANDS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_VARIABLE_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?=\S)")
_MULTI_SEPARATORS = re.compile(r"\\text\{\s*(?:and|or)\s*\}|\s+(?:and|or)\s+|;|\\quad|\\qquad")


def strip_math_delimiters(text: str) -> str:
    text = text.strip()
    changed = True
    while changed and text:
        changed = False
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
                text = text[len(left) : len(text) - len(right)].strip()
                changed = True
    # A lone leading or trailing "$" (the model closed or opened math only once).
    return text.strip("$").strip()


def split_top_level(text: str, separator: str = ",") -> list[str]:
    """Split on ``separator`` outside (), [], {} groups: '1, (2, 3)' -> ['1', '(2, 3)']."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(depth - 1, 0)
        elif char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part.strip() for part in parts]


def _strip_leading_zeros(text: str) -> str:
    if re.fullmatch(r"[+-]?\d+", text):
        return str(int(text))
    return text


def _expand_plus_minus(part: str) -> list[str]:
    """'\\frac{-1 \\pm \\sqrt{17}}{2}' -> the two values, when there is exactly one \\pm / \\mp."""
    signs = part.count("\\pm") + part.count("\\mp")
    if signs != 1:
        return [part]
    if "\\pm" in part:
        return [part.replace("\\pm", "+"), part.replace("\\pm", "-")]
    return [part.replace("\\mp", "-"), part.replace("\\mp", "+")]


def normalize_answer(text: str, multi_value: bool = False) -> str:
    """Canonical string form of an answer.

    ``multi_value``: the reference has several values, so "a and b", "a; b", "x=a, x=b" in
    the prediction become "a, b" (compared as a set later).
    """
    if text is None:
        return ""
    text = strip_math_delimiters(str(text))
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = text.replace("\\left", "").replace("\\right", "")
    text = text.replace("\\!", "").replace("{,}", ",").replace("\\$", "").replace("\\%", "").replace("%", "")
    text = re.sub(r"(?<=\d)\\[,;:](?=\d{3}(?!\d))", ",", text)  # 10\,000 as a thousands separator
    text = re.sub(r"\\[,;: ]|~", " ", text)
    text = _DEGREES.sub("", text)
    for _ in range(3):  # \text{..} nested at most a few levels in practice
        text, count = _TEXT_COMMANDS.subn(r"\1", text)
        if not count:
            break
    if multi_value:
        text = _MULTI_SEPARATORS.sub(",", text)
    text = re.sub(r"\s+", " ", text).strip()
    text = text.rstrip(".").strip()
    parts = split_top_level(text) if multi_value else [text]
    if multi_value:
        parts = [expanded for part in parts for expanded in _expand_plus_minus(part)]
    cleaned = []
    for part in parts:
        for _ in range(2):
            part = _UNIT_TAIL.sub("", part).strip()
        if multi_value or "=" in part:
            part = _VARIABLE_ASSIGNMENT.sub("", part)
        part = strip_math_delimiters(part)
        if _THOUSANDS.fullmatch(part):
            part = part.replace(",", "")
        cleaned.append(_strip_leading_zeros(part))
    return ", ".join(part for part in cleaned if part) if multi_value else cleaned[0]


def as_plain_number(text: str) -> Fraction | None:
    """Exact value of a plain decimal literal ('025', '-3', '2.50'), else None."""
    if _PLAIN_NUMBER.fullmatch(text):
        return Fraction(text)
    return None


def is_multi_value(reference: str) -> bool:
    """True when a normalised reference lists several values at top level ('a, b')."""
    return len(split_top_level(reference)) > 1
