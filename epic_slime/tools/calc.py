"""The ``calc`` tool: arithmetic on model output, through a whitelisted expression tree (never eval).

Model output is hostile input. ``evaluate`` parses the text with ``ast.parse(mode="eval")`` and walks
the tree itself, accepting only number literals, + - * / // % ** and unary + -, with parentheses.
Names, calls, attributes, subscripts, strings, comparisons and everything else are refused with a
one-line ``CalcError`` that the agent loop hands back to the model as the tool's observation.

Limits keep one call cheap (microseconds to a millisecond, whatever the input): the text length,
the number of nodes, the size of every integer (bits), the exponent of ``**`` and the size of its
result estimated before it is computed, and finite floats.
"""

from __future__ import annotations

import ast
import math
import operator

MAX_CHARS = 200
MAX_NODES = 64
MAX_INT_BITS = 256  # about 77 decimal digits, operands and results alike
MAX_EXPONENT = 256

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalcError(ValueError):
    """The expression is refused or fails; the message is the tool's observation."""


def _check_number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalcError(f"only numbers are allowed, got {type(value).__name__}")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalcError(f"number too large (more than {MAX_INT_BITS} bits)")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError("result is not a finite number")
    return value


def _power(base, exponent):
    if isinstance(exponent, float) and not exponent.is_integer() and base < 0:
        raise CalcError("fractional power of a negative number")
    if abs(exponent) > MAX_EXPONENT:
        raise CalcError(f"exponent {exponent} beyond +-{MAX_EXPONENT}")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
        # bits of the result <= exponent * bits of the base: refuse before computing it
        if base.bit_length() * exponent > MAX_INT_BITS + exponent:
            raise CalcError(f"number too large (more than {MAX_INT_BITS} bits)")
    try:
        return operator.pow(base, exponent)
    except (OverflowError, ZeroDivisionError) as exc:
        raise CalcError(str(exc)) from None


def _eval(node):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        return _check_number(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check_number(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            result = _power(left, right)
        elif type(node.op) in _BINARY:
            try:
                result = _BINARY[type(node.op)](left, right)
            except (ZeroDivisionError, OverflowError) as exc:
                raise CalcError(str(exc)) from None
        else:
            raise CalcError(f"operator {type(node.op).__name__} is not allowed")
        if isinstance(result, complex):
            raise CalcError("complex result")
        return _check_number(result)
    raise CalcError(f"{type(node).__name__} is not allowed (numbers and + - * / // % ** only)")


def evaluate(text: str):
    """The value of an arithmetic expression (int or float); raises CalcError with a one-line reason."""
    if not isinstance(text, str):
        raise CalcError(f"expression must be text, got {type(text).__name__}")
    text = text.strip()
    if not text:
        raise CalcError("empty expression")
    if len(text) > MAX_CHARS:
        raise CalcError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise CalcError(f"not an expression: {exc.msg if isinstance(exc, SyntaxError) else exc}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalcError(f"expression has more than {MAX_NODES} parts")
    return _eval(tree)


def format_value(value) -> str:
    """An int as its digits; a float to 12 significant digits (an integral float without '.0')."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".12g")


def calc(text: str) -> str:
    """The tool: the formatted value of ``text`` (raises CalcError)."""
    return format_value(evaluate(text))
