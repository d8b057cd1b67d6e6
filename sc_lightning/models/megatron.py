"""Build megatron-core ``GPTModel`` policies (Llama/Qwen family) and set up the process groups they need.

- :func:`init_model_parallel` starts ``torch.distributed`` (gloo without CUDA, nccl with it) for a lone process
  when nothing did, then megatron's ``parallel_state``; idempotent.
- :func:`build_gpt_model` turns a :class:`ModelSpec` into a ``GPTModel`` (local layer spec + SDPA attention) with
  seeded weights that do not depend on the tensor-parallel size.
- :func:`load_policy` does the same for ``"builtin:<name>"`` or a Hugging Face model directory/id, and returns
  the tokenizer too.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

from sc_lightning.models.attention import gpt_layer_spec_sdpa
from sc_lightning.models.convert import hf_to_megatron_state, random_hf_state, read_hf_safetensors, unwrapped_name
from sc_lightning.models.cpu_compat import apply_cpu_compat, seed_cpu_rng_tracker
from sc_lightning.models.fused import install_fused_rope
from sc_lightning.models.hf_dir import resolve_model_dir
from sc_lightning.models.logprobs import REAL_VOCAB_ATTR
from sc_lightning.models.norms import TorchNorm
from sc_lightning.models.policy_source import model_spec, policy_tokenizer
from sc_lightning.models.spec import ModelSpec
from sc_lightning.tokenizer import Tokenizer, check_tokenizer_fits_model

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _init_process_group(backend: str | None, device: torch.device) -> None:
    """Start ``torch.distributed``: from torchrun's env when present, else as a world of one (an in-memory store).

    On a CUDA ``device`` the process's current device becomes it (its index, else ``LOCAL_RANK``) and the default
    backend is NCCL; on the CPU, gloo.
    """
    if device.type == "cuda":
        torch.cuda.set_device(device.index if device.index is not None else int(os.environ.get("LOCAL_RANK", "0")))
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        torch.distributed.init_process_group(backend=backend)
        return
    # a world of one rendezvouses in memory: a TCP store would need a free port, which another process can take
    # between the probe and the bind (an engine actor failed to start so, EADDRINUSE)
    torch.distributed.init_process_group(backend=backend, store=torch.distributed.HashStore(), rank=0, world_size=1)


def init_model_parallel(
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    *,
    seed: int = 0,
    backend: str | None = None,
    device: str | torch.device = "cpu",
) -> None:
    """Make this process ready to build megatron models on ``device`` with the given TP/PP sizes (idempotent).

    On the CPU it installs the CPU patches (also on a machine that has CUDA: a CPU run never touches it). Starts
    ``torch.distributed`` if needed (torchrun env, or a single process on a free localhost port), initialises
    megatron's ``parallel_state`` and seeds megatron's model-parallel RNG tracker with ``seed`` (first call only;
    the first call's device type decides the tracker). Calling it again with the same sizes does nothing; other
    sizes while initialised are a ValueError (``parallel_state`` is process-global: use a new process).
    """
    device = torch.device(device)
    if device.type == "cpu":
        apply_cpu_compat()
    if not torch.distributed.is_initialized():
        _init_process_group(backend, device)
    if parallel_state.model_parallel_is_initialized():
        have = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
        )
        if have != (tensor_parallel_size, pipeline_parallel_size):
            raise ValueError(
                f"megatron parallel state is already initialised with (TP, PP) = {have}; cannot switch to "
                f"{(tensor_parallel_size, pipeline_parallel_size)} in the same process"
            )
        return
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tensor_parallel_size, pipeline_model_parallel_size=pipeline_parallel_size
    )
    if device.type == "cuda":
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    else:
        seed_cpu_rng_tracker(seed, parallel_state.get_tensor_model_parallel_rank())


def transformer_config(
    spec: ModelSpec,
    *,
    precision: str = "fp32",
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    sequence_parallel: bool = False,
    activation_checkpointing: bool = False,
    fused_kernels: bool = False,
) -> TransformerConfig:
    """The megatron ``TransformerConfig`` of ``spec``: RMSNorm, SwiGLU, no dropout, QK-norm where ``spec`` has it.

    With ``fused_kernels`` SwiGLU and RoPE are :mod:`sc_lightning.models.fused`'s (megatron's activation-submodule
    switch and its ``apply_rope_fusion``; the layer spec must carry :class:`~sc_lightning.models.fused.FusedSwiGLU`).
    megatron-core's own SwiGLU fusion (``bias_activation_fusion``) stays off: it is compiled for one shape, and RL's
    varying micro-batch lengths would recompile it until torch's recompile limit.
    """
    dtype = _DTYPES[precision]
    if fused_kernels:
        install_fused_rope()
    recompute = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    return TransformerConfig(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_query_groups=spec.num_query_groups,
        kv_channels=spec.kv_channels,
        ffn_hidden_size=spec.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=spec.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=spec.qkv_bias,
        qk_layernorm=spec.qk_layernorm,  # megatron sums the q/k norm gradients over TP ranks (finalize_model_grads)
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tensor_parallel_size,
        pipeline_model_parallel_size=pipeline_parallel_size,
        sequence_parallel=sequence_parallel,  # norms and residuals on a slice of the sequence per TP rank
        pipeline_dtype=dtype,
        params_dtype=dtype,
        bf16=precision == "bf16",
        use_cpu_initialization=True,
        perform_initialization=False,  # weights come from hf_to_megatron_state (seeded random or a checkpoint)
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=fused_kernels,
        use_te_activation_func=fused_kernels,  # megatron's name for "the MLP applies its activation submodule"
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        calculate_per_token_loss=True,  # the trainer divides by the step's global count: DDP only sums over ranks
        variable_seq_lengths=pipeline_parallel_size > 1,  # micro-batches vary in width: stages exchange shapes
        moe_token_dispatcher_type="alltoall",  # no MoE here; megatron refuses variable lengths with "allgather"
        **(recompute if activation_checkpointing else {}),
    )


def load_megatron_state(model: torch.nn.Module, state: dict[str, Tensor]) -> None:
    """Copy ``state`` (megatron names, this rank's shards) into ``model``; every real parameter must be covered."""
    result = model.load_state_dict(state, strict=False)
    missing = [key for key in result.missing_keys if not key.endswith("_extra_state")]
    if missing or result.unexpected_keys:
        raise KeyError(f"state does not fit the model: missing {missing[:8]}, unexpected {result.unexpected_keys[:8]}")


def megatron_weights(model: torch.nn.Module) -> list[tuple[str, Tensor]]:
    """``model``'s parameters under their megatron names (wrapper prefixes removed), detached, not copied."""
    return [(unwrapped_name(name), param.detach()) for name, param in model.named_parameters()]


def copy_megatron_weights(model: torch.nn.Module, weights: dict[str, Tensor]) -> None:
    """Copy ``weights`` (as :func:`megatron_weights` gives them, from a model of the same architecture) into
    ``model``'s parameters in place: one multi-tensor copy, casting where the dtypes differ. Every parameter must be
    covered, and nothing else given."""
    params = dict(megatron_weights(model))
    if weights.keys() != params.keys():
        missing, unexpected = sorted(params.keys() - weights.keys()), sorted(weights.keys() - params.keys())
        raise KeyError(f"weights do not fit the model: missing {missing[:8]}, unexpected {unexpected[:8]}")
    names = list(params)
    with torch.no_grad():
        torch._foreach_copy_([params[name] for name in names], [weights[name] for name in names])


def load_hf_weights(model: torch.nn.Module, spec: ModelSpec, hf_state: dict[str, Tensor]) -> None:
    """Load a full Hugging Face state dict into this rank's shard of ``model`` (TP/PP ranks from parallel_state)."""
    shard = hf_to_megatron_state(
        hf_state,
        spec,
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        tp_size=parallel_state.get_tensor_model_parallel_world_size(),
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
        pp_size=parallel_state.get_pipeline_model_parallel_world_size(),
    )
    load_megatron_state(model, shard)


@contextlib.contextmanager
def quiet_megatron() -> Iterator[None]:
    """Silence megatron-core's construction-time deprecation chatter (nothing a user of this module can act on)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"megatron\.")
        warnings.filterwarnings("ignore", message=".*(scope is deprecated|Apex is not installed).*")
        yield


def _gpt_model(spec: ModelSpec, config: TransformerConfig, tensor_parallel_size: int) -> GPTModel:
    """The (uninitialised) ``GPTModel`` of ``spec`` for this pipeline stage: local spec + SDPA, RoPE."""
    layers = TransformerBlockSubmodules(  # this stage's layers and the final norm, all with sequence-parallel norms
        layer_specs=[gpt_layer_spec_sdpa(fused_swiglu=config.use_te_activation_func, qk_layernorm=config.qk_layernorm)]
        * get_num_layers_to_build(config),
        layer_norm=TorchNorm,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=layers,
        vocab_size=spec.padded_vocab_size(tensor_parallel_size),
        max_sequence_length=spec.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=spec.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=spec.rope_theta,
        rope_scaling=spec.rope_scaling_factor is not None,
        rope_scaling_factor=spec.rope_scaling_factor or 8.0,
    )
    mark_tensor_parallel_weights(model)
    return model


def mark_tensor_parallel_weights(model: torch.nn.Module) -> None:
    """Give every sharded weight megatron's tensor-parallel attributes (split dimension, ``tensor_model_parallel``).

    megatron sets them on a weight only when it initialises it (``perform_initialization``), and ours come from a
    state dict instead; without them megatron's TP-aware code (a grad norm that counts a replicated tensor once, its
    optimizer) takes a shard for a duplicate. Biases get theirs at construction.
    """
    split_dims = {
        tensor_parallel.VocabParallelEmbedding: 0,
        tensor_parallel.ColumnParallelLinear: 0,
        tensor_parallel.RowParallelLinear: 1,
    }
    for module in model.modules():
        dim = next((d for kind, d in split_dims.items() if isinstance(module, kind)), None)
        weight = getattr(module, "weight", None)
        if dim is not None and weight is not None and not hasattr(weight, "tensor_model_parallel"):
            tensor_parallel.set_tensor_model_parallel_attributes(weight, is_parallel=True, dim=dim, stride=1)


def build_gpt_model(
    spec: ModelSpec,
    *,
    precision: str = "fp32",
    seed: int = 0,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    sequence_parallel: bool = False,
    activation_checkpointing: bool = False,
    hf_state: dict[str, Tensor] | None = None,
    device: str | torch.device = "cpu",
    fused_kernels: bool | None = None,
) -> GPTModel:
    """A megatron-core ``GPTModel`` of ``spec`` for this rank, with ``hf_state`` weights or seeded random ones.

    Initialises the parallel state if needed (:func:`init_model_parallel`). ``precision`` is ``"fp32"`` or ``"bf16"``
    (parameters and compute). The model is built on the CPU and moved to ``device`` (never chosen for you: a GPU is
    used only when asked for). ``fused_kernels`` (default: on a CUDA device) fuses SwiGLU and RoPE
    (:mod:`sc_lightning.models.fused`; same weights, same math). Output logits are vocab-parallel
    ``(B, T, padded_vocab / TP)``; see :mod:`sc_lightning.models.logprobs`. With ``sequence_parallel`` (TP > 1) each
    tensor-parallel rank keeps its slice of the sequence between the parallel linears: the input width must then
    be a multiple of TP (:func:`~sc_lightning.trainer.pipeline.train_microbatches` pads for it).
    """
    if precision not in _DTYPES:
        raise ValueError(f"precision must be one of {sorted(_DTYPES)}, got {precision!r}")
    if sequence_parallel and tensor_parallel_size == 1:
        raise ValueError("sequence_parallel splits the sequence over tensor-parallel ranks: it needs TP > 1")
    spec.check_parallel(tensor_parallel_size, pipeline_parallel_size)
    init_model_parallel(tensor_parallel_size, pipeline_parallel_size, seed=seed, device=device)
    with quiet_megatron():
        config = transformer_config(
            spec,
            precision=precision,
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
            sequence_parallel=sequence_parallel,
            activation_checkpointing=activation_checkpointing,
            fused_kernels=torch.device(device).type == "cuda" if fused_kernels is None else fused_kernels,
        )
        model = _gpt_model(spec, config, tensor_parallel_size)
    weights = hf_state if hf_state is not None else random_hf_state(spec, seed)
    load_hf_weights(model, spec, {name: t.to(config.params_dtype) for name, t in weights.items()})
    setattr(model, REAL_VOCAB_ATTR, spec.vocab_size)  # token_logprobs masks the TP padding rows with it
    model = model.to(device=device, dtype=config.params_dtype)  # torch norms are created in fp32: cast them too
    rope = getattr(model, "rotary_pos_emb", None)
    if rope is not None:  # RoPE's inverse frequencies are a plain attribute, which .to() leaves behind
        rope.inv_freq = rope.inv_freq.to(device)  # (the CPU patch computes the table where it finds them)
    return model


def load_policy(
    model_name: str,
    *,
    precision: str = "fp32",
    seed: int = 0,
    tp: int = 1,
    pp: int = 1,
    sequence_parallel: bool = False,
    activation_checkpointing: bool = False,
    tokenizer_name: str | None = None,
    check_tokenizer: bool = True,
    device: str | torch.device = "cpu",
) -> tuple[torch.nn.Module, ModelSpec, Tokenizer]:
    """Build the policy ``model_name`` names: ``"builtin:<name>"`` (seeded random) or an HF directory/id (its weights).

    Returns ``(model, spec, tokenizer)``; the tokenizer comes from ``tokenizer_name`` or else ``model_name``. With
    ``check_tokenizer`` a tokenizer that can produce ids past the model's vocabulary is a TokenizerMismatchError,
    raised before the model is built. The model lives on ``device``.
    """
    spec = model_spec(model_name)
    tokenizer = policy_tokenizer(model_name, tokenizer_name)
    if check_tokenizer:
        check_tokenizer_fits_model(tokenizer, spec.vocab_size, model_name=model_name, tokenizer_name=tokenizer_name)
    model = build_policy(
        model_name,
        spec,
        precision=precision,
        seed=seed,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        sequence_parallel=sequence_parallel,
        activation_checkpointing=activation_checkpointing,
        device=device,
    )
    return model, spec, tokenizer


def build_policy(model_name: str, spec: ModelSpec, **options: Any) -> torch.nn.Module:
    """The model of ``spec`` (:func:`model_spec` of ``model_name``) with the weights ``model_name`` names; ``options``
    go to :func:`build_gpt_model` (precision, seed, parallel sizes, device).

    A ``"builtin:<name>"`` model is seeded random, an HF directory/id gets its safetensors. A ``spec`` with ``vision``
    is a :class:`~sc_lightning.models.vlm.VisionLanguageModel` (:func:`~sc_lightning.models.vlm.build_vlm`). Neither
    the config nor a tokenizer is read, so a process that is handed ``spec`` (an engine actor) never imports
    ``transformers``.
    """
    hf_state = None if model_name.startswith("builtin:") else read_hf_safetensors(resolve_model_dir(model_name))
    if spec.vision is not None:
        from sc_lightning.models.vlm import build_vlm  # it builds its language model with build_gpt_model

        return build_vlm(spec, hf_state=hf_state, **options)
    return build_gpt_model(spec, hf_state=hf_state, **options)
