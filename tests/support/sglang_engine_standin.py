"""A stand-in for the ``sglang`` module with ``sglang.Engine``'s interface at sglang 0.5.15.post1
(``sglang/srt/entrypoints/engine.py``): ``Engine(**kwargs)`` where kwargs are ``ServerArgs`` fields,
``generate(prompt=..., sampling_params=..., ...)`` returning a dict per prompt (a list for a batch)
with ``"text"`` and ``"meta_info"``, and ``shutdown()``. Unknown server-args or sampling-param names
fail as they do in SGLang (``ServerArgs`` / ``SamplingParams`` are keyword-only structs). Text comes
from a ``respond(prompt, request_index)`` callable the test sets; every call is recorded.
"""

from __future__ import annotations

import types

# a subset of ServerArgs' fields (server_args.py at 0.5.15.post1); anything else is a TypeError
SERVER_ARGS = {
    "model_path",
    "tokenizer_path",
    "skip_tokenizer_init",
    "trust_remote_code",
    "context_length",
    "dtype",
    "mem_fraction_static",
    "tp_size",
    "dp_size",
    "random_seed",
    "log_level",
    "device",
    "attention_backend",
    "sampling_backend",
    "disable_overlap_schedule",
    "cuda_graph_backend_decode",
    "cuda_graph_backend_prefill",
    "max_total_tokens",
}
# SamplingParams' user fields (sampling/sampling_params.py at 0.5.15.post1)
SAMPLING_PARAMS = {
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "custom_params",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
}


def make_sglang_module(respond):
    module = types.ModuleType("sglang")
    module.engines = []

    class Engine:
        def __init__(self, **kwargs):
            unknown = sorted(set(kwargs) - SERVER_ARGS)
            if unknown:
                raise TypeError(f"ServerArgs.__init__() got an unexpected keyword argument {unknown[0]!r}")
            if "model_path" not in kwargs:
                raise TypeError("ServerArgs.__init__() missing 1 required keyword-only argument: 'model_path'")
            self.server_args = kwargs
            self.calls = []
            self.shut_down = False
            self.requests_served = 0
            module.engines.append(self)

        def generate(
            self,
            prompt=None,
            sampling_params=None,
            input_ids=None,
            image_data=None,
            audio_data=None,
            video_data=None,
            mm_hashes=None,
            return_logprob=False,
            logprob_start_len=None,
            top_logprobs_num=None,
            token_ids_logprob=None,
            lora_path=None,
            custom_logit_processor=None,
            require_reasoning=False,
            return_hidden_states=False,
            return_routed_experts=False,
            routed_experts_start_len=0,
            stream=False,
            bootstrap_host=None,
            bootstrap_port=None,
            bootstrap_room=None,
            routed_dp_rank=None,
            disagg_prefill_dp_rank=None,
            data_parallel_rank=None,
            external_trace_header=None,
            rid=None,
            session_params=None,
            priority=None,
            session_id=None,
        ):
            if self.shut_down:
                raise RuntimeError("engine was shut down")
            if (prompt is None) == (input_ids is None):
                raise ValueError("Either text or input_ids should be provided.")
            batch = isinstance(prompt, list)
            prompts = prompt if batch else [prompt]
            params = sampling_params if isinstance(sampling_params, list) else [sampling_params or {}] * len(prompts)
            if len(params) != len(prompts):
                raise ValueError("The number of sampling_params must match the number of prompts")
            for p in params:
                unknown = sorted(set(p) - SAMPLING_PARAMS)
                if unknown:
                    raise TypeError(f"SamplingParams got an unexpected keyword argument {unknown[0]!r}")
            self.calls.append({"prompt": list(prompts), "sampling_params": [dict(p) for p in params]})
            out = []
            for text in prompts:
                reply = respond(text, self.requests_served)
                self.requests_served += 1
                out.append(
                    {
                        "text": reply,
                        "meta_info": {
                            "id": str(self.requests_served),
                            "finish_reason": {"type": "stop"},
                            "prompt_tokens": len(text.split()),
                            "completion_tokens": len(str(reply).split()),
                        },
                    }
                )
            return out if batch else out[0]

        def shutdown(self):
            self.shut_down = True

    module.Engine = Engine
    return module
