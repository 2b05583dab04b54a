"""The slime path's staleness gate: the shared pure module ``epic_slime.staleness`` (one
implementation for the runtime and slime); names kept here for existing imports."""

from epic_slime.staleness import (  # noqa: F401
    INITIAL_VERSION_NAMES,
    GroupLedger,
    StalenessGate,
    annotate_group,
    collect_admitted_groups,
    group_staleness,
    parse_weight_version,
    sample_version,
    select_groups,
    trainer_version_for_rollout,
)
