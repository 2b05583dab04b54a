"""slime's Megatron train group as the e2e harness's driver sees it, on the tiny model
(``slime_e2e_harness.py``)."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from collections import Counter
from pathlib import Path

import torch

PUSH_MODES = ("distributed", "disk-unserialised")


def _session():
    import requests

    s = requests.Session()
    s.trust_env = False
    return s



class CpuTrainGroup:
    """slime's actor group as the driver sees it (``async_train``, ``update_weights``,
    ``save_model``) on the tiny model: the loss is slime's ``loss_function`` with the project's
    loss; slime's per-rollout old-log-prob forward runs under slime's rule for it (skipped only
    under --use-rollout-logprobs without --get-mismatch-metrics) and is counted."""

    def __init__(self, args, server_url: str, trace, kill_after_train: int | None = None, manager=None,
                 push: str = "distributed", save_window=None):
        from epic_slime.runtime.model import ModelConfig, build_policy
        from epic_slime.runtime.task import Tokenizer

        if push not in PUSH_MODES:
            raise ValueError(f"push must be one of {PUSH_MODES}, got {push!r}")
        self.args, self.url, self.trace, self.kill_after_train = args, server_url, trace, kill_after_train
        self.manager, self.push, self.save_window = manager, push, save_window
        self.updater = None   # slime's distributed updater (support/slime_push.py), connected at the first push
        self.memory_clears = 0
        tok = Tokenizer()
        self.model = build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=0)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr or 1e-3)
        self.weight_version = 0
        self.forwards = Counter()
        self.start_rollout_id = 0
        if args.load:
            latest = Path(args.load) / "latest_rollout.txt"
            if latest.exists():
                rid = int(latest.read_text())
                state = torch.load(Path(args.load) / f"actor_{rid}.pt", weights_only=False)
                self.model.load_state_dict(state["model"])
                self.optimizer.load_state_dict(state["optimizer"])
                self.start_rollout_id = rid + 1

    # -- driver interface
    def async_train(self, rollout_id, data):
        before = dict(self.forwards)
        metrics = self._train(data)
        counts = {k: self.forwards[k] - before.get(k, 0) for k in self.forwards}
        self.trace.write("train", rollout_id, pids=data["pids"], staleness=data["staleness"],
                         weight_versions=data["weight_versions"], forwards=counts, metrics=metrics)
        if self.kill_after_train is not None and rollout_id == self.kill_after_train:
            self.trace.write("kill", rollout_id)
            os.kill(os.getpid(), signal.SIGKILL)
        done = concurrent.futures.Future()
        done.set_result(None)
        return done

    def clear_memory(self):
        self.memory_clears += 1

    def save_model(self, rollout_id, force_sync=False):
        if self.save_window is not None:
            self.save_window.saving("model", rollout_id)
        save = Path(self.args.save)
        save.mkdir(parents=True, exist_ok=True)
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, save / f"actor_{rollout_id}.pt")
        (save / "latest_rollout.txt").write_text(str(rollout_id))
        self.trace.write("save", rollout_id)

    def update_weights(self):
        """slime's push: ask the RolloutManager for the engines (waits behind its call in
        progress), then slime's own ``UpdateWeightFromDistributed.update_weights``
        (``support/slime_push.py``; under ``--weight-push-mode in_place`` wrapped by the push-mode
        hook): version + 1, pause, flush (abort mode), one ``update_weights_from_distributed`` per
        bucket (metadata over HTTP, tensors by broadcast, the bucket's weight_version), continue.
        ``push="disk-unserialised"``, a stress case only: straight to the engine from disk, landing
        wherever generation happens to be."""
        if self.push == "distributed":
            from support.slime_push import EngineActorStandIn, make_updater

            self.manager.get_updatable_engines_and_lock.remote().result()
            if self.updater is None:
                self.updater = make_updater(self.args, self.model, [EngineActorStandIn(self.url)])
            self.updater.weight_version = self.weight_version
            self.updater.update_weights()
            self.weight_version = self.updater.weight_version
            self.trace.write("update_weights", self.weight_version)
            return
        self.weight_version += 1
        s = _session()
        s.post(f"{self.url}/pause_generation", json={}).raise_for_status()
        for _ in range(60):
            if s.get(f"{self.url}/flush_cache").status_code == 200:
                break
            time.sleep(0.2)
        os.makedirs(self.args.save, exist_ok=True)
        path = os.path.join(self.args.save, f"push_{self.weight_version}.pt")
        torch.save(self.model.state_dict(), path)
        s.post(f"{self.url}/update_weights_from_disk", json={"model_path": path}).raise_for_status()
        s.post(f"{self.url}/update_weight_version", json={"new_version": str(self.weight_version)}).raise_for_status()
        os.remove(path)
        s.post(f"{self.url}/continue_generation", json={}).raise_for_status()
        self.trace.write("update_weights", self.weight_version)

    # -- training
    def _logits(self, data, rows):
        """THD layout as slime's get_batch: all sequences concatenated, logits [1, sum T, V]."""
        chunks = []
        for i in rows:
            ids = torch.tensor(data["tokens"][i])[None]
            chunks.append(self.model(input_ids=ids, use_cache=False).logits[0])
        return torch.cat(chunks)[None]

    def _batch(self, data, rows):
        resp = [data["response_lengths"][i] for i in rows]
        return {
            "unconcat_tokens": [torch.tensor(data["tokens"][i]) for i in rows],
            "total_lengths": [len(data["tokens"][i]) for i in rows],
            "response_lengths": resp,
            "loss_masks": [torch.tensor(data["loss_masks"][i], dtype=torch.int32) for i in rows],
            "advantages": [torch.full((n,), float(data["advantages"][i])) for i, n in zip(rows, resp)],
            "rollout_log_probs": [torch.tensor(data["rollout_log_probs"][i]) for i in rows],
            "log_probs": [data["log_probs"][i] for i in rows] if "log_probs" in data else None,
            "rollout_mask_sums": torch.tensor([float(sum(data["loss_masks"][i])) for i in rows]),
        }

    def _old_log_probs(self, data):
        """slime's compute_log_prob pass: the current policy's log-probs of every response."""
        out = []
        with torch.no_grad():
            for i in range(len(data["tokens"])):
                ids = torch.tensor(data["tokens"][i])
                n = data["response_lengths"][i]
                logits = self.model(input_ids=ids[None], use_cache=False).logits[0].float()
                lp = torch.log_softmax(logits[-n - 1 : -1] / self.args.rollout_temperature, -1)
                out.append(lp.gather(1, ids[-n:, None]).squeeze(1))
        self.forwards["old_logprob"] += 1
        return out

    def _train(self, data) -> dict:
        from slime.backends.megatron_utils.loss import loss_function

        args = self.args
        if not args.use_rollout_logprobs or args.get_mismatch_metrics:
            data = dict(data, log_probs=self._old_log_probs(data))
        n = len(data["tokens"])
        steps = args.num_steps_per_rollout or 1
        per_step = n // steps
        metrics = {}
        for step in range(steps):
            rows = list(range(step * per_step, (step + 1) * per_step))
            logits = self._logits(data, rows)
            self.forwards["train"] += 1
            loss, _, log = loss_function(args, self._batch(data, rows), 1, per_step, logits)
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), args.clip_grad)
            self.optimizer.step()
            metrics = dict(zip(log["keys"], [float(v) for v in log["values"][1:]]))
        return metrics
