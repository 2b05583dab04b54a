"""A loopback SGLang stand-in: SGLang 0.5.15.post1's HTTP interface as slime 624b824a calls it,
backed by the embedded runtime's tiny Qwen3-MoE on CPU (so behaviour log-probs are real). Paths
cited below are under ``sglang/srt``.

Checked against the real server, test by test, by tests/slime_adapter/test_sglang_conformance*.py.

Endpoints: ``POST /generate`` (``input_ids``, ``sampling_params`` with temperature / top_p /
max_new_tokens / stop_token_ids / ignore_eos, ``return_logprob``, ``extra_key``; answers ``text``,
``output_ids`` and ``meta_info`` with ``output_token_logprobs`` ``[[logprob, token, None], ...]``,
``finish_reason`` as SGLang's dicts (``{"type": "length", "length": n}``, ``{"type": "stop",
"matched": token}``, ``{"type": "abort", "message": "Aborted", "status_code": None, "err_type":
None}``), ``weight_version``,
``cached_tokens``, token counts; with ``return_routed_experts`` also ``routed_experts``, see
``sglang_standin_routing.py``), ``POST /pause_generation`` and ``/continue_generation`` (the
three modes below), ``GET|POST /flush_cache``, ``POST /update_weights_from_disk``
(``model_path``: a Hugging Face folder; also a torch state dict), ``POST /update_weights_from_tensor``
(see ``sglang_standin_weights.py``), slime's distributed push (``POST
/init_weights_update_group`` joins a gloo group with the trainer's rank 0 from
``master_address`` / ``master_port`` / ``rank_offset`` / ``world_size``; ``POST
/update_weights_from_distributed`` receives one bucket: ``names`` / ``dtypes`` / ``shapes`` as
metadata, the tensors by broadcast from rank 0, then ``weight_version`` when given, as SGLang does
per bucket; ``POST /destroy_weights_update_group``), ``POST /update_weight_version``
(``new_version``; aborts every request first unless ``abort_all_requests`` is false),
``POST /abort_request`` (``abort_all``), ``GET /v1/loads`` (``{"loads": [{"num_running_reqs", "num_waiting_reqs", ...}]}``),
``GET /model_info`` (``weight_version``; ``/get_weight_version`` is 404, as in 0.5.15), ``GET
/health_generate``, ``GET /workers`` (router view), ``GET /stats`` (counters for tests: the real
server has no such endpoint). The output head is a weight of its own, as in SGLang's Qwen3-MoE.

Pause modes (``PauseGenerationReqInput.mode``, default abort; requests that arrive while paused
wait before the scheduler, as in ``TokenizerManager.generate_request``'s ``is_pause_cond``):

- ``abort`` (``TokenizerManager.pause_generation``): every request ends now with finish_reason
  abort, the running ones with the tokens generated so far (after the step in progress), waiting
  ones with none; with requests in flight the pause answers after ``--abort-poll-seconds``
  (default 1: SGLang sees them gone only at its next once-a-second check), idle at once;
- ``retract`` (``Scheduler.pause_generation``): running requests go back to the waiting queue with
  their tokens and are prefilled again (prompt + output) after ``/continue_generation``;
- ``in_place``: nothing moves; after ``/continue_generation`` the running requests decode on with
  whatever weights were loaded meanwhile, over the KV the old weights computed (the stand-in
  keeps a copy of those weights and recomputes through them: ``sglang_standin_weights.py``).

``/flush_cache`` succeeds only with no running and no waiting request (``Scheduler.flush_cache``
needs ``is_fully_idle``): else 400 "Flush cache failed." (``http_server.flush_cache``); with
``?timeout=s`` it waits up to s for idle (``scheduler_components/flush_wrapper.py``). A weight
update's ``flush_cache`` (default true, as ``UpdateWeightsFromDistributedReqInput`` /
``UpdateWeightFromDiskReqInput``) flushes after the load; when that flush fails SGLang's scheduler
asserts (``SchedulerWeightUpdater.flush_cache_after_weight_update``) and the server dies: the
stand-in answers 500 and exits (code 3). ``meta_info.weight_version`` is read when the answer is
built (``TokenizerManager._handle_batch_output``): a request that spans an update reports the new one.

Prefix cache: a radix tree per ``extra_key`` (``RadixCache.match_prefix`` keeps keys disjoint),
written at prefill (the prompt) and at finish (prompt + output), each prefix keeping the weights
it was first computed with; a request reuses its longest cached prefix (``cached_tokens``, at most
all but its last input token); ``flush_cache`` empties it. ``/stats`` counts reuse of KV computed
under older weights than the request's submission saw (``stale_prefix_hits`` / ``_tokens``): for a
request without ``extra_key``, older than the weights when it arrived; with one, older than when
its key first arrived (its own group's requests are submitted together). No eviction (tests are small).

Batching: continuous, as SGLang's scheduler, across sampling settings: each decode step advances
every running request by one token with its own temperature and top_p (up to ``max_batch``; a
request joins at the next step and leaves when it finishes), so a short request started after a
long one finishes first and an evaluation never waits for training requests to drain.
log-prob convention: log_softmax(logits / T)[token], over the logits the token was drawn from.

Response-length spread (``--long-every N --long-min-new-tokens M --long-max-new-tokens L``): a
training request (max_new_tokens plus the response tokens already in input_ids equals L, the
rollout's response cap; evaluation requests have another cap and are never long) whose prompt's
crc32 (prompt = the tokens up to its first "=") is divisible by N cannot stop (end-of-sequence
and stop tokens are masked, like SGLang's ``min_new_tokens``) before its response has M tokens,
counting the partial response of a resubmitted request.

A slower engine on demand (``--step-seconds S``: S seconds after each decode step), so a test can
pause one mid-decode. A slow request on demand (``--hold-max-new-tokens N``): after each ``/continue_generation`` (and at
start) the first request with ``max_new_tokens == N`` and a prompt never seen before is held, not
decoded, until the next pause: abort ends it, retract and in_place release it (it then decodes on
the new weights): a request still running when the weights arrive, as on a busy cluster, whatever
this CPU's speed. ``--hold-max-seconds S`` releases it after S seconds if no pause came (a batch
taken in start order may wait for it, and the next push waits for that batch). Resubmissions (a prompt seen before) and other requests are never held.

Run: ``python tests/support/sglang_standin.py --port-file F --weights W`` (binds 127.0.0.1 on a free
port, writes it to F).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import torch

# run as a script: this folder is sys.path[0]
from sglang_standin_engine import FLUSH_FAILED, FLUSH_OK, Engine, build_model
from sglang_standin_weights import ServerDies


def make_app(engine: Engine):
    from aiohttp import web

    def dying(message: str):
        """SGLang's scheduler asserted: the server goes away (the stand-in exits after answering)."""
        asyncio.get_running_loop().call_later(0.2, os._exit, 3)
        return web.json_response({"success": False, "message": message}, status=500)

    async def generate(request):
        payload = await request.json()
        try:
            return web.json_response(await engine.generate(payload))
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)

    async def pause(request):
        payload = await request.json() if request.can_read_body else {}
        try:
            await engine.pause((payload or {}).get("mode", "abort"))
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def resume(request):
        engine.resume()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def flush(request):
        ok = await engine.flush(float(request.query.get("timeout", 0.0)))
        return web.Response(text=FLUSH_OK) if ok else web.Response(status=400, text=FLUSH_FAILED)

    def weight_update_route(load):
        """An update_weights_from_* call: abort first if asked, load, then the update's own flush
        and weight_version; 400 with the reason for a bad request."""

        async def route(request):
            payload = await request.json()
            if payload.get("abort_all_requests"):
                await engine.abort_all(counter="update_aborts")
            try:
                engine.keep_running_kv()
                await load(payload)
                engine.after_update(payload)
            except ValueError as exc:
                return web.json_response({"success": False, "message": str(exc)}, status=400)
            except (AssertionError, ServerDies) as exc:
                return dying(str(exc))
            return web.json_response({"success": True, "message": "Succeeded to update model weights."})

        return route

    async def init_group(request):
        try:
            await engine.join_update_group(await request.json())
        except ValueError as exc:
            return web.json_response({"success": False, "message": str(exc)}, status=400)
        return web.json_response({"success": True, "message": "ok"})

    async def destroy_group(request):
        payload = await request.json()
        group = engine.groups.pop(payload["group_name"], None)
        if group is None:  # SGLang refuses a name with no group (never made, or destroyed already)
            return web.json_response(
                {"success": False, "message": "The group to be destroyed does not exist."}, status=400
            )
        import torch.distributed as dist

        dist.destroy_process_group(group)  # its name can be joined again, as in SGLang
        return web.json_response({"success": True, "message": "ok"})

    async def update_version(request):
        payload = await request.json()
        engine.version = str(payload["new_version"])
        if payload.get("abort_all_requests", True):  # SGLang's abort is fire-and-forget: the aborted
            await engine.abort_all(counter="version_update_aborts")  # answers come back under the new version
        engine.stats["version_updates"] += 1
        return web.json_response(
            {"success": True, "message": f"Weight version updated to {engine.version}", "new_version": engine.version}
        )

    async def model_info(request):
        return web.json_response(
            {
                "model_path": "tiny-qwen3-moe-standin",
                "is_generation": True,
                "weight_version": engine.version,
                "model_type": "qwen3_moe",
                "architectures": ["Qwen3MoeForCausalLM"],
            }
        )

    async def health(request):
        return web.Response(text="ok")

    async def abort_request(request):
        payload = await request.json()
        if not payload.get("abort_all"):
            return web.json_response({"error": "the stand-in aborts only with abort_all"}, status=400)
        await engine.abort_all()
        return web.Response(text="ok")

    async def loads(request):
        return web.json_response(engine.load())

    async def workers(request):
        host = request.host
        return web.json_response({"workers": [{"url": f"http://{host}"}]})

    async def stats(request):
        return web.json_response({**engine.stats, "version": engine.version, "paused": engine.paused})

    app = web.Application(client_max_size=64 * 2**20)
    app.add_routes(
        [
            web.post("/generate", generate),
            web.post("/pause_generation", pause),
            web.post("/continue_generation", resume),
            web.get("/flush_cache", flush),
            web.post("/flush_cache", flush),
            web.post("/update_weights_from_disk", weight_update_route(engine.load_weights)),
            web.post("/update_weight_version", update_version),
            web.post("/update_weights_from_tensor", weight_update_route(engine.load_tensors)),
            web.get("/model_info", model_info),
            web.post("/init_weights_update_group", init_group),
            web.post("/update_weights_from_distributed", weight_update_route(engine.receive_bucket)),
            web.post("/destroy_weights_update_group", destroy_group),
            web.post("/abort_request", abort_request),
            web.get("/v1/loads", loads),
            web.get("/health_generate", health),
            web.get("/health", health),
            web.get("/workers", workers),
            web.get("/stats", stats),
        ]
    )
    return app


async def _serve(port_file: str, weights: str | None, engine_kwargs: dict) -> None:
    from aiohttp import web

    torch.set_num_threads(1)
    model, tok = build_model(weights)
    engine = Engine(model, tok, **engine_kwargs)
    runner = web.AppRunner(make_app(engine), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, port_file)
    await engine.scheduler()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--weights", default=None)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument(
        "--hold-max-new-tokens",
        type=int,
        default=None,
        help="hold one new training request per weight version until the next pause (see above)",
    )
    parser.add_argument(
        "--hold-max-seconds",
        type=float,
        default=None,
        help="release a held request after this long when no pause met it (default: never)",
    )
    parser.add_argument(
        "--long-every",
        type=int,
        default=None,
        help="one training prompt in about N (by crc32) gets --long-min-new-tokens (see above)",
    )
    parser.add_argument("--long-min-new-tokens", type=int, default=0)
    parser.add_argument(
        "--abort-poll-seconds",
        type=float,
        default=1.0,
        help="an abort pause that met requests answers after this long (SGLang polls once a second)",
    )
    parser.add_argument("--step-seconds", type=float, default=0.0, help="wait this long after each decode step")
    parser.add_argument(
        "--long-max-new-tokens",
        type=int,
        default=None,
        help="the training requests' response cap (max_new_tokens + response already in input_ids): "
        "only they can be long; needed with --long-every",
    )
    args = parser.parse_args(argv)
    if args.long_every is not None:
        if args.long_every < 1:
            parser.error(f"--long-every must be >= 1, got {args.long_every}")
        if args.long_max_new_tokens is None:
            parser.error(
                "--long-every needs --long-max-new-tokens (how training requests are told from evaluation ones)"
            )
    engine_kwargs = dict(
        max_batch=args.max_batch,
        hold_max_new_tokens=args.hold_max_new_tokens,
        long_every=args.long_every,
        long_min_new_tokens=args.long_min_new_tokens,
        long_max_new_tokens=args.long_max_new_tokens,
        step_seconds=args.step_seconds,
        hold_max_seconds=args.hold_max_seconds,
        abort_poll_seconds=args.abort_poll_seconds,
    )
    asyncio.run(_serve(args.port_file, args.weights, engine_kwargs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
