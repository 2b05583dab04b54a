"""slime's RolloutManager Ray actor as the e2e harness's driver sees it (``slime_e2e_harness.py``)."""

from __future__ import annotations

import concurrent.futures

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

    def __init__(self, args, trace):
        from slime.utils.http_utils import init_http_client
        from slime.utils.misc import load_function

        self.args, self.trace = args, trace
        init_http_client(args)
        self.data_source = load_function(args.data_source_path)(args)
        self.generate_rollout = load_function(args.rollout_function_path)
        self.eval_generate_rollout = load_function(args.eval_function_path)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout-manager")
        self.save_window = None   # SaveWindowKill, set by the session
        for name in ("generate", "eval", "save", "load", "dispose", "get_updatable_engines_and_lock"):
            setattr(self, name, _Method(self._pool, getattr(self, f"_{name}")))

    def _generate(self, rollout_id):
        from slime.rollout.base_types import call_rollout_fn

        out = call_rollout_fn(self.generate_rollout, self.args, rollout_id, self.data_source, evaluation=False)
        self.trace.write("generate", rollout_id, metrics=out.metrics)
        return train_data(out.samples, self.args)

    def _eval(self, rollout_id):
        from slime.rollout.base_types import call_rollout_fn
        from slime.utils.misc import load_function

        result = call_rollout_fn(self.eval_generate_rollout, self.args, rollout_id, self.data_source, evaluation=True)
        # slime's log_eval_rollout_data calls the hook first, like this (its module imports wandb)
        if self.args.custom_eval_rollout_log_function_path is not None:
            load_function(self.args.custom_eval_rollout_log_function_path)(rollout_id, self.args, result.data, result.metrics)
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


def train_data(groups, args) -> dict:
    """What the train group needs from a rollout: per sample tokens, lengths, loss masks,
    SGLang log-probs, and the GRPO-normalised reward (the project's runtime formula)."""
    from epic_slime.runtime.trainer import group_advantages

    samples, rewards = [], []
    for group in groups:
        raw = [float(s.reward) for s in group]
        for s, adv in zip(group, group_advantages(raw)):
            samples.append(s)
            rewards.append(adv)
    return {
        "tokens": [list(s.tokens) for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "loss_masks": [list(s.loss_mask) for s in samples],
        "rollout_log_probs": [list(s.rollout_log_probs) for s in samples],
        "advantages": rewards,
        "pids": [int(s.metadata["pid"]) for s in samples[:: args.n_samples_per_prompt]],
        "weight_versions": [list(s.weight_versions) for s in samples],
        "staleness": [int(s.metadata["epic_group_staleness"]) for s in samples[:: args.n_samples_per_prompt]],
    }
