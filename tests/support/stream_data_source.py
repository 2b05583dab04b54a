"""The data-source interface ``GroupStream`` uses, for stream tests with an injected engine: numbered prompts,
each consumed once (its ledger counts it); ``fresh_group`` regenerates one. Needs slime's ``Sample``."""

from __future__ import annotations

from slime.utils.types import Sample

from epic_slime.slime.stream.ledger import GroupLedger


class DataSource:
    def __init__(self):
        self.next, self.ledger, self.returned = 0, GroupLedger(), []

    def handed_back(self):
        return len(self.returned)

    def add_samples(self, groups):  # given back (slime's abort): still owed; not handed out again here
        self.returned.extend(groups)

    def get_samples(self, n):
        groups = [[Sample(index=i, group_index=i)] for i in range(self.next, self.next + n)]
        for g in groups:
            self.ledger.consume(g[0].group_index, [Sample(index=g[0].index, group_index=g[0].index)])
        self.next += n
        return groups

    def fresh_group(self, key):
        return [Sample(index=key, group_index=key)]
