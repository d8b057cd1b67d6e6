"""The default generation engine for a config: ``policy.generation.backend`` and ``colocated`` decide.

- megatron, colocated: a :class:`MegatronEngine` in the training process (its own model replica, a decode thread),
  on the trainer's device (that of ``initial_weights``);
- megatron, not colocated: a :class:`RayMegatronEngine` — the same engine in a Ray actor, its own process; on a GPU
  box with ``colocated.resources.gpus_per_node`` set, one replica on each of those GPUs (the node's last: the
  trainer's ranks take the first ones), behind an :class:`EngineRouter` when there are several, each refit from the
  trainer's GPU by broadcast over NCCL (:mod:`~sc_lightning.engines.weight_group`);
- vllm (never colocated): :class:`VLLMEngine` replicas — vLLM's async engine, one Ray actor each — behind an
  :class:`EngineRouter`; ``colocated.resources`` GPUs / ``vllm_cfg.tensor_parallel_size`` replicas on a GPU box,
  one on a CPU box.

Engines in actors start Ray when the data plane has not started it already. All start from the policy's initial
weights: the Megatron engines rebuild them from the same (resolved) model name and seed; vLLM loads the model
directory, written from ``initial_weights`` first when the policy is a ``builtin:`` model without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Iterator
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
        "kv_cache_dtype": policy.generation.mcore_generation_config.kv_cache_dtype,
        "kv_cache_layout": policy.generation.mcore_generation_config.kv_cache_layout,
    }
    trainer = initial_weights[0][1].device if initial_weights else torch.device("cpu")  # where the policy lives
    if policy.generation.colocated.enabled:
        from sc_lightning.engines.megatron.engine import MegatronEngine

        return MegatronEngine.from_pretrained(model_name, device=trainer, **kwargs)  # beside the trainer
    return _megatron_actor_engine(model_name, kwargs, trainer, megatron_engine_gpus(config, trainer))


def megatron_engine_gpus(config: SCConfig, trainer: torch.device) -> int:
    """The GPUs a non-colocated Megatron engine fleet takes, one replica each: ``colocated.resources``' GPUs when
    the trainer is on a GPU, else none (a CPU run's one engine stays on the CPU)."""
    return _engine_gpus(config) if trainer.type == "cuda" else 0


def _megatron_actor_engine(
    model_name: str, kwargs: dict[str, Any], trainer: torch.device, gpus: int
) -> GenerationEngine:
    """The Megatron engine in a Ray actor, on the CPU (``gpus`` 0); or one replica per engine GPU, each refit from
    the trainer's GPU through a weight group of its own, behind an :class:`EngineRouter` when there are several."""
    from sc_lightning.engines.megatron.ray_engine import RayMegatronEngine
    from sc_lightning.engines.router import EngineRouter

    start_ray(engine_gpus=gpus)
    if not gpus:
        return RayMegatronEngine(model_name, num_gpus=0, device="cpu", **kwargs)
    names = ["megatron-ray"] if gpus == 1 else [f"megatron-{i}" for i in range(gpus)]
    replicas = [RayMegatronEngine(model_name, name=name, num_gpus=1, device="cuda", **kwargs) for name in names]

    async def open_weight_groups() -> None:  # refits GPU to GPU from now on
        await asyncio.gather(*(replica.open_weight_group(trainer) for replica in replicas))

    asyncio.run(open_weight_groups())
    return replicas[0] if gpus == 1 else EngineRouter(replicas, name="megatron")


def start_ray(engine_gpus: int = 0) -> None:
    """Join the Ray cluster ``RAY_ADDRESS`` names (a multi-node run), or start a local one; a local one started for
    ``engine_gpus`` engine GPUs sees only the node's last ``engine_gpus`` GPUs (:func:`engine_gpu_ids`), so that
    no actor lands on a GPU of the trainer's."""
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)  # a cluster's resources are its own
        return
    with _visible_gpus(engine_gpu_ids(_node_gpus(), engine_gpus) if engine_gpus else None):
        init_local_ray((os.cpu_count() or 1) + 1, log_to_driver=False)


def engine_gpu_ids(node_gpus: list[str], count: int) -> list[str]:
    """The GPUs of ``node_gpus`` (CUDA ids, in order) that ``count`` engine GPUs take: the last ones, as the trainer's
    ranks take the first; ValueError when none would be left to the trainer."""
    if count >= len(node_gpus):
        raise ValueError(
            f"policy.generation.colocated.resources.gpus_per_node ({count}) leaves none of this node's "
            f"{len(node_gpus)} GPUs ({','.join(node_gpus) or 'none'}) to the trainer: lower it, or set "
            "policy.generation.colocated.enabled: true to share the trainer's"
        )
    return node_gpus[len(node_gpus) - count :]


def _node_gpus() -> list[str]:
    """This process's GPUs as CUDA ids: ``CUDA_VISIBLE_DEVICES`` when set, else every device torch sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [gpu.strip() for gpu in visible.split(",") if gpu.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


@contextlib.contextmanager
def _visible_gpus(gpus: list[str] | None) -> Iterator[None]:
    """``CUDA_VISIBLE_DEVICES`` set to ``gpus`` for what starts meanwhile (Ray's node takes its GPUs from it), then
    put back; this process's own CUDA context, already made, keeps its devices. None: unchanged."""
    if gpus is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


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
    """How many Ray actors the default engine of ``config`` starts beside a CPU trainer, each reserving one CPU: none
    for a colocated Megatron engine, one for the Megatron engine in an actor, one vLLM replica per
    ``tensor_parallel_size`` GPUs of ``colocated.resources`` (at least one). Beside a GPU trainer the Megatron
    engine has a replica per engine GPU (:func:`megatron_engine_gpus`)."""
    generation = config.policy.generation
    if generation.backend == "vllm":
        return max(1, _engine_gpus(config) // generation.vllm_cfg.tensor_parallel_size)
    return 0 if generation.colocated.enabled else 1
