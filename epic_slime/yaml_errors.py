"""A YAML syntax error in one line: the file, the line and column, and what the parser expected.

PyYAML's own message spans four lines (the context's position, then the problem's); a config
error on the command line should read as one."""

from __future__ import annotations


def yaml_error_line(path, error) -> str:
    """'PATH line L, column C: PROBLEM (CONTEXT at line L2)' from a yaml.YAMLError (1-based positions)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None)
    if mark is None or problem is None:
        return f"{path}: not valid YAML ({' '.join(str(error).split())})"
    text = f"{path} line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}"
    context, context_mark = getattr(error, "context", None), getattr(error, "context_mark", None)
    if context and context_mark is not None:
        text += f" ({context} at line {context_mark.line + 1}, column {context_mark.column + 1})"
    elif context:
        text += f" ({context})"
    return text
