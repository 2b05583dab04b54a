"""Find the final answer in a model response.

Order (DAPO format first): the last line containing ``Answer:`` wins; if that line holds a
``\\boxed{...}`` its content is taken. Without an ``Answer:`` line, the last ``\\boxed{...}``
(or ``\\fbox{...}``) in the response is used. Brace matching is a linear scan, so a
10,000-character response costs microseconds.
"""

from __future__ import annotations

import re

# "Answer:" opening a line, optionally decorated: "**Answer:**", "Final Answer:", "### The final answer:".
# Anchored so that prose such as "to find the answer: first ..." is not taken for the answer line.
_ANSWER_LINE = re.compile(r"^[\s*#>_-]*(?:the\s+)?(?:final\s+)?answer\s*\**\s*:\s*\**", re.IGNORECASE)
_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _braced_content(text: str, open_index: int) -> str | None:
    """Content of the brace group opening at ``text[open_index] == '{'``, or None if unbalanced."""
    depth = 0
    for i in range(open_index, len(text)):
        char = text[i]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : i]
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces allowed), else None.

    ``\\boxed 5`` (no braces, a single token) is accepted too, as LaTeX renders it.
    """
    best_start = -1
    best_command = ""
    for command in _BOX_COMMANDS:
        start = text.rfind(command)
        if start > best_start:
            best_start, best_command = start, command
    while best_start >= 0:
        after = best_start + len(best_command)
        rest = text[after:]
        stripped = rest.lstrip()
        if stripped.startswith("{"):
            content = _braced_content(text, after + (len(rest) - len(stripped)))
            if content is not None:
                return content
        elif rest[:1] == " " and stripped:
            token = re.match(r"[^\s$]+", stripped)
            if token:
                return token.group(0)
        # Unbalanced or empty box: try the previous one.
        previous = -1
        for command in _BOX_COMMANDS:
            start = text.rfind(command, 0, best_start)
            if start > previous:
                previous, best_command = start, command
        best_start = previous
    return None


def _clean_answer_line(line: str) -> str:
    boxed = last_boxed(line)
    if boxed is not None:
        return boxed
    return line.strip()


def extract_final_answer(response: str) -> str | None:
    """The final answer string of ``response``, or None when there is none."""
    if not isinstance(response, str) or not response:
        return None
    lines = response.splitlines()
    for index in range(len(lines) - 1, -1, -1):
        matches = list(_ANSWER_LINE.finditer(lines[index]))
        if not matches:
            continue
        candidate = _clean_answer_line(lines[index][matches[-1].end() :])
        if not candidate:
            # "Answer:" alone on its line: the answer is on the next non-empty line.
            following = [line for line in lines[index + 1 :] if line.strip()]
            candidate = _clean_answer_line(following[0]) if following else ""
        if candidate:
            return candidate
    boxed = last_boxed(response)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    return None
