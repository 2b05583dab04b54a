"""The runtime's staleness control and sample accounting: the shared pure module
``epic_slime.staleness`` (one implementation for the runtime and slime); names kept here for
existing imports."""

from epic_slime.staleness import Accounting, Group, Selection, over_limit, select_batch  # noqa: F401
