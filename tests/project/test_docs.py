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


def test_the_suite_size_and_time_are_one_figure_in_readme_and_testing_md():
    """The first-hour trial found 1319 tests in 16 min in the README and 1081 in 11.5 in testing.md."""
    pattern = (
        r"The suite holds (\d+) tests \(`python -m pytest --collect-only -q`, (\d{4}-\d\d-\d\d).*?"
        r"last timed run, (\d+) tests on (\d{4}-\d\d-\d\d), took (\d+ min \d+ s)"
    )
    found = [re.search(pattern, " ".join(_read(path).split())) for path in (README, DOCS / "testing.md")]
    assert all(found), "README.md and docs/testing.md each state the suite's size and last timed run"
    assert found[0].groups() == found[1].groups(), [f.groups() for f in found]


def test_the_runtimes_async_over_sync_figures_are_the_measurement_files():
    """The README once said 1.21 (a 60-step bench of 2026-11-30) while the measurement file said 1.14. Now: the
    simulator's calibration point (bench/runtime_measurement.json, 2026-12-01) is quoted as such, and the README's
    figure for today's code is the interleaved re-measurement's median (bench/async_pairs.log), with the old code's."""
    import json
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    from async_pairs import read_pairs, summary

    measured = json.loads(_read(REPO / "bench" / "runtime_measurement.json"))["measured_async_over_sync"]
    figure = f"{measured:.2f}"
    pairs = summary(read_pairs(_read(REPO / "bench" / "async_pairs.log")))
    new, old = f"{pairs['new_median']:.2f}", f"{pairs['old_median']:.2f}"
    diffs = ", ".join(f"{d:+.2f}" for d in pairs["diffs"])
    readme = " ".join(_read(README).split())
    results = " ".join(_read(DOCS / "results.md").split())
    assert re.findall(r"async vs sync (\d\.\d\d)", readme) == [new]
    assert f"async vs sync {new} (median of {pairs['pairs']} runs interleaved" in readme
    assert f"which gave {old}; new - old per pair {diffs};" in readme
    assert re.findall(r"ratio (\d\.\d\d), on an idle 2-core machine on 2026-12-01", results) == [figure]
    assert re.findall(r"against (\d\.\d\d) measured \(idle, 2026-12-01", results) == [figure]
    lo, hi = pairs["new_range"]
    assert f"today's median {new} ({lo:.2f}-{hi:.2f}), the old code's {old}" in results
    assert f"new - old per pair {diffs}" in results


def test_the_runtimes_cpu_time_finding_is_the_bench_logs():
    """The CPU-time answer to issue 34's async gap (old 69105eb against today's code) quotes the interleaved bench's
    summary (bench/runtime_cpu_pairs.log) and the stall probe's counts (bench/runtime_stall_probe.log) as printed."""
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    from runtime_cpu_pairs import read_summary

    s = read_summary(_read(REPO / "bench" / "runtime_cpu_pairs.log"))
    assert s["same_inputs"] and s["old"] == "69105eb", s
    calls = s["calls"]
    results = " ".join(_read(DOCS / "results.md").split())
    step = calls["train_step"]
    assert (
        f"the trainer's step on one batch (512 samples, D = 8) {step['old']:.0f} ms old, {step['new']:.0f} ms new "
        f"(new/old per pair {', '.join(f'{r:.3f}' for r in step['ratios'])})"
    ) in results
    gen = calls["generate"]
    assert f"a rollout worker's request (256 samples) {gen['old']:.0f} ms old, {gen['new']:.0f} ms new" in results
    m = calls["metrics"]
    per_step = (m["new"] - m["old"]) * 8
    assert (
        f"the loss metrics per minibatch {m['old']:.2f} ms old, {m['new']:.2f} ms new, of which the three new "
        f"ones (abs_L_p50/p90_position, grad_removed_frac) {s['metrics_new']:.2f} ms: 8 minibatches make it "
        f"{per_step:.1f} ms a step, {100 * per_step / step['old']:.2f}% of the step"
    ) in results
    probe = _read(REPO / "bench" / "runtime_stall_probe.log")
    held = re.findall(r"worker_held_by_budget (\d+), request_cut_by_budget (\d+)", probe)
    waits = re.findall(r"start-order waits: (\d+) ", probe)
    assert held and waits and all(h == ("0", "0") for h in held) and set(waits) == {"0"}, (held, waits)
    assert "counted 0 workers held by the budget, 0 requests cut by it and 0 start-order waits" in results
    cpu = re.findall(r"^== pair \d+ (\S+) .*?CPU per step, steps 2-\d+: trainer (\d+\.\d) ms", probe, flags=re.M | re.S)
    old = [float(c) for t, c in cpu if "old" in t]
    new = [float(c) for t, c in cpu if "old" not in t]
    assert old and new, cpu
    assert (
        f"the trainer actor's CPU per step over the whole run {', '.join(f'{c:.0f}' for c in old)} ms old, "
        f"{', '.join(f'{c:.0f}' for c in new)} ms new"
    ) in results
