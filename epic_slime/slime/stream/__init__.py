"""The rollout's machinery behind rollout.py, data_source.py and push_mode.py: the group stream, the
staleness gate, the prompt ledger, engine faults, pushes (recovery, served-weight names, version spans),
the generate functions' sample checks and the checkpoint marks a resume trusts."""
