"""slime integration: the only package that imports slime (lazily, inside functions).

- ``loss.policy_loss``: the custom loss for ``--loss-type custom_loss``.
- ``train``: the asynchronous driver (``python -m epic_slime.slime.train``).
- ``rollout.generate_rollout``: streaming generation with a staleness bound.
- ``flags``: the project's flag definitions; ``command_line``: the driver's command line in one
  parse and the flags it adds for slime; ``checks``: their validation; ``dry_run``: the launch
  scripts' ``DRY_RUN=1`` check (none of the four imports slime).
- ``adapter``, ``cp``, ``staleness``: slime-free arithmetic behind the above.
"""
