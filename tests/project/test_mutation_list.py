"""The curated mutation list (tests/mutation/mutants.yaml), and the independent pass's (fresh_pass.yaml), stay applicable as code moves: three entries
had gone stale unnoticed (their lines moved to group_stream.py, engine_faults.py and a folded call), and a
stale entry is a check that silently stopped running."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _runner():
    spec = importlib.util.spec_from_file_location("mutation_run", REPO / "tests" / "mutation" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("listing", ["mutants.yaml", "fresh_pass.yaml"])
def test_every_mutant_applies_to_its_file_and_names_test_files_that_exist(listing):
    run = _runner()
    mutants = run.load_mutants(REPO / "tests" / "mutation" / listing)
    stale = []
    for m in mutants:
        source = REPO / m["file"]
        mutated, why = run.mutate(source.read_text(), m) if source.is_file() else (None, "no such file")
        if mutated is None:
            stale.append(f"{m['id']}: {m['file']}: {why}")
        for test in m["tests"]:  # a file, or a file::test node
            path, _, node = test.partition("::")
            if not (REPO / path).is_file():
                stale.append(f"{m['id']}: test file {path} is missing")
            elif node and f"def {node.split('[')[0].split('::')[-1]}(" not in (REPO / path).read_text():
                stale.append(f"{m['id']}: test {node} is not in {path}")
    assert len(mutants) > 100 and not stale, stale
