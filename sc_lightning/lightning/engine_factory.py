"""The default generation engine for a config: where it runs follows ``policy.generation.colocated``.

- colocated: a :class:`MegatronEngine` in the training process (its own model replica, a decode thread);
- not colocated: a :class:`RayMegatronEngine` — the same engine in a Ray actor, its own process (Ray is started
  for it when the data plane has not started it already).

Both start from the policy's initial weights: the same (resolved) model name and seed build the same model.
"""

from __future__ import annotations

import os
from typing import Any

from sc_lightning.config import SCConfig
from sc_lightning.engines.base import GenerationEngine
from sc_lightning.lightning.warm_start import resolve_model_name


def default_engine_factory(config: SCConfig, initial_weights: Any = None) -> GenerationEngine:
    """Build the Megatron engine ``config`` asks for (colocated in-process, or in a Ray actor)."""
    policy, seed = config.policy, config.algo.seed
    if policy.generation.backend != "megatron":
        raise NotImplementedError(f"policy.generation.backend {policy.generation.backend!r} is not available yet")
    kwargs: dict[str, Any] = {
        "precision": policy.precision,
        "seed": seed,
        "tokenizer_name": policy.tokenizer_name,
        "max_seq_len": policy.max_total_sequence_length,
    }
    model_name = resolve_model_name(policy.model_name, seed=seed)
    if policy.generation.colocated.enabled:
        from sc_lightning.engines.megatron import MegatronEngine

        return MegatronEngine.from_pretrained(model_name, **kwargs)
    import ray

    from sc_lightning.engines.megatron_ray import RayMegatronEngine

    if not ray.is_initialized():
        ray.init(num_cpus=(os.cpu_count() or 1) + 1, include_dashboard=False, log_to_driver=False)
    return RayMegatronEngine(model_name, **kwargs)
