"""slime's RolloutManager Ray actor as the e2e harness's driver sees it (``slime_e2e_harness.py``).

A rollout's samples become training data by slime's own ``RolloutManager`` methods
(``_get_rollout_data``'s flattening, ``_post_process_rewards``, ``_convert_samples_to_train_data``,
``_split_train_data_by_dp``: GRPO rewards, loss masks, per-rollout mask sums, the DP / micro-batch
schedule, one object per DP rank put into the store), run on this stand-in as ``self``
(``support/slime_store.py``: the class without its Ray wrapper, Ray's object store stood in for).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import types


class _Method:
    def __init__(self, pool, fn):
        self.pool, self.fn = pool, fn

    def remote(self, *a, **kw):
        return self.pool.submit(self.fn, *a, **kw)


class RolloutManagerStandIn:
    """slime's RolloutManager as the driver sees it: a Ray actor that serves one call at a time
    (here one thread), built from slime's own pieces: the data source named by
    --data-source-path, the rollout / eval functions by path, ``call_rollout_fn`` and the rollout
    / eval logging (which calls the eval-record hook)."""

    def __init__(self, args, trace, store):
        from slime.utils.http_utils import init_http_client
        from slime.utils.misc import load_function

        from support.slime_store import install, rollout_manager_class

        self.args, self.trace, self.store = args, trace, store
        self.slime_manager = rollout_manager_class()
        install(store)
        self._post_process_rewards = types.MethodType(self.slime_manager._post_process_rewards, self)
        # what slime's __init__ sets and its conversion reads
        self.custom_reward_post_process_func = (
            load_function(args.custom_reward_post_process_path) if args.custom_reward_post_process_path else None
        )
        self.custom_convert_samples_to_train_data_func = (
            load_function(args.custom_convert_samples_to_train_data_path)
            if args.custom_convert_samples_to_train_data_path
            else None
        )
        self.train_parallel_config = None  # set by the train group (slime: train_actor.set_rollout_manager)
        self.sample_info: dict[int, dict] = {}  # Sample.index -> what the trace reports per sample
        init_http_client(args)
        self.data_source = load_function(args.data_source_path)(args)
        self.generate_rollout = load_function(args.rollout_function_path)
        self.eval_generate_rollout = load_function(args.eval_function_path)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout-manager")
        self.save_window = None  # SaveWindowKill, set by the session
        for name in (
            "generate",
            "eval",
            "save",
            "load",
            "dispose",
            "get_updatable_engines_and_lock",
            "set_train_parallel_config",
        ):
            setattr(self, name, _Method(self._pool, getattr(self, f"_{name}")))

    def _generate(self, rollout_id):
        """slime's ``generate`` without its logging and debug dumps (wandb): the rollout function
        through ``call_rollout_fn``, slime's flattening, conversion and per-DP split; returns one
        ``Box`` per DP rank."""
        from slime.observability.rollout_data_utils import validate_rollout_id_annotated
        from slime.rollout.base_types import call_rollout_fn

        out = call_rollout_fn(self.generate_rollout, self.args, rollout_id, self.data_source, evaluation=False)
        self.trace.write("generate", rollout_id, metrics=out.metrics)
        samples = out.samples
        validate_rollout_id_annotated(samples)
        while isinstance(samples[0], list):  # slime's _get_rollout_data
            samples = list(itertools.chain.from_iterable(samples))
        for s in samples:
            self.sample_info[s.index] = {
                "pid": int(s.metadata["pid"]),
                "weight_versions": list(s.weight_versions),
                "staleness": int(s.metadata["epic_group_staleness"]),
                "rollout_id": rollout_id,
            }
            if "agent" in s.metadata:  # a multi-turn generate function's log (support/slime_e2e_agent.py)
                self.sample_info[s.index]["agent"] = {
                    **s.metadata["agent"],
                    "oldest": s.metadata.get("oldest_weight_version"),
                    "loss_mask": list(s.loss_mask or []),
                    "rollout_log_probs": list(s.rollout_log_probs or []),
                    "response_length": s.response_length,
                    "status": s.status.value,
                }
        data = self.slime_manager._convert_samples_to_train_data(self, samples)
        return self.slime_manager._split_train_data_by_dp(self, data)

    def _set_train_parallel_config(self, config):
        self.train_parallel_config = config

    def _eval(self, rollout_id):
        from slime.rollout.base_types import call_rollout_fn
        from slime.utils.misc import load_function

        result = call_rollout_fn(self.eval_generate_rollout, self.args, rollout_id, self.data_source, evaluation=True)
        # slime's log_eval_rollout_data calls the hook first, like this (its module imports wandb)
        if self.args.custom_eval_rollout_log_function_path is not None:
            load_function(self.args.custom_eval_rollout_log_function_path)(
                rollout_id, self.args, result.data, result.metrics
            )
        self.trace.write("eval", rollout_id, samples={k: len(v["samples"]) for k, v in result.data.items()})

    def _save(self, rollout_id):
        if self.save_window is not None:
            self.save_window.saving("data", rollout_id)
        self.data_source.save(rollout_id)
        self.trace.write("rollout_save", rollout_id)

    def _get_updatable_engines_and_lock(self):
        """What every train actor's update_weights asks first (slime's actor.py): queued behind
        the call in progress, e.g. generate(r + 1), so a push never lands inside a generate call."""
        return [], None, 0, [], [], []

    def _load(self, rollout_id=None):
        self.data_source.load(rollout_id)

    def _dispose(self):
        return None

    def shutdown(self):
        self._pool.shutdown(wait=True)
