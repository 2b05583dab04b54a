"""End-to-end harness of the slime path on CPU (used by tests/slime_adapter/test_slime_e2e.py).

What is real: slime 624b824a's rollout side (data source, ``GenerateState``, ``generate_and_rm``,
its HTTP client with retries, its eval path, ``call_rollout_fn``, its rollout / eval logging with
the project's eval-record hook), slime's ``loss_function`` with the project's loss, the project's
rollout function, data source and the driver's training loop (a parameter: ``--loop``, default
``epic_slime.slime.train.async_training_loop``; any loop with its signature
``loop(args, rollout_manager, actor_model, num_rollout_per_epoch, get)`` runs here).

Stand-ins, at the real component's interface: SGLang (``tests/support/sglang_standin.py``, HTTP on
127.0.0.1, the tiny Qwen3-MoE), the RolloutManager Ray actor (``RolloutManagerStandIn``: one
call at a time on its own thread, ``.remote`` returns a future, slime's own pieces inside) and
the Megatron train group (``CpuTrainGroup``: the tiny model, slime's ``loss_function``, AdamW,
weight pushes as slime's distributed updater makes them: first ask the RolloutManager for the
engines, which queues the push behind its call in progress (so it lands only after
``generate(r + 1)`` returned, as on a cluster), then slime's own
``UpdateWeightFromDistributed.update_weights`` (``support/slime_push.py``: pause, flush in abort
mode, per bucket ``/update_weights_from_distributed`` with its ``weight_version`` and the tensors
broadcast over a gloo group, continue; the push-mode hook around it under ``--weight-push-mode
in_place``); an unserialised push from disk is kept as a stress case only). slime's argument parser needs SGLang and Megatron-LM's ``megatron.training`` (neither
installs on this CPU machine), so args are slime's own defaults, read from its
``slime/utils/arguments.py`` source, overlaid with the driver's flag layer (``driver_argv``) and
checked by ``validate_project_args``.

A session (``python tests/support/slime_e2e_harness.py session CONFIG.json``) runs one driver process
and writes a JSONL trace (one line per event, flushed, so a killed session leaves its trace).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
SLIME_SNAPSHOT = REPO.parent / "shared" / "vendor" / "slime-624b824a"


def slime_path() -> str | None:
    env = os.environ.get("SLIME_PATH")
    if env:
        return env
    return str(SLIME_SNAPSHOT) if (SLIME_SNAPSHOT / "slime").is_dir() else None


# ---------------------------------------------------------------- data and tokenizer

def write_tokenizer(out_dir: str) -> str:
    """An HF tokenizer folder for the runtime's 19-token vocabulary (slime loads it with AutoTokenizer)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from epic_slime.runtime.task import BOS, EOS, PAD, VOCAB

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("Answer:|<bos>|<eos>|<pad>|."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)
    fast.save_pretrained(out_dir)
    return out_dir


def write_prompts(path: str, count: int, seed: int, first_pid: int = 0) -> None:
    """Synthetic-task prompts as slime reads them (--input-key prompt --label-key label
    --metadata-key metadata); metadata.pid identifies a prompt across runs."""
    from epic_slime.runtime.task import BOS, TaskConfig
    from epic_slime.runtime.tasks import train_problem

    with open(path, "w") as f:
        for i in range(count):
            p = train_problem(first_pid + i, seed, TaskConfig())
            f.write(json.dumps({"prompt": BOS + p.prompt, "label": str(p.answer), "metadata": {"pid": first_pid + i}}) + "\n")


async def reward(args, sample) -> float:
    """``--custom-rm-path``: 1 when the response emits the ``Answer:`` token (about half of the
    untrained model's samples do, so GRPO advantages are non-zero), plus 1 for the right answer."""
    text = sample.response or ""
    if "Answer:" not in text:
        return 0.0
    answer = text.split("Answer:")[-1].replace("<eos>", "")
    return 1.0 + float(answer == str(sample.label))


# ---------------------------------------------------------------- args

_TYPES = {"int": int, "float": float, "str": str}


def slime_argument_parser() -> argparse.ArgumentParser:
    """slime's own arguments (names, types, defaults, actions), read from its source: importing
    ``slime.utils.arguments`` needs SGLang. Arguments whose default is not a literal get None."""
    root = Path(slime_path()) / "slime"
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    nodes = [n for src in (root / "utils" / "arguments.py", root / "backends" / "sglang_utils" / "arguments.py")
             for n in ast.walk(ast.parse(src.read_text()))]
    for node in nodes:
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"):
            continue
        opts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not opts or not opts[0].startswith("--"):
            continue
        kw = {}
        for k in node.keywords:
            if k.arg in ("default", "nargs", "choices", "action", "dest", "const"):
                try:
                    kw[k.arg] = ast.literal_eval(k.value)
                except ValueError:
                    kw[k.arg] = None
            elif k.arg == "type":
                kw["type"] = _TYPES.get(getattr(k.value, "id", ""), str)
        if kw.get("action") not in (None, "store_true", "store_false", "append", "store_const"):
            kw.pop("action")
        try:
            parser.add_argument(*opts, **kw)
        except (argparse.ArgumentError, TypeError, ValueError):
            pass   # a few flags are registered twice (reset_arg) or need a non-literal type
    return parser


def megatron_arguments(parser: argparse.ArgumentParser) -> None:
    """The Megatron flags this harness reads (Megatron-LM's parser is not installable here),
    with Megatron's defaults."""
    group = parser.add_argument_group("megatron (stand-in)")
    for name, kw in {
        "--seed": dict(type=int, default=1234),
        "--save": dict(default=None),
        "--load": dict(default=None),
        "--save-interval": dict(type=int, default=None),
        "--eval-interval": dict(type=int, default=None),
        "--lr": dict(type=float, default=None),
        "--clip-grad": dict(type=float, default=1.0),
        # slime registers it with reset_arg, which the source reader above skips
        "--custom-config-path": dict(type=str, default=None),
        "--micro-batch-size": dict(type=int, default=None),
        "--calculate-per-token-loss": dict(action="store_true"),
        # SGLang's ServerArgs (slime prefixes them with --sglang-): dp_size defaults to 1
        "--sglang-dp-size": dict(type=int, default=1),
    }.items():
        try:
            group.add_argument(name, **kw)
        except argparse.ArgumentError:
            pass


def build_args(argv: list[str]) -> argparse.Namespace:
    from slime.utils.eval_config import build_eval_dataset_configs

    from epic_slime.slime.checks import validate_project_args
    from epic_slime.slime.command_line import driver_argv
    from epic_slime.slime.flags import add_project_arguments

    parser = slime_argument_parser()
    add_project_arguments(parser)
    megatron_arguments(parser)
    args = parser.parse_args(driver_argv(argv))
    if args.custom_config_path:   # as slime's parse_args: the YAML's top-level keys onto args
        import yaml

        with open(args.custom_config_path) as f:
            for key, value in (yaml.safe_load(f) or {}).items():
                setattr(args, key, value)
    # what slime's / Megatron's validation derives and the rollout side reads
    args.global_batch_size = args.rollout_batch_size * args.n_samples_per_prompt // (args.num_steps_per_rollout or 1)
    args.start_rollout_id = None
    args.rank, args.world_size = 0, 1
    values = list(args.eval_prompt_data or [])
    args.eval_datasets = build_eval_dataset_configs(
        args, [{"name": values[i], "path": values[i + 1]} for i in range(0, len(values), 2)], {}
    )
    args.kl_coef = getattr(args, "kl_coef", 0.0) or 0.0
    if args.eval_function_path is None:
        args.eval_function_path = args.rollout_function_path
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    validate_project_args(args)
    return args


# ---------------------------------------------------------------- RolloutManager stand-in

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


# ---------------------------------------------------------------- Megatron train group stand-in

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


# ---------------------------------------------------------------- trace, server, session

ROLLOUT_MAX_RESPONSE_LEN = 24
HOLD_MAX_SECONDS = 3.0   # a held request of the batch being collected decodes after this long
EVAL_MAX_RESPONSE_LEN = 10   # differs from the rollout's, so the stand-in's hold never takes an eval request
# the response-length spread: about one prompt in 3 must answer with at least 20 tokens (most
# untrained answers stop within a few): those groups are overtaken by the others
LONG_EVERY, LONG_MIN_NEW_TOKENS = 3, 20
# oversampling on: 3 groups in flight for a batch of 2
GROUPS_IN_FLIGHT = 3

PUSH_MODES = ("distributed", "disk-unserialised")


def _session():
    import requests

    s = requests.Session()
    s.trust_env = False
    return s


class SaveWindowKill:
    """SIGKILL between the two saves of a checkpoint (data state and model, in whichever order the
    driver makes them): the second save of rollout ``rollout_id`` never starts."""

    def __init__(self, rollout_id: int | None, trace):
        self.rollout_id, self.trace, self.done = rollout_id, trace, []

    def saving(self, what: str, rollout_id: int) -> None:
        if rollout_id != self.rollout_id:
            return
        if self.done:
            self.trace.write("kill", rollout_id, saved=self.done, next_save=what)
            os.kill(os.getpid(), signal.SIGKILL)
        self.done.append(what)


class _CountingHandler(logging.Handler):
    """Counts slime's HTTP retries and crashed group tasks (they only show in its logs)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.counts = Counter()

    def emit(self, record):
        msg = record.getMessage()
        if "retrying" in msg:
            self.counts["http_retries"] += 1
        if "process task raised" in msg:   # slime's worker: a group task crashed, its group is gone
            self.counts["crashed_group_tasks"] += 1
        if record.name == "epic_slime.slime.train" and "perf/driver_rss_mb" in msg:
            self.counts["driver_rss_logs"] += 1
        if "bound to a different event loop" in msg or (record.exc_text and "different event loop" in record.exc_text):
            self.counts["different_loop_errors"] += 1



class Trace:
    def __init__(self, path: str, counter: _CountingHandler | None = None):
        self._f = open(path, "a")
        self._lock = threading.Lock()
        self.counter = counter

    def write(self, event: str, rollout_id: int, **fields) -> None:
        if self.counter is not None:
            fields["log_counts"] = dict(self.counter.counts)
        with self._lock:
            self._f.write(json.dumps({"event": event, "rollout_id": rollout_id, "t": time.time(), **fields}, default=float) + "\n")
            self._f.flush()


def read_trace(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class Server:
    """The SGLang stand-in in its own process, stopped by its pid."""

    def __init__(self, workdir: str, weights: str | None = None, hold_max_new_tokens: int | None = None,
                 long_every: int | None = LONG_EVERY, long_min_new_tokens: int = LONG_MIN_NEW_TOKENS,
                 extra_args: list[str] = ()):
        port_file = os.path.join(workdir, "standin.port")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, str(TESTS / "support" / "sglang_standin.py"), "--port-file", port_file]
        if weights:
            cmd += ["--weights", weights]
        if hold_max_new_tokens is not None:
            # the batch is taken in start order: if it waits for the held request, no pause comes
            cmd += ["--hold-max-new-tokens", str(hold_max_new_tokens), "--hold-max-seconds", str(HOLD_MAX_SECONDS)]
        if long_every is not None:   # training requests only (their response cap tells them from eval ones)
            cmd += ["--long-every", str(long_every), "--long-min-new-tokens", str(long_min_new_tokens),
                    "--long-max-new-tokens", str(ROLLOUT_MAX_RESPONSE_LEN)]
        cmd += list(extra_args)
        self.log = open(os.path.join(workdir, "standin.log"), "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"SGLang stand-in did not start; see {self.log.name}")
            time.sleep(0.1)
        self.port = int(Path(port_file).read_text())
        self.url = f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict:
        return _session().get(f"{self.url}/stats", timeout=10).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def init_weights(path: str) -> str:
    from epic_slime.runtime.model import ModelConfig, build_policy
    from epic_slime.runtime.task import Tokenizer

    tok = Tokenizer()
    torch.save(build_policy(ModelConfig(), tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id, seed=0).state_dict(), path)
    return path


def session(config: dict) -> None:
    """One driver process: the loop under test against the stand-ins; writes config['trace']."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from slime.utils.misc import load_function

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO)
    counter = _CountingHandler()
    logging.getLogger().addHandler(counter)
    trace = Trace(config["trace"], counter)
    args = build_args(config["argv"] + ["--sglang-router-ip", "127.0.0.1", "--sglang-router-port", str(config["port"])])
    dist.init_process_group("gloo", init_method=f"file://{config['dist_file']}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    from slime.utils.distributed_utils import set_gloo_group
    from support.slime_push import use_ray_stand_in

    from epic_slime.slime.push_mode import install_push_hook

    set_gloo_group(dist.group.WORLD)   # slime's updater barriers on it
    use_ray_stand_in()
    install_push_hook(args)   # slime runs --custom-megatron-init-path on each train rank (its R3 half needs CUDA)
    manager = RolloutManagerStandIn(args, trace)
    window = SaveWindowKill(config.get("kill_between_saves"), trace)
    manager.save_window = window
    actor = CpuTrainGroup(args, f"http://127.0.0.1:{config['port']}", trace, config.get("kill_after_train"),
                          manager=manager, push=config.get("push", "distributed"), save_window=window)
    # slime's create_training_models: the checkpoint sets the start rollout, then the data source loads
    args.start_rollout_id = actor.start_rollout_id
    if args.rollout_global_dataset:
        manager.load.remote(args.start_rollout_id - 1).result()
    num_rollout_per_epoch = len(manager.data_source) // args.rollout_batch_size
    actor.update_weights()
    # the driver's own choice of schedule (--max-staleness 0: synchronous) unless a test names a loop
    from epic_slime.slime.train import training_loop_for

    loop = load_function(config["loop"]) if config.get("loop") else training_loop_for(args)
    started = time.time()
    loop(args, manager, actor, num_rollout_per_epoch, lambda fut: fut.result(timeout=300))
    source = manager.data_source
    consumed = getattr(getattr(source, "inner", source), "sample_group_index", None)
    ledger = getattr(source, "ledger", None)
    pending = [int(g[0].metadata["pid"]) for g in ledger.pending_payloads()] if ledger is not None else None
    trace.write("done", args.num_rollout, seconds=time.time() - started, forwards=dict(actor.forwards),
                prompts_consumed=consumed, pending_pids=pending, memory_clears=actor.memory_clears)
    manager.dispose.remote().result()
    manager.shutdown()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    os._exit(0)   # slime's event-loop thread and HTTP client are daemons: nothing to wait for


def run_session(config: dict, timeout: float = 300) -> int:
    """Run ``session`` in a child process (a kill ends only that child); returns its exit code."""
    workdir = os.path.dirname(config["trace"])
    path = os.path.join(workdir, f"session_{os.path.basename(config['trace'])}.json")
    with open(path, "w") as f:
        json.dump(config, f)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), str(TESTS), slime_path(), env.get("PYTHONPATH", "")] if p)
    with open(config["trace"] + ".log", "w") as log:
        proc = subprocess.Popen([sys.executable, str(TESTS / "support" / "slime_e2e_harness.py"), "session", path],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise




def standard_argv(workdir: str, *, num_rollout: int, save_interval: int | None, load: str | None = None,
                  extra: list[str] = (), max_staleness: int = 2) -> list[str]:
    """The issue's scale: 12 permits (--sglang-server-concurrency 12, one engine), 2 groups x 4
    samples = 8 training samples in flight, 10 eval prompts x 4 = 40 eval samples every rollout."""
    argv = [
        "--hf-checkpoint", os.path.join(workdir, "tokenizer"),
        "--prompt-data", os.path.join(workdir, "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--metadata-key", "metadata",
        "--eval-prompt-data", "synthetic", os.path.join(workdir, "eval.jsonl"),
        "--n-samples-per-eval-prompt", "4", "--eval-max-response-len", str(EVAL_MAX_RESPONSE_LEN), "--eval-interval", "1",
        "--eval-temperature", "1.0",
        "--custom-rm-path", "support.slime_e2e_harness.reward",
        "--custom-eval-rollout-log-function-path", "epic_slime.slime.eval_hooks.log_eval_rollout",
        "--rollout-function-path", "epic_slime.slime.rollout.generate_rollout",
        "--loss-type", "custom_loss", "--custom-loss-function-path", "epic_slime.slime.loss.policy_loss",
        "--policy-loss", "epic", "--update-depth", "2",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
        "--rollout-max-response-len", str(ROLLOUT_MAX_RESPONSE_LEN), "--rollout-temperature", "1.0",
        "--rollout-num-gpus", "1", "--rollout-num-gpus-per-engine", "1", "--sglang-server-concurrency", "12",
        "--max-staleness", str(max_staleness), "--num-rollout", str(num_rollout), "--lr", "1e-3",
        "--save", os.path.join(workdir, "ckpt"),
        "--custom-config-path", os.path.join(workdir, "epic_run.yaml"),   # eval records (eval_hooks)
    ]
    if max_staleness != 0:   # the background stream's depth; the synchronous schedule has none
        # oversampling needs K >= 2 (K = 1 trains only groups that finish in the rollout they start in)
        argv += ["--async-groups-in-flight", str(GROUPS_IN_FLIGHT if max_staleness != 1 else 2)]
    if save_interval is not None:
        argv += ["--save-interval", str(save_interval)]
    if load is not None:
        argv += ["--load", load]
    return argv + list(extra)


def prepare_workdir(workdir: str, train_prompts: int = 200, eval_prompts: int = 10) -> None:
    write_tokenizer(os.path.join(workdir, "tokenizer"))
    write_prompts(os.path.join(workdir, "train.jsonl"), train_prompts, seed=1)
    write_prompts(os.path.join(workdir, "eval.jsonl"), eval_prompts, seed=2, first_pid=10_000)
    init_weights(os.path.join(workdir, "init.pt"))
    from support.eval_helpers import run_config_yaml

    run_config_yaml(os.path.join(workdir, "epic_run.yaml"), os.path.join(workdir, "eval_records.jsonl"), run_name="e2e")


def decile_report(events: list[dict]) -> dict:
    """The run's groups by response-length decile (issue 26 item 3), from the last generate event's
    ``rollout/staleness/run_deciles/*`` metrics (``epic_slime.length_deciles``): rows and a table."""
    last = [e["metrics"] for e in events if e["event"] == "generate"][-1]
    prefix = "rollout/staleness/run_deciles/"
    rows = []
    for d in range(10):
        base = f"{prefix}d{d}/"
        if base + "groups" not in last:
            continue
        rows.append({"decile": d, "groups": int(last[base + "groups"]), "mean_staleness": last.get(base + "mean_staleness"),
                     "min_length": last[base + "min_length"], "max_length": last[base + "max_length"],
                     **{o: int(last[base + o]) for o in ("trained", "over_k", "dropped", "requeued")}})
    table = "\n".join(f"d{r['decile']} len {r['min_length']:.0f}-{r['max_length']:.0f}: {r['groups']} groups, "
                      f"{r['trained']} trained, {r['over_k']} over K, {r['dropped']} dropped, {r['requeued']} requeued, "
                      f"mean staleness {r['mean_staleness']}" for r in rows)
    return {"rows": rows, "table": table}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "session":
        with open(argv[1]) as f:
            session(json.load(f))
        return 0
    # standalone measurement: MAX_STALENESS=K PYTHONPATH=tests python tests/support/slime_e2e_harness.py measure [extra driver flags...]
    # (12 rollouts, serialised pushes, oversampling and the length spread of the e2e; prints the
    # staleness histogram of the trained groups and the drop / requeue counts)
    if argv and argv[0] == "measure":
        workdir = tempfile.mkdtemp(prefix="slime_e2e_")
        prepare_workdir(workdir)
        server = Server(workdir, os.path.join(workdir, "init.pt"))
        try:
            trace = os.path.join(workdir, "measure.jsonl")
            rc = run_session({"trace": trace, "port": server.port, "dist_file": os.path.join(workdir, "dist"),
                              "argv": standard_argv(workdir, num_rollout=12, save_interval=None, extra=argv[1:],
                                                    max_staleness=int(os.environ.get("MAX_STALENESS", "2")))})
            events = read_trace(trace)
            trained = sum(len(e["pids"]) for e in events if e["event"] == "train")
            done = [e for e in events if e["event"] == "done"]
            staleness = Counter(s for e in events if e["event"] == "train" for s in e["staleness"])
            last = [e["metrics"] for e in events if e["event"] == "generate"][-1]
            print(json.dumps({"rc": rc, "trained_groups": trained, "staleness_histogram": dict(sorted(staleness.items())),
                              "consumed_groups": last["rollout/accounting/consumed_groups"],
                              "dropped_groups": last["rollout/staleness/total_dropped_groups"],
                              "requeued_groups": last.get("rollout/staleness/total_requeued_groups"),
                              "abort_resubmits": last["rollout/accounting/abort_resubmits"],
                              "length_deciles": decile_report(events)["rows"],
                              "done": done[-1] if done else None, "server": server.stats(), "workdir": workdir}, indent=1))
        finally:
            server.stop()
        return 0
    raise SystemExit("usage: slime_e2e_harness.py session CONFIG.json | measure [flags]")


if __name__ == "__main__":
    sys.exit(main())
