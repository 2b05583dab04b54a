"""The README is a short front door and the manual in docs/ stays true: links resolve, the test
command is what CI runs, and the loss documentation matches the registry."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
CI_RUN = REPO / ".ci" / "run"
README_MAX_LINES = 220

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _outside_code(text: str) -> list[str]:
    """The lines of a Markdown text that are not inside ``` fences."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.M | re.S)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, -N on repeats."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _outside_code(_read(path)):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _local_links(path: Path) -> list[tuple[Path, str]]:
    """(target file, anchor or '') of every relative link of a Markdown file, outside code."""
    links = []
    for line in _outside_code(_read(path)):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):  # http(s):, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            links.append(((path.parent / file_part).resolve() if file_part else path, anchor))
    return links


def _manual() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_readme_is_a_front_door():
    lines = _read(README).splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


@pytest.mark.parametrize("doc", [README, *_manual()], ids=lambda p: p.name)
def test_links_resolve(doc):
    for target, anchor in _local_links(doc):
        assert target.exists(), f"{doc.name} links to {target.relative_to(REPO)}, which does not exist"
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target), f"{doc.name} links to #{anchor} in {target.name}: no such heading"


def test_readme_links_every_doc():
    linked = {target for target, _ in _local_links(README)}
    unlinked = [p.name for p in _manual() if p.resolve() not in linked]
    assert not unlinked, f"docs not in the README's table: {unlinked}"


def test_command_2_is_what_ci_runs():
    blocks = [block.strip() for block in _code_blocks(_read(README), "bash")]
    assert "bash .ci/run" in blocks, "the README's test command must be `bash .ci/run`, alone in its block"
    ci = _read(CI_RUN)
    assert re.search(r"^python -m pytest -q( --durations=\d+)?$", ci, flags=re.M), ".ci/run no longer runs the suite"


def test_torch_is_installed_the_same_way_in_readme_and_ci():
    command_1 = next(block for block in _code_blocks(_read(README), "bash") if "epic-slime train" in block)
    (readme_torch,) = re.findall(r'(?:PIP_RETRIES=0 )?pip install "torch==[^"]+"[^&\n]*', command_1)
    ci_torch = [line.strip() for line in _read(CI_RUN).splitlines() if '"torch==' in line and "install" in line]
    assert ci_torch == [readme_torch.strip().replace("pip install", "python -m pip install")], (readme_torch, ci_torch)
    # the extra index is unreachable where only the registries are: no retries (about 75 s of them otherwise)
    assert readme_torch.startswith("PIP_RETRIES=0 "), readme_torch


def _loss_sections() -> dict[str, str]:
    """Text of each '### `mode`' section of docs/losses.md, up to the next heading."""
    text = "\n".join(_outside_code(_read(DOCS / "losses.md")))
    parts = re.split(r"^(#{1,6} .*)$", text, flags=re.M)
    sections = {}
    for heading, body in zip(parts[1::2], parts[2::2]):
        name = re.fullmatch(r"### `(\w+)`", heading.strip())
        if name:
            sections[name.group(1)] = body
    return sections


def test_losses_doc_has_every_registry_mode_with_its_defaults():
    from epic_slime.losses import LOSS_MODES

    sections = _loss_sections()
    assert set(sections) == set(LOSS_MODES), set(sections) ^ set(LOSS_MODES)
    for mode, spec in LOSS_MODES.items():
        body = sections[mode]
        defaults_line = re.search(r"^Defaults: (.*?)(?:\n\n|\Z)", body, flags=re.M | re.S)
        assert defaults_line, f"docs/losses.md: `{mode}` has no 'Defaults:' line"
        documented = {
            name: ast.literal_eval(value) for name, value in re.findall(r"`(\w+)=([^`]+)`", defaults_line.group(1))
        }
        assert documented == spec.defaults, (mode, documented, spec.defaults)
        (aggregation,) = re.findall(r"aggregation\s+`([^`]+)`", defaults_line.group(1))
        assert aggregation == spec.aggregation, (mode, aggregation, spec.aggregation)


def test_integrations_doc_names_what_the_adapters_export():
    """Every mode the adapters offer is a documented registry mode; docs/integrations.md names the
    ones left out and verl's prefixed names exactly."""
    from epic_slime.integrations import VERL_OWN_MODES, VERL_PREFIX, exported_modes, verl_loss_name
    from epic_slime.losses import LOSS_MODES

    assert set(exported_modes()) <= set(_loss_sections())
    text = _read(DOCS / "integrations.md")
    (left_out,) = re.findall(r"except (`\w+`(?: and `\w+`)*), which need", text)
    assert set(re.findall(r"`(\w+)`", left_out)) == set(LOSS_MODES) - set(exported_modes())
    prefixed = set(re.findall(rf"`({VERL_PREFIX}\w+)`", text))
    assert prefixed == {verl_loss_name(mode) for mode in VERL_OWN_MODES}


def test_losses_summary_table_lists_every_mode():
    from epic_slime.losses import LOSS_MODES

    rows = re.findall(r"^\| `(\w+)`(?: \(default\))? \|", _read(DOCS / "losses.md"), flags=re.M)
    assert sorted(rows) == sorted(LOSS_MODES)
