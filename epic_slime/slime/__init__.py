"""slime integration: the only package that imports slime (lazily, inside functions).

On top, the modules slime or a user names by dotted path (flags, configs, ``python -m``):
- ``loss.policy_loss``: the custom loss for ``--loss-type custom_loss``.
- ``train``: the asynchronous driver (``python -m epic_slime.slime.train``).
- ``rollout.generate_rollout``, ``data_source``, ``generate``, ``agent_generate``, ``eval_hooks``,
  ``push_mode`` and ``routing``: slime's rollout, data-source, generate, eval-log and init hooks.
By job beneath them: ``cli/`` (the driver's command line: flags, one-pass parse, checks, dry run),
``stream/`` (the rollout's group stream, gate, ledger, faults and pushes) and ``loss_parts/`` (the
adapter, CP, TIS and Top-K arithmetic behind the loss).
"""
