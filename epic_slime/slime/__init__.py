"""slime integration: the only package that imports slime (lazily, inside functions).

- ``loss.policy_loss``: the custom loss for ``--loss-type custom_loss``.
- ``train``: the asynchronous driver (``python -m epic_slime.slime.train``).
- ``rollout.generate_rollout``: streaming generation with a staleness bound.
- ``flags``: the project's flags and their validation (no slime; used by ``DRY_RUN=1``).
- ``adapter``, ``cp``, ``staleness``: slime-free arithmetic behind the above.
"""
