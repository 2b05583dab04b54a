"""The DAPO instruction template (DAPO-Math-17k's own prompt format)."""

from __future__ import annotations

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def dapo_prompt_text(problem: str) -> str:
    return DAPO_PREFIX + problem + DAPO_SUFFIX


def dapo_chat_prompt(problem: str) -> list[dict[str, str]]:
    """slime-ready chat list (use with ``--apply-chat-template``)."""
    return [{"role": "user", "content": dapo_prompt_text(problem)}]


def strip_dapo_template(text: str) -> str:
    """The bare problem of a DAPO-formatted prompt (text without the template is returned as is)."""
    if text.startswith(DAPO_PREFIX):
        text = text[len(DAPO_PREFIX) :]
    if text.endswith(DAPO_SUFFIX):
        text = text[: -len(DAPO_SUFFIX)]
    return text
