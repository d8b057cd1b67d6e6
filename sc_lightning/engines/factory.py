"""The default generation engine for a config: ``policy.generation.backend`` and ``colocated`` decide.

- megatron, colocated: a :class:`MegatronEngine` in the training process (its own model replica, a decode thread),
  on the trainer's device (that of ``initial_weights``);
- megatron, not colocated: a :class:`RayMegatronEngine` — the same engine in a Ray actor, its own process;
- vllm (never colocated): :class:`VLLMEngine` replicas — vLLM's async engine, one Ray actor each — behind an
  :class:`EngineRouter`; ``colocated.resources`` GPUs / ``vllm_cfg.tensor_parallel_size`` replicas on a GPU box,
  one on a CPU box.

Engines in actors start Ray when the data plane has not started it already. All start from the policy's initial
weights: the Megatron engines rebuild them from the same (resolved) model name and seed; vLLM loads the model
directory, written from ``initial_weights`` first when the policy is a ``builtin:`` model without one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from sc_lightning.config import SCConfig
from sc_lightning.engines.base import GenerationEngine
from sc_lightning.local_ray import init_local_ray
from sc_lightning.models.warm_start import resolve_model_name


def context_tokens(config: SCConfig) -> int:
    """The longest sequence (prompt + completion) the engine ``config`` asks for holds: vLLM's ``max_model_len`` when
    set, else ``policy.max_total_sequence_length``."""
    generation = config.policy.generation
    if generation.backend == "vllm" and generation.vllm_cfg.max_model_len:
        return generation.vllm_cfg.max_model_len
    return config.policy.max_total_sequence_length


def default_engine_factory(
    config: SCConfig, initial_weights: list[tuple[str, torch.Tensor]] | None = None
) -> GenerationEngine:
    """Build the engine ``config`` asks for (colocated in-process, or in a Ray actor)."""
    policy, seed = config.policy, config.algo.seed
    model_name = resolve_model_name(policy.model_name, seed=seed)
    if policy.generation.backend == "vllm":
        return _vllm_engine(config, model_name, initial_weights)
    kwargs: dict[str, Any] = {
        "precision": policy.precision,
        "seed": seed,
        "tokenizer_name": policy.tokenizer_name,
        "max_seq_len": context_tokens(config),
        "max_batch_size": policy.generation.mcore_generation_config.max_batch_size,
        "kv_cache_memory_fraction": policy.generation.mcore_generation_config.kv_cache_memory_fraction,
    }
    if policy.generation.colocated.enabled:
        from sc_lightning.engines.megatron.engine import MegatronEngine

        # beside the trainer, on its device: where the policy's weights (handed over here) live
        device = initial_weights[0][1].device if initial_weights else torch.device("cpu")
        return MegatronEngine.from_pretrained(model_name, device=device, **kwargs)
    from sc_lightning.engines.megatron.ray_engine import RayMegatronEngine

    start_ray()
    return RayMegatronEngine(model_name, **kwargs)


def start_ray() -> None:
    """Join the Ray cluster ``RAY_ADDRESS`` names (a multi-node run), or start a local one."""
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)  # a cluster's resources are its own
    else:
        init_local_ray((os.cpu_count() or 1) + 1, log_to_driver=False)


_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _vllm_engine(
    config: SCConfig, model_name: str, initial_weights: list[tuple[str, torch.Tensor]] | None
) -> GenerationEngine:
    from sc_lightning.engines.router import EngineRouter
    from sc_lightning.engines.vllm import VLLMEngine, VLLMSettings, require_vllm
    from sc_lightning.tokenizer import load_tokenizer

    require_vllm()
    policy, vllm_cfg = config.policy, config.policy.generation.vllm_cfg
    written: tuple[Path, ...] = ()
    if model_name.startswith("builtin:"):  # vLLM loads directories: write the policy's initial weights as one
        if initial_weights is None:
            raise ValueError(f"a vLLM engine for {model_name!r} needs the policy's initial weights to write")
        from sc_lightning.models import builtin_spec, save_hf_directory

        directory = Path(tempfile.mkdtemp(prefix="sc-lightning-vllm-model-"))
        save_hf_directory(builtin_spec(model_name), initial_weights, directory)
        written, model_name = (directory,), str(directory)
    settings = VLLMSettings(
        model_path=model_name,
        dtype=_DTYPES.get(policy.precision, policy.precision),
        max_model_len=context_tokens(config),
        seed=config.algo.seed,
        max_num_seqs=vllm_cfg.max_num_seqs,
        tensor_parallel_size=vllm_cfg.tensor_parallel_size,
        gpu_memory_utilization=vllm_cfg.gpu_memory_utilization,
        kv_cache_memory_bytes=vllm_cfg.kv_cache_memory_bytes,
        recompute_kv_cache_after_weight_updates=config.async_rl.recompute_kv_cache_after_weight_updates,
        eos_token_id=load_tokenizer(policy.tokenizer_name or model_name).eos_token_id,
    )
    gpus = _engine_gpus(config)
    start_ray()
    replicas = [
        VLLMEngine(
            settings, name=f"vllm-{i}", num_gpus=vllm_cfg.tensor_parallel_size if gpus else 0, cleanup_paths=written
        )
        for i in range(engine_actor_count(config))
    ]
    return EngineRouter(replicas, name="vllm")


def _engine_gpus(config: SCConfig) -> int:
    """The GPUs ``policy.generation.colocated.resources`` gives the engines (0 on a CPU box)."""
    resources = config.policy.generation.colocated.resources
    return resources.num_nodes * (resources.gpus_per_node or 0)


def engine_actor_count(config: SCConfig) -> int:
    """How many Ray actors the default engine of ``config`` starts, each reserving one CPU: none for a colocated
    Megatron engine, one for the Megatron engine in an actor, one vLLM replica per ``tensor_parallel_size`` GPUs
    (one on a CPU box)."""
    generation = config.policy.generation
    if generation.backend == "vllm":
        return max(1, _engine_gpus(config) // generation.vllm_cfg.tensor_parallel_size)
    return 0 if generation.colocated.enabled else 1
