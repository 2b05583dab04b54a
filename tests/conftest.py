import pathlib
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data" / "math"

# Import the package from this checkout even when another copy is installed.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@pytest.fixture
def shared_math_dir():
    """../shared/data/math when present; skip otherwise (the tests must run without it)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared math data not present at {SHARED_DATA}")
    return SHARED_DATA
