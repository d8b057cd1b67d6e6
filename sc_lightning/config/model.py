"""Model sections: the ``policy:`` (trainer + generation engine) and the PPO ``value:`` critic."""

from __future__ import annotations

from typing import Any, Literal

from sc_lightning.config.knobs import knob, section


@section
class MegatronConfig:
    """megatron-core training settings of a model."""

    enabled: bool = knob(True, "Train with megatron-core (the only supported trainer).")
    tensor_model_parallel_size: int = knob(
        1,
        "Tensor-parallel ranks. The embedding and output layer are zero-padded to a multiple of it (the start banner "
        "says the padded size); the padding rows are masked, never sampled or trained, and dropped on export.",
        ge=1,
    )
    pipeline_model_parallel_size: int = knob(1, "Pipeline-parallel stages (megatron-core's 1F1B schedule).", ge=1)
    sequence_parallel: bool = knob(
        False, "Megatron sequence parallelism: norms and residuals on each TP rank's slice of the sequence (TP > 1)."
    )
    activation_checkpointing: bool = knob(False, "Recompute activations in the backward pass.")
    use_distributed_optimizer: bool = knob(
        False,
        "megatron-core's distributed optimizer (ZeRO-1): each data-parallel rank keeps the fp32 main weights and AdamW "
        "moments of 1/DP of the parameters; gradients are reduce-scattered, updated weights all-gathered. Its "
        "checkpoints are always sharded; resume with the same setting.",
    )


def _http_host_knob() -> Any:
    """The endpoint's interface knob (both engines' blocks have one)."""
    return knob(
        "127.0.0.1",
        "Address the endpoint binds: 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or one of this "
        "machine's; off loopback the run refuses to start without an API key (http_api_key_env).",
    )


def _http_api_key_env_knob() -> Any:
    """The endpoint's API-key variable knob (both engines' blocks have one)."""
    return knob(
        "SC_LIGHTNING_API_KEY",
        "Environment variable holding the endpoint's API key (never the config file; never logged): when it is set, "
        "every route needs 'Authorization: Bearer <key>' (401 without).",
    )


@section
class OptimizerConfig:
    """AdamW settings of a model."""

    lr: float = knob(1e-6, "Peak learning rate.", gt=0)
    weight_decay: float = knob(0.01, "Decoupled weight decay.", ge=0)
    adam_beta1: float = knob(0.9, "Adam beta1.", ge=0, le=1)
    adam_beta2: float = knob(0.999, "Adam beta2.", ge=0, le=1)
    adam_eps: float = knob(1e-8, "Adam epsilon.", gt=0)
    clip_grad: float = knob(1.0, "Clip the global gradient norm to this value.", gt=0)
    warmup_steps: int = knob(0, "Linear learning-rate warm-up from 0 to lr.", unit="optimizer steps", ge=0)
    lr_decay_style: Literal["constant", "linear", "cosine"] = knob(
        "constant", "After warm-up: keep lr (constant), or decay it to min_lr linearly or along a cosine."
    )
    min_lr: float = knob(0.0, "The rate lr_decay_style decays to; it must not exceed lr.", ge=0)
    lr_decay_steps: int | None = knob(
        None,
        "Optimizer steps from the end of warm-up until the rate reaches min_lr (null = to the run's last step).",
        unit="optimizer steps",
        ge=1,
    )


@section
class VllmConfig:
    """vLLM engine settings."""

    async_engine: bool = knob(True, "Use vLLM's async engine; required (rollouts are driven per prompt group).")
    tensor_parallel_size: int = knob(1, "vLLM tensor-parallel ranks per engine.", ge=1)
    gpu_memory_utilization: float = knob(0.6, "Fraction of GPU memory vLLM may take.", gt=0, le=1)
    max_model_len: int | None = knob(None, "vLLM context length (null = policy.max_total_sequence_length).", ge=1)
    kv_cache_memory_bytes: int | None = knob(
        None,
        "KV-cache size per replica (null = from gpu_memory_utilization; set it on CPU boxes, where that fraction "
        "reserves host memory).",
        unit="bytes",
        ge=1,
    )
    max_num_seqs: int = knob(256, "Most requests one replica decodes together.", ge=1)
    expose_http_server: bool = knob(False, "Serve an OpenAI-compatible endpoint (needed by agent/Gym rollouts).")
    http_port: int = knob(
        0, "Port of that endpoint on http_host (0 = a free one); the start banner prints its URL.", ge=0, le=65535
    )
    http_host: str = _http_host_knob()
    http_api_key_env: str = _http_api_key_env_knob()


@section
class McoreGenerationConfig:
    """Megatron generation engine settings."""

    expose_http_server: bool = knob(False, "Serve an OpenAI-compatible endpoint (needed by agent/Gym rollouts).")
    http_port: int = knob(
        0, "Port of that endpoint on http_host (0 = a free one); the start banner prints its URL.", ge=0, le=65535
    )
    http_host: str = _http_host_knob()
    http_api_key_env: str = _http_api_key_env_knob()
    max_batch_size: int = knob(
        64, "Most requests the engine decodes together (its KV-cache rows); more wait for a free row.", ge=1
    )
    kv_cache_memory_fraction: float = knob(
        0.9,
        "On a GPU, the fraction of the device memory free when the KV cache is allocated (at the first request and "
        "at each wake beside a colocated trainer) that the cache may take: max_batch_size rows, or fewer when they "
        "do not fit (requests beyond them wait); the rest is the engine's room for a step. Not even one row fails "
        "the request, naming this knob.",
        gt=0,
        le=1,
    )
    kv_cache_dtype: Literal["auto", "fp8"] = knob(
        "auto",
        "What the KV cache holds: auto = the model's dtype; fp8 = e4m3, half the bytes: twice the rows in the same "
        "memory and half the K/V each decode step reads (long answers decode faster), for K and V rounded to 3 "
        "mantissa bits, so the engine's logprobs drift further from the trainer's (train/token_mult_prob_error).",
    )
    kv_cache_layout: Literal["slots", "paged"] = knob(
        "paged",
        "How the KV cache holds rows: slots = each row the whole context from its start; paged = blocks of 64 "
        "positions taken as a row grows, so long-tailed answers fit several times the rows in the same memory (the "
        "newest row waits again when the blocks run out) and a prompt group's rows share the prompt's blocks.",
    )


@section
class GenerationResources:
    """Accelerators given to non-colocated generation; the rest train."""

    num_nodes: int = knob(1, "Nodes running generation engines.", ge=1)
    gpus_per_node: int | None = knob(None, "Inference GPUs per node (required for non-colocated GPU runs).", ge=0)


@section
class ColocatedConfig:
    """Whether generation shares accelerators with training."""

    enabled: bool = knob(False, "Generation and training share the accelerators (Megatron backend only).")
    resources: GenerationResources = knob(doc="Accelerators for non-colocated generation.", factory=GenerationResources)


@section
class GenerationConfig:
    """The generation engine of the policy."""

    backend: Literal["megatron", "vllm"] = knob("megatron", "Inference engine.")
    max_new_tokens: int = knob(512, "Longest completion.", unit="tokens", ge=1)
    temperature: float = knob(1.0, "Sampling temperature.", gt=0)
    top_p: float = knob(1.0, "Nucleus sampling mass.", gt=0, le=1)
    top_k: int | None = knob(None, "Top-k sampling (null = off).", ge=1)
    refit_timeout_s: float | None = knob(
        600.0, "Deadline of one weight update of an engine (null = none).", unit="s", gt=0
    )
    refit_bucket_mb: float = knob(
        512.0,
        "At a refit the policy travels to the engines in buckets of at most this size (a larger single module "
        "travels alone): the most gathered weights the leader holds at once.",
        unit="MiB",
        gt=0,
    )
    vllm_cfg: VllmConfig = knob(doc="vLLM settings.", factory=VllmConfig)
    mcore_generation_config: McoreGenerationConfig = knob(
        doc="Megatron generation settings.", factory=McoreGenerationConfig
    )
    colocated: ColocatedConfig = knob(doc="Colocation of generation and training.", factory=ColocatedConfig)


@section
class PolicyConfig:
    """The policy model: how it is built, trained and served for generation."""

    model_name: str = knob(
        "builtin:tiny",
        "Hugging Face model directory (or an id in the local HF cache) of a LlamaForCausalLM, Qwen2ForCausalLM or "
        'Qwen3ForCausalLM to import, or "builtin:<name>" for a built-in random-init model.',
    )
    tokenizer_name: str | None = knob(
        None, "Tokenizer id or path (null = model_name's own: its tokenizer files, special tokens and chat template)."
    )
    train_global_batch_size: int = knob(
        512, "Sequences per optimizer step; must equal num_prompts_per_step * num_generations_per_prompt.", ge=1
    )
    train_micro_batch_size: int = knob(4, "Sequences per forward/backward micro-batch.", ge=1)
    train_micro_batch_tokens: int | None = knob(
        None,
        "Padded-token budget of a micro-batch (rows x its longest row; rows run longest first, a longer row alone); "
        "null = train_micro_batch_size rows only.",
        unit="tokens",
        ge=1,
    )
    train_micro_batch_width_multiple: int = knob(
        64,
        "A micro-batch's columns (its longest row's length) round up to a multiple of this, within the chunk's "
        "longest row, so micro-batches recur in a few shapes: kernels that plan each new shape (cuDNN attention) plan "
        "once per shape instead of once per micro-batch; 1 = no rounding (the budget counts the rounded width).",
        unit="tokens",
        ge=1,
    )
    max_total_sequence_length: int = knob(1024, "Prompt + completion length limit.", unit="tokens", ge=2)
    precision: Literal["bf16", "fp32"] = knob("bf16", "Parameter and compute precision (fp32 on CPU).")
    megatron_cfg: MegatronConfig = knob(doc="megatron-core settings.", factory=MegatronConfig)
    optimizer: OptimizerConfig = knob(doc="Optimizer.", factory=OptimizerConfig)
    generation: GenerationConfig = knob(doc="Generation engine.", factory=GenerationConfig)
    offload_optimizer_for_logprob: bool = knob(
        False, "Move optimizer state off the accelerator during logprob passes (PPO needs it for the critic)."
    )
    is_vlm: bool = knob(
        False,
        "Vision-language policy: policy.model_name is a VLM (builtin:tiny-vlm) and the prompts hold images; GRPO with "
        "Megatron generation (docs/vlm.md).",
    )


@section
class ValueConfig:
    """The PPO critic: a megatron-core model with a scalar value head."""

    model_name: str = knob("builtin:tiny", "Critic backbone: Hugging Face id, local path or builtin:<name>.")
    train_global_batch_size: int = knob(
        512, "Sequences per critic optimizer step; must equal num_prompts_per_step * num_generations_per_prompt.", ge=1
    )
    train_micro_batch_size: int = knob(4, "Sequences per critic micro-batch.", ge=1)
    precision: Literal["bf16", "fp32"] = knob("bf16", "Parameter and compute precision (fp32 on CPU).")
    megatron_cfg: MegatronConfig = knob(
        doc="megatron-core settings; the critic must be Megatron.", factory=MegatronConfig
    )
    optimizer: OptimizerConfig = knob(doc="Critic optimizer.", factory=OptimizerConfig)
