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
# the session's schedule as its own rollout side sees it (one process; support/slime_e2e_agent.py's tool
# reads it): a train step is running and its push has not landed; pushes done; the manager is collecting
# a batch (the driver asks for batch r + 1 before training r, and push r waits behind that call)
TRAIN_WINDOW = {"training": False, "pushes": 0, "collecting": False, "parked": 0, "hold_pushes": False}
HOLD_PUSH_S = 60.0  # the longest a push waits for a parked tool call (hold_pushes)
KILL_BUCKET = 2  # kill_during_push: in the last of the push's 3 buckets (two loaded, lm_head's not)


def _session():
    import requests

    s = requests.Session()
    s.trust_env = False
    return s


class CpuTrainGroup:
    """slime's actor group as the driver sees it (``async_train``, ``update_weights``,
    ``save_model``) on the tiny model, ``dp_size`` data-parallel ranks in one process: each rank
    fetches its own object by slime's ``process_rollout_data`` (from the store stand-in, counted per
    rank), gets slime's ``compute_advantages_and_returns`` and runs its micro-batches of slime's
    schedule through slime's ``loss_function`` with the project's loss; the gradients of all ranks
    add up before one optimiser step (Megatron divides each micro-batch's loss by their count and
    averages over DP, which cancels loss_function's DP factor). slime's per-rollout old-log-prob
    forward runs under slime's rule for it (skipped only under --use-rollout-logprobs without
    --get-mismatch-metrics) and is counted."""

    def __init__(
        self,
        args,
        server_url: str,
        trace,
        kill_after_train: int | None = None,
        manager=None,
        push: str = "distributed",
        save_window=None,
        store=None,
        dp_size: int = 2,
        engine_urls: list[str] | None = None,
        real_engines: bool = False,
        kill_during_push: int | None = None,
    ):
        from epic_slime.runtime.model import ModelConfig, build_policy
        from epic_slime.runtime.task import Tokenizer

        if push not in PUSH_MODES:
            raise ValueError(f"push must be one of {PUSH_MODES}, got {push!r}")
        self.args, self.url, self.trace, self.kill_after_train = args, server_url, trace, kill_after_train
        self.manager, self.push, self.save_window = manager, push, save_window
        self.store, self.dp_size = store, dp_size
        self.engine_urls = list(engine_urls or [server_url])  # the push goes to every engine, not the router
        self.r3 = bool(getattr(args, "use_rollout_routing_replay", False))  # support/slime_e2e_r3.py
        # the real SGLang server: pushes name the checkpoint's tensors, and every push is confirmed by
        # scoring a fixed probe on each engine (it answers success for names it cannot map)
        self.real_engines = real_engines
        # SIGKILL of the whole driver in the push after training this rollout, between two tensors of
        # its last bucket (issue 35 item 4); the rollout last trained decides which push it is
        self.kill_during_push, self.last_trained = kill_during_push, None
        self.last_pushed: dict | None = None
        self.steps_done = 0
        # slime's MegatronTrainRayActor.train_parallel_config at TP = PP = CP = 1
        self.train_parallel_config = {
            "dp_size": dp_size,
            "cp_size": 1,
            "vpp_size": 1,
            "microbatch_group_size_per_vp_stage": 1,
        }
        self.updater = None  # slime's distributed updater (support/slime_push.py), connected at the first push
        self.memory_clears = 0
        tok = Tokenizer()
        self.model = build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=0)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr or 1e-3)
        self.weight_version = 0
        self.probe = [tok.bos_id] + tok.encode("12+7-3=Answer:16")
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
    def async_train(self, rollout_id, data_refs):
        TRAIN_WINDOW["training"] = True  # until the push after it (a multi-turn tool may wait for that push)
        before = dict(self.forwards)
        self.last_trained = rollout_id
        ranks, fetched = self._fetch(data_refs)
        r3_log = {"routing_bytes": [0] * self.dp_size, "replayed_rows": [0] * self.dp_size, "agreement": []}
        metrics = self._train(ranks, r3_log)
        counts = {k: self.forwards[k] - before.get(k, 0) for k in self.forwards}
        self.trace.write(
            "train",
            rollout_id,
            forwards=counts,
            metrics=metrics,
            dp=fetched,
            **self._groups(ranks),
            **({"r3": r3_log} if self.r3 else {}),
        )
        if self.kill_after_train is not None and rollout_id == self.kill_after_train:
            self.trace.write("kill", rollout_id)
            os.kill(os.getpid(), signal.SIGKILL)
        done = concurrent.futures.Future()
        done.set_result(None)
        return done

    def _fetch(self, data_refs):
        """Each rank's ``process_rollout_data`` (slime's train-side fetch), and what it read."""
        from slime.utils.data import process_rollout_data

        ranks, fetched = [], []
        for rank in range(self.dp_size):
            first = len(self.store.fetches)
            with self.store.fetching_as(rank):
                data = process_rollout_data(self.args, data_refs, rank, self.dp_size)
            reads = self.store.fetches[first:]
            ranks.append(data)
            fetched.append(
                {
                    "rank": rank,
                    "objects": [f["key"] for f in reads],
                    "bytes": sum(f["bytes"] for f in reads),
                    "tensor_bytes": sum(f["tensor_bytes"] for f in reads),
                    "partition": [int(i) for i in data["partition"]],
                    "sample_indices": [int(i) for i in data["sample_indices"]],
                    "response_lengths": [int(n) for n in data["response_lengths"]],
                    "total_lengths": [int(n) for n in data["total_lengths"]],
                    "keys": sorted(data),
                }
            )
        return ranks, fetched

    def _groups(self, ranks) -> dict:
        """The trained groups in batch order (every rank's partition put back together), by the
        per-sample info the manager kept: pid and staleness per group, versions per sample."""
        by_position = {int(p): int(i) for data in ranks for p, i in zip(data["partition"], data["sample_indices"])}
        info = [self.manager.sample_info[by_position[p]] for p in sorted(by_position)]
        n = self.args.n_samples_per_prompt
        groups = [info[i : i + n] for i in range(0, len(info), n)]
        return {
            "pids": [g[0]["pid"] for g in groups],
            "staleness": [g[0]["staleness"] for g in groups],
            "weight_versions": [s["weight_versions"] for s in info],
            "split_positions": sorted(by_position),
            "mixed_groups": sum(len({s["pid"] for s in g}) > 1 for g in groups),
            **({"agent": [s["agent"] for s in info]} if any("agent" in s for s in info) else {}),
        }

    def clear_memory(self):
        self.memory_clears += 1

    def save_model(self, rollout_id, force_sync=False):
        if self.save_window is not None:
            self.save_window.saving("model", rollout_id)
        save = Path(self.args.save)
        save.mkdir(parents=True, exist_ok=True)
        torch.save(
            {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()},
            save / f"actor_{rollout_id}.pt",
        )
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
            self._hold_push_for_a_parked_tool_call()
            if self.updater is None:
                self.updater = make_updater(
                    self.args,
                    self.model,
                    [EngineActorStandIn(u) for u in self.engine_urls],
                    after_tensor=self._maybe_kill_in_push,
                )
            self.updater.weight_version = self.weight_version
            self.updater.update_weights()
            self.weight_version = self.updater.weight_version
            confirmed = self._confirm_push() if self.real_engines else None
            if self.real_engines:  # what the engines serve now, for the caller's final check
                self.last_pushed = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            self.trace.write("update_weights", self.weight_version, confirmed_gap=confirmed)
            TRAIN_WINDOW.update(training=False, pushes=TRAIN_WINDOW["pushes"] + 1)
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
        TRAIN_WINDOW.update(training=False, pushes=TRAIN_WINDOW["pushes"] + 1)

    def _hold_push_for_a_parked_tool_call(self) -> None:
        """With the slow agent tool (``TRAIN_WINDOW["hold_pushes"]``, support/slime_e2e_agent.py): the push
        after train r, when a later batch can still train what is in flight, waits (at most ``HOLD_PUSH_S``)
        until a trajectory in flight is inside a tool call, so that it lands between two of its turns.
        Batch r + 1 is already collected here (the push waited behind it): no parked call belongs to it."""
        last = self.last_trained
        if not TRAIN_WINDOW["hold_pushes"] or last is None or last + 2 >= self.args.num_rollout:
            return
        deadline = time.monotonic() + HOLD_PUSH_S
        while TRAIN_WINDOW["parked"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)

    def _maybe_kill_in_push(self, bucket: int, index: int, of: int) -> None:
        if self.kill_during_push is None or self.last_trained != self.kill_during_push:
            return
        if bucket == KILL_BUCKET and index == of // 2:  # the buckets before it loaded, half of it sent
            # the weights being pushed, for the caller's check of what the engine serves after the kill
            torch.save(self.model.state_dict(), Path(self.trace.path).parent / "torn_push_model.pt")
            self.trace.write(
                "kill_in_push",
                self.last_trained,
                bucket=bucket,
                tensors_sent=index + 1,
                of=of,
                weight_version=self.updater.weight_version,
            )
            os.kill(os.getpid(), signal.SIGKILL)

    def _confirm_push(self) -> float:
        """Each engine scores the probe as the pushed model does (``served_probe.confirm_push``),
        and reports the pushed version in ``/model_info``; the largest gap."""
        from support.served_probe import confirm_push, served_weight_version

        gaps = []
        for url in self.engine_urls:
            gaps.append(confirm_push(url, self.model, self.probe))
            served = served_weight_version(url)
            if served != str(self.weight_version):
                raise RuntimeError(f"{url} serves weight version {served}, pushed {self.weight_version}")
        return max(gaps)

    def stop_pushing(self) -> None:
        """Leave the engines' weight-update group (the real server keeps a group by name)."""
        if self.updater is not None:
            for engine in self.updater.rollout_engines:
                engine.destroy_weights_update_group.remote(group_name=self.updater._group_name).result(60)

    def _rollout_mismatch(self, ranks) -> dict:
        """mean |log pi_train - log mu_engine| per response token before the first step: the trainer's
        float32 forward against the log-probs the engine sampled with (its serving precision)."""
        gaps, masks = [], []
        with torch.no_grad():
            for data in ranks:
                rows = zip(data["tokens"], data["response_lengths"], data["rollout_log_probs"], data["loss_masks"])
                for ids, n, rollout, mask in rows:
                    n = int(n)
                    logits = self.model(input_ids=torch.as_tensor(ids)[None], use_cache=False).logits[0].double()
                    lp = torch.log_softmax(logits[-n - 1 : -1] / self.args.rollout_temperature, -1)
                    own = lp.gather(1, torch.as_tensor(ids)[-n:, None]).squeeze(1)
                    gaps.append((own - torch.as_tensor(rollout, dtype=torch.float64)).abs())
                    masks.append(torch.as_tensor(mask, dtype=torch.bool))
        every, model = torch.cat(gaps), torch.cat(masks)
        out = {"mean": float(every.mean()), "max": float(every.max()), "tokens": int(every.numel())}
        if not bool(model.all()):  # tool spans (loss mask 0, placeholder 0.0): the model's tokens alone
            out["model_tokens"] = {
                "mean": float(every[model].mean()),
                "max": float(every[model].max()),
                "tokens": int(model.sum()),
                "tool_tokens": int((~model).sum()),
            }
        return out

    # -- training
    def _logits(self, data, rows):
        """THD layout as slime's get_batch: all sequences concatenated, logits [1, sum T, V]."""
        chunks = []
        for i in rows:
            ids = torch.as_tensor(data["tokens"][i])[None]
            chunks.append(self.model(input_ids=ids, use_cache=False).logits[0])
        return torch.cat(chunks)[None]

    def _batch(self, data, rows):
        """What slime's get_batch hands loss_function for one micro-batch (CP 1)."""
        return {
            "unconcat_tokens": [data["tokens"][i] for i in rows],
            "total_lengths": [int(data["total_lengths"][i]) for i in rows],
            "response_lengths": [int(data["response_lengths"][i]) for i in rows],
            "loss_masks": [data["loss_masks"][i] for i in rows],
            "advantages": [data["advantages"][i] for i in rows],
            "rollout_log_probs": [data["rollout_log_probs"][i] for i in rows],
            "log_probs": [data["log_probs"][i] for i in rows] if "log_probs" in data else None,
            "rollout_mask_sums": data["rollout_mask_sums"][rows],
        }

    def _old_log_probs(self, data):
        """slime's compute_log_prob pass: the current policy's log-probs of every response."""
        out = []
        with torch.no_grad():
            for ids, n in zip(data["tokens"], data["response_lengths"]):
                n = int(n)
                logits = self.model(input_ids=ids[None], use_cache=False).logits[0].float()
                lp = torch.log_softmax(logits[-n - 1 : -1] / self.args.rollout_temperature, -1)
                out.append(lp.gather(1, ids[-n:, None]).squeeze(1))
        return out

    def _replay(self, data, rows, rank, log) -> None:
        """slime's fill_routing_replay for one micro-batch of ``rank`` (R3): what it fetched from
        the routing store, and at the first step (the rollout's own weights) whether the replayed
        rows are the trainer model's own routing."""
        from support import slime_e2e_r3 as r3

        before = r3.bytes_served()
        replayed = r3.replay(self.args, data, rows)
        log["routing_bytes"][rank] += r3.bytes_served() - before
        log["replayed_rows"][rank] += int(replayed.shape[0])
        if self.steps_done == 0 and self.start_rollout_id == 0:
            log["agreement"].append(r3.agreement(replayed, r3.own_routing(self.args, self.model, data, rows)))

    def _train(self, ranks, r3_log) -> dict:
        from slime.backends.megatron_utils.loss import compute_advantages_and_returns, loss_function

        args = self.args
        if self.steps_done == 0 and self.start_rollout_id == 0:  # the weights the first rollout sampled with
            self.trace.write("version0_mismatch", 0, **self._rollout_mismatch(ranks))
        if not args.use_rollout_logprobs or args.get_mismatch_metrics:
            for data in ranks:
                data["log_probs"] = self._old_log_probs(data)
            self.forwards["old_logprob"] += 1
        for data in ranks:
            compute_advantages_and_returns(args, data)
        num_microbatches, step_sizes = ranks[0]["num_microbatches"], ranks[0]["global_batch_sizes"]
        metrics, first = {}, 0
        for k, step_size in zip(num_microbatches, step_sizes):
            self.forwards["train"] += 1
            self.optimizer.zero_grad()
            logs = []
            for rank, data in enumerate(ranks):
                for rows in data["micro_batch_indices"][first : first + k]:
                    if self.r3:
                        self._replay(data, rows, rank, r3_log)
                    logits = self._logits(data, rows)
                    loss, _, log = loss_function(args, self._batch(data, rows), k, step_size, logits)
                    (loss / k).backward()
                    logs.append(log)
            first += k
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), args.clip_grad)
            self.optimizer.step()
            self.steps_done += 1
            values = torch.stack([log["values"][1:].float() for log in logs]).mean(0)
            metrics = dict(zip(logs[0]["keys"], [float(v) for v in values]))
        return metrics
