import pathlib
import sys

import pytest

TESTS_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data" / "math"

# Import the package from this checkout even when another copy is installed, and the stand-ins and
# helpers as `support.<module>` from every test folder.
for path in (REPO_ROOT, TESTS_DIR):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


@pytest.fixture
def shared_math_dir():
    """../shared/data/math when present; skip otherwise (the tests must run without it)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared math data not present at {SHARED_DATA}")
    return SHARED_DATA
