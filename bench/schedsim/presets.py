"""The simulator's inputs. Each default says where it comes from; "assumed" marks a number with no
published source. ``PRESETS`` names the cluster-scale ones; ``runtime_preset`` is built from a measurement."""

from __future__ import annotations

import dataclasses

PAPER_ROLLOUTS = 300  # paper Table 2 "training steps 300"; launch/qwen3_30b_epic.sh NUM_ROLLOUT=300

# Qwen3-30B-A3B (configs/models/qwen3_30b_a3b.yaml; Qwen3 model card): 48 layers, 32 query heads x 128,
# 4 KV heads x 128, 128 experts top-8, 3.3B activated parameters; BF16 safetensors 61.06 GB
# (flytomelight.github.io/llm-cal/zh/models/qwen-qwen3-30b-a3b-h100: "predicts 61,064,216,576 bytes").
QWEN3_30B = dict(
    name="Qwen3-30B-A3B",
    active_params=3.3e9,
    layers=48,
    attn_dim=32 * 128,
    kv_heads=4,
    kv_bytes_per_token=48 * 2 * 4 * 128 * 2,
    weight_bytes=61.06e9,
)
# Qwen2.5-0.5B (configs/models/qwen2.5_0.5b.yaml; HF config): 24 layers, 14 x 64 heads, 2 KV heads x 64,
# 0.49B parameters (0.36B without embeddings).
QWEN25_05B = dict(
    name="Qwen2.5-0.5B",
    active_params=0.49e9,
    layers=24,
    attn_dim=14 * 64,
    kv_heads=2,
    kv_bytes_per_token=24 * 2 * 2 * 64 * 2,
    weight_bytes=0.99e9,
)
MODELS = {"qwen3-30b-a3b": QWEN3_30B, "qwen2.5-0.5b": QWEN25_05B}

# Tensor-parallel efficiency: FITTED (python bench/schedule_sim.py calibrate; calibration.fit_tp_alpha: 0.527)
# through the full engine model to SGLang's one TP4 point on H20 (sgl-project/sglang#5839, 1000-in / 2000-out,
# 5606.77 output tok/s; TP1 2634.68). Not the raw ratio (2.13x for 4x GPUs: alpha 0.545): TP1 on a 96 GB H20
# holds about 119 requests (KV-starved), TP4 all 1000, so the fit runs the model at each point's own batch.
# Fitting the modelled TP4/TP1 ratio instead of the TP4 point (TP1 is modelled 12% low) gives 0.43.
# One pair of points on one GPU type is thin evidence: the sensitivity comparison runs with tp_alpha = 1.
TP_ALPHA_FITTED = 0.53

# GPUs: dense BF16 FLOP/s, HBM bytes/s, HBM bytes.
GPUS = {
    # NVIDIA H100 SXM datasheet (the paper's GPU type is not stated: assumed H100)
    "H100": dict(flops=989e12, hbm_bytes_s=3.35e12, hbm_bytes=80e9),
    # NVIDIA A100 SXM 80GB datasheet (the calibration measurements' GPU)
    "A100": dict(flops=312e12, hbm_bytes_s=2.0e12, hbm_bytes=80e9),
    # H20: 96 GB HBM3 at 4.0 TB/s, 148 TFLOPS FP16/BF16 dense (willitrunai.com/es/gpus/h20-96gb;
    # ke60.top/article/1471031.html: "96GB ... 4.0 TB/s memory bandwidth")
    "H20": dict(flops=148e12, hbm_bytes_s=4.0e12, hbm_bytes=96e9),
}


@dataclasses.dataclass
class Preset:
    name: str
    # --- the run (configs/paper/table2.yaml; launch scripts) ---
    rollout_batch_size: int = 64  # Table 2: 64 prompts per rollout
    n_samples: int = 8  # Table 2: 8 samples per prompt
    update_depth: int = 8  # Table 2: D = 8
    oversample_ratio: float = 0.1  # Table 2: 0.1 (-> 72 groups in flight, oversampling.groups_in_flight)
    max_response_len: int = 16384  # Table 2
    prompt_len: int = 250  # assumed: DAPO-Math-17K prompts with the chat template, a few hundred tokens
    # response lengths: lognormal, capped at max_response_len (a capped sample is TRUNCATED);
    # log L = mu + prompt effect + sample noise, each with half the variance sigma^2 (assumed split).
    mean_response_len: float = 9000.0  # the paper's setting per the issue: mean about 9K (assumed shape: lognormal)
    length_sigma: float = 0.6  # assumed: the long tail (sensitivity table varies it)
    fixed_length: int | None = None  # every response this long (the runtime preset)
    # --- GPUs ---
    total_gpus: int = 32  # launch/qwen3_30b_epic.sh: 4 nodes x 8
    train_gpus_split: int = 16  # ACTOR_NODES = NUM_NODES / 2 -> 16 Megatron GPUs
    gpus_per_engine: int = 8  # rollout-num-gpus-per-engine 8 (configs/models/qwen3_30b_a3b.yaml)
    gpu: str = "H100"
    # --- SGLang engine (per engine of gpus_per_engine GPUs) ---
    t_base: float = 0.010  # decode step at batch 1: TPOT 9.6-10.6 ms for Qwen3-30B-A3B on one A100
    # (tenstorrent/tt-inference-server#340); assumed the same on a TP/EP engine
    # (more bandwidth, all-to-all overhead)
    c_tok: float = 0.0  # per running sequence per step (compute), set from the model below
    c_kv: float = 0.0  # per context token per step (KV reads), set from the model below
    hbm_efficiency: float = 0.6  # assumed share of HBM bandwidth decode attention reaches
    decode_mfu: float = 0.2  # assumed MFU of the decode matmuls at large batch
    decode_speed: float = 1.0  # multiplies decode throughput (sensitivity table)
    tp_alpha: float = (
        TP_ALPHA_FITTED  # an engine of g GPUs computes and reads KV g ** tp_alpha times as fast as one GPU
    )
    # (c_tok, c_kv and prefill); 1.0: the old linear scaling (--tp-alpha 1)
    prefill_tok_s: float = 0.0  # per 8 GPUs at linear scaling; 0: derived, 8 x peak x prefill_mfu / (2 x active
    # params); an engine of g GPUs prefills prefill_tok_s / 8 x g ** tp_alpha
    prefill_mfu: float = 0.5  # fitted: with it the model meets SGLang's H20 TP1 saturated sweep
    # (sglang#5839) within -2..-12% (python bench/schedule_sim.py calibrate)
    mem_fraction: float = 0.7  # slime's --sglang-mem-fraction-static for 30B-A3B (configs/models/qwen3_30b_a3b.yaml)
    kv_capacity_tokens: float = 0.0  # per engine; 0: derived (kv_capacity below: ~2.0M at TP 8, ~1.7M at TP 4 on H100)
    new_token_ratio: float = 0.2  # admission reserves this share of each running request's remaining
    # max_new_tokens (SGLang's new_token_ratio decays from 0.7 to 0.098;
    # assumed a fixed 0.2); contexts outgrowing the cache are retracted
    push_mode: str = "abort"  # --weight-push-mode (epic_slime/slime/push_mode.py): abort | in_place | retract
    # --- Megatron ---
    train_mfu: float = 0.25  # assumed MFU of Megatron MoE training (TP4 EP8, full recompute)
    train_mfu_at: dict | None = (
        None  # train GPUs -> MFU where a preset fits one per GPU count (verl); others: train_mfu
    )
    ref_forward: bool = True  # Table 2 uses a KL loss: one reference forward (2 N per token) per rollout
    optimizer_step_s: float = 1.5  # assumed: CPU Adam (--optimizer-cpu-offload) step, per optimizer step
    # --- weight movement (seconds) ---
    push_s_split: float = 20.0  # "tens of seconds per push for 30B-A3B over NCCL" (issue 20); assumed 20
    push_s_colocated: float = 7.0  # slime's colocated update_weights_from_tensor for Qwen3-30B-A3B: 60 s -> 7 s
    # (Biao He, Zilin Zhu, Ji Li, "Optimizing Weight Sync in slime", hebiao064.github.io/rl-weight-sync)
    offload_s: float = 3.0  # assumed: SGLang memory release / resume (torch_memory_saver) per call
    # --- model ---
    model: dict = dataclasses.field(default_factory=lambda: dict(QWEN3_30B))
    peak_flops: float = 0.0  # 0: from GPUS[gpu]
    hbm_bytes_s: float = 0.0  # 0: from GPUS[gpu]
    # --- simulation ---
    dt: float = 1.0  # tick of the engines and the trainer (simulated s)
    poll_s: float = 0.5
    shared_cores: float | None = None  # runtime preset: engines and trainer share this many CPU cores
    train_s_fixed: float | None = None  # runtime preset: measured train step
    seed: int = 0
    paper_rollouts: int = PAPER_ROLLOUTS
    source: str = ""  # where the preset's setting comes from (printed with it)
    # --- agentic workload (bench/schedsim/agentic.py): None is single-turn generation ---
    agent: object | None = None  # an agentic.AgentWorkload: turns, tool latency, tool tokens, prefix cache

    def derived(self) -> "Preset":
        """The engine constants from the model and the GPU (each left alone when set explicitly)."""
        p = dataclasses.replace(self)
        if p.push_mode not in ("abort", "in_place", "retract"):
            raise ValueError(f"Preset.push_mode must be 'abort', 'in_place' or 'retract', got {p.push_mode!r}")
        gpu = GPUS.get(p.gpu)
        if gpu is None:
            raise ValueError(f"Preset.gpu must be one of {sorted(GPUS)}, got {p.gpu!r}")
        p.peak_flops = p.peak_flops or gpu["flops"]
        p.hbm_bytes_s = p.hbm_bytes_s or gpu["hbm_bytes_s"]
        if p.prefill_tok_s == 0.0:
            p.prefill_tok_s = 8 * p.peak_flops * p.prefill_mfu / (2 * p.model["active_params"])
        if not 0.0 <= p.tp_alpha <= 1.0:
            raise ValueError(f"Preset.tp_alpha must be in [0, 1] (1: linear scaling with the GPUs), got {p.tp_alpha!r}")
        if p.fixed_length is None:
            speedup = p.tp_speedup()
            if p.c_kv == 0.0:
                p.c_kv = p.model["kv_bytes_per_token"] / (speedup * p.hbm_bytes_s * p.hbm_efficiency)
            if p.c_tok == 0.0:
                p.c_tok = 2 * p.model["active_params"] / (speedup * p.peak_flops * p.decode_mfu)
            if p.kv_capacity_tokens == 0.0:
                p.kv_capacity_tokens = kv_capacity(p.model, gpu["hbm_bytes"], p.gpus_per_engine, p.mem_fraction)
        return p

    def tp_speedup(self) -> float:
        """How many single GPUs' worth of compute and bandwidth one engine delivers: gpus ** tp_alpha."""
        return float(self.gpus_per_engine) ** self.tp_alpha

    def engine_prefill_tok_s(self) -> float:
        return self.prefill_tok_s * self.tp_speedup() / 8 if self.fixed_length is None else self.prefill_tok_s


def kv_capacity(model: dict, hbm_bytes: float, gpus: int, mem_fraction: float) -> float:
    """KV tokens one engine of ``gpus`` GPUs holds: per GPU, the static memory share less its slice of the
    weights, over the bytes per token each GPU stores (KV heads are split over TP, replicated past kv_heads).
    0 when the weights do not fit."""
    free = hbm_bytes * mem_fraction - model["weight_bytes"] / gpus
    per_gpu_token = model["kv_bytes_per_token"] / min(gpus, model["kv_heads"])
    return max(0.0, free / per_gpu_token)


def paper_preset(**kw) -> Preset:
    kw.setdefault("source", "configs/paper/table2.yaml (64 x 8, D = 8, 16K cap), launch/qwen3_30b_epic.sh (4 x 8 GPUs)")
    return Preset(name="paper: Qwen3-30B-A3B, 32 GPUs", **kw).derived()


# verl's fully-async Qwen3-30B-A3B-Base experiment, every number from volcengine/verl
# verl/experimental/fully_async_policy/README.md, "30B Model Mode Experiment" (the 1.72x table) and its
# "checkpoint-engine Ablation Experiment" table; the launch script beside it
# (verl/experimental/fully_async_policy/shell/grpo_30b_a3b_base_math_megatron_96_32.sh).
VERL_README = 'volcengine/verl verl/experimental/fully_async_policy/README.md, "30B Model Mode Experiment"'
VERL_SCRIPT = "verl/experimental/fully_async_policy/shell/grpo_30b_a3b_base_math_megatron_96_32.sh"
# per step (512 prompts x 16): seconds of each phase as the README's table gives them
VERL_SYNC_128 = dict(step=497.89, gen=348.05, old_log_prob=28.73, ref=20.86, update_actor=86.27)
VERL_ASYNC_96_32 = dict(step=282.75, gen=22.06, ref=50.05, update_actor=206.63)  # gen: the trainer's wait
VERL_TOTAL_400 = dict(sync="2d 11h 39m", fully_async="1d 10h 41m")
VERL_PUBLISHED_SPEEDUP = 1.72  # total time of 400 steps, 96:32 against 128 colocated
VERL_PUBLISHED_STEP_SPEEDUP = VERL_SYNC_128["step"] / VERL_ASYNC_96_32["step"]  # 1.76x per step
VERL_SYNC_S_16_16 = dict(without_checkpoint_engine=15.76, with_checkpoint_engine=4.38)  # Qwen3-30B-A3B, 16:16 ranks
# the published numbers the unstated inputs are fitted to (bench/schedsim/verl.py fits them)
VERL_TRAIN_S = {
    32: VERL_ASYNC_96_32["ref"] + VERL_ASYNC_96_32["update_actor"],  # 256.68 s
    128: VERL_SYNC_128["old_log_prob"] + VERL_SYNC_128["ref"] + VERL_SYNC_128["update_actor"],
}  # 135.86 s
VERL_SYNC_OTHER_S = VERL_SYNC_128["step"] - VERL_SYNC_128["gen"] - VERL_TRAIN_S[128]  # 13.98 s outside the phases
VERL_TRAIN_MFU_SPLIT = 0.25  # assumed, as the paper preset: Megatron's MFU on the 32 train GPUs
# fitted (python bench/schedule_sim.py verl-fit), each to one published phase: the mean response length to
# the 32-GPU training (256.68 s at the MFU above), the MFU at 128 GPUs to the colocated training (135.86 s),
# the decode speed to the colocated generation (348.05 s; verl's script decodes with enforce_eager True)
VERL_FITTED = dict(
    mean_response_len=1015.1,
    train_mfu=VERL_TRAIN_MFU_SPLIT,
    train_mfu_at={32: VERL_TRAIN_MFU_SPLIT, 128: 0.1181},
    decode_speed=0.3062,
)  # 0.2598 under linear TP scaling
VERL_OFFLOAD_S = 3.0  # as the paper preset (assumed)


def verl_preset(**kw) -> Preset:
    """verl's fully-async Qwen3-30B-A3B-Base setting (the 1.72x row): GRPO, 8K responses, 512 x 16 per step,
    4 optimizer steps, 128 H20 GPUs, 96 rollout : 32 train against 128 colocated. What verl does not state
    is assumed (the train MFU at 32 GPUs) or fitted to one published phase each (the mean response length,
    the MFU at 128 GPUs, the decode speed, the colocated weight update)."""
    base = dict(
        total_gpus=128,
        train_gpus_split=32,
        gpu="H20",  # README: H20; 96:32 and 128 colocated
        gpus_per_engine=4,
        mem_fraction=0.7,  # script: rollout TP 4 (INFER_TP=4), gpu_memory_utilization 0.7
        max_response_len=8192,  # README: max_response_length 8K
        rollout_batch_size=512,
        n_samples=16,  # README: train_batch_size 512, rollout.n 16
        update_depth=4,  # README: ppo_mini_batch_size 128 -> 512 / 128 = 4
        oversample_ratio=0.0,
        prompt_len=250,  # assumed (script: max_prompt_length 2048)
        ref_forward=True,  # script: use_kl_loss True (README: a ref phase)
        optimizer_step_s=0.0,  # folded into the fitted MFU
        push_s_split=VERL_SYNC_S_16_16["without_checkpoint_engine"],  # README checkpoint-engine table, 16:16 ranks
        offload_s=VERL_OFFLOAD_S,
        # fitted: the colocated step's time outside its phases (13.98 s) = weight update + 3 offload calls
        push_s_colocated=VERL_SYNC_OTHER_S - 3 * VERL_OFFLOAD_S,
        **VERL_FITTED,
        source=(
            f"{VERL_README} (H20, Qwen3-30B-A3B-Base, GRPO, 8K, 512 x 16, mini-batch 128 -> D = 4, 96:32 vs 128 "
            f"colocated, 1.72x total / {VERL_PUBLISHED_STEP_SPEEDUP:.2f}x per step; push 15.76 s from its "
            f"checkpoint-engine table); {VERL_SCRIPT} (rollout TP 4, memory 0.7, KL loss); "
            f"train MFU {VERL_TRAIN_MFU_SPLIT} at 32 GPUs assumed; mean response, MFU at 128 GPUs, decode speed "
            f"and the colocated weight update fitted"
        ),
    )
    base.update(kw)
    return Preset(name="verl: Qwen3-30B-A3B-Base, 128 H20", **base).derived()


def smoke_preset(**kw) -> Preset:
    # launch/smoke_1gpu.sh + configs/smoke/one_gpu.yaml: 8 prompts x 8, D = 2, responses capped at 1024,
    # one GPU colocated; Table 2's oversampling 0.1 (no effect at K = 0; the async rows use 9 groups)
    base = dict(
        rollout_batch_size=8,
        n_samples=8,
        update_depth=2,
        max_response_len=1024,
        mean_response_len=600.0,
        total_gpus=1,
        train_gpus_split=1,
        gpus_per_engine=1,
        t_base=0.006,
        prefill_tok_s=160_000.0,
        kv_capacity_tokens=1.0e6,
        train_mfu=0.15,
        optimizer_step_s=0.05,
        push_s_split=1.0,
        push_s_colocated=0.5,
        offload_s=1.0,
        model=dict(QWEN25_05B),
        dt=0.05,
        poll_s=0.05,
        source="launch/smoke_1gpu.sh, configs/smoke/one_gpu.yaml",
    )
    # mean 600 of 1024: assumed (a 0.5B instruct model on DAPO math); t_base 6 ms: assumed for a 0.5B model on one GPU;
    # pushes: assumed (1 GB of bf16 weights); prefill 20K tok/s on the one GPU (160K per 8)
    base.update(kw)
    return Preset(name="smoke: Qwen2.5-0.5B, 1 GPU", **base).derived()


PRESETS = {"paper": paper_preset, "verl": verl_preset, "smoke": smoke_preset}


def runtime_preset(m: dict, **kw) -> Preset:
    """The embedded runtime on its CPU cores: ``num_rollout_workers`` engines, each generating a request of
    ``prompts_per_request`` prompts in the measured ``gen_request_s`` (throughput-bound: a decode step costs
    c_tok per running sequence), the measured ``train_step_s``, all sharing ``cores`` (processor sharing)."""
    workers = m["num_rollout_workers"]
    seqs_per_request = m["rollout_batch_size"] // workers * m["n_samples_per_prompt"]
    length = max(1, round(m["mean_response_len"]))
    base = dict(
        rollout_batch_size=m["rollout_batch_size"],
        n_samples=m["n_samples_per_prompt"],
        update_depth=m["update_depth"],
        oversample_ratio=0.0,
        max_response_len=10**9,
        prompt_len=0,
        fixed_length=length,
        total_gpus=workers,
        train_gpus_split=1,
        gpus_per_engine=1,
        c_tok=m["gen_request_s"] / (seqs_per_request * length),
        prefill_tok_s=1e18,
        kv_capacity_tokens=1e18,
        push_s_split=m.get("push_s", 0.0),
        push_s_colocated=0.0,
        offload_s=0.0,
        shared_cores=m["cores"],
        train_s_fixed=m["train_step_s"],
        dt=m["train_step_s"] / 200,
        poll_s=0.001,
        paper_rollouts=0,
        source="bench/runtime_measurement.json",
    )
    base.update(kw)
    return Preset(name="embedded runtime (measured times)", **base).derived()
