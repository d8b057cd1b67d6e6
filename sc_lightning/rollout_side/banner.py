"""The start banner: one block on stderr, once the rollout side is up, saying what runs where.

For ``configs/grpo_tiny.yaml`` on a CPU box::

    sc_lightning grpo: builtin:tiny-arith (policy 84.9 K parameters)
      model: Qwen2ForCausalLM, vocabulary 18 (18 embedding rows at TP 1); tokenizer results/.cache/… (chat template)
      trainer: 1 rank on cpu (1 device x 1 node), seed 7
      generation: megatron engine in its own Ray actor
      sampler: in_order (max_lookahead_versions 1), 8 groups x 8 generations per step, buffer 16 groups
      data plane: memory
      logs: CSVLogger lightning_logs/version_0
      checkpoints: off (checkpointing.enabled: false)

The ``model:`` line says the policy's architecture and vocabulary: at TP > 1 the embedding rows are padded to a
multiple of TP, and the line says so (the padding is never sampled or trained). ``endpoint:`` (the OpenAI-compatible
URL; where agents take rollouts with env.name external) follows when one is
served, and ``kernels:`` when a CUDA trainer runs without Apex or Transformer Engine (megatron then uses its torch
fall-backs). :func:`banner` is pure; :func:`run_facts` gathers what only the started run knows (the strategy passes
its trainer's devices and loggers; nothing here imports Lightning).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sc_lightning.config import SCConfig, resolve
from sc_lightning.engines.factory import megatron_engine_gpus
from sc_lightning.models.hf_config import architecture_name
from sc_lightning.models.spec import ModelSpec

_SAMPLER_WINDOW_KNOBS = ("max_lookahead_versions", "max_staleness_versions", "over_sampling_ratio", "target")
_FAST_KERNELS = {"apex": "Apex", "transformer_engine": "Transformer Engine"}
_COUNT_UNITS = ("", "K", "M", "B", "T")


@dataclass(frozen=True)
class RunFacts:
    """What the banner says that only the started run knows (the rest comes from the config)."""

    parameters: dict[str, int]  # trained model -> its parameter count on the leader (its shard, with TP / PP)
    layout: str  # "1 rank", or megatron's split: "4 ranks = TP 2 x PP 1 x DP 2"
    device: str  # the leader's device type: "cpu", "cuda"
    devices: int  # per node
    nodes: int
    loggers: tuple[str, ...]  # "CSVLogger lightning_logs/version_0"
    endpoint_url: str | None = None
    missing_kernels: tuple[str, ...] = ()  # fast-kernel libraries megatron falls back from (CUDA only)
    spec: ModelSpec | None = None  # the policy's architecture
    tokenizer: str = ""  # the policy's tokenizer: where it was loaded from, and "(chat template)" if it has one


def banner(config: SCConfig, facts: RunFacts) -> str:
    """The banner's text (no trailing newline)."""
    counts = ", ".join(f"{name} {human_count(n)}" for name, n in facts.parameters.items())
    megatron = config.policy.megatron_cfg
    sharded = megatron.tensor_model_parallel_size * megatron.pipeline_model_parallel_size > 1
    whose = " in rank 0's shard" if sharded else ""
    plural = "s" if facts.devices != 1 else ""
    lines = [
        f"sc_lightning {config.algo_name}: {config.policy.model_name} ({counts} parameters{whose})",
        *([f"model: {_model(facts.spec, megatron.tensor_model_parallel_size, facts.tokenizer)}"] if facts.spec else []),
        f"trainer: {facts.layout} on {facts.device} ({facts.devices} device{plural} x {facts.nodes} node"
        f"{'s' if facts.nodes != 1 else ''}), seed {config.algo.seed}",
        f"generation: {_placement(config, facts.device)}",
        f"sampler: {_sampler(config)}",
        f"data plane: {config.data_plane.backend}",
        f"logs: {', '.join(facts.loggers) or 'none (trainer.logger: false)'}",
        f"checkpoints: {_checkpoints(config)}",
    ]
    if facts.endpoint_url:
        agents = "; agents take rollouts from /rollouts/next" if config.env.name == "external" else ""
        lines.append(f"endpoint: {facts.endpoint_url} (OpenAI-compatible completions{agents})")
    if facts.missing_kernels:
        lines.append(f"kernels: megatron's torch fall-backs (not installed: {', '.join(facts.missing_kernels)})")
    return "\n  ".join(lines)


def _model(spec: ModelSpec, tensor_parallel_size: int, tokenizer: str) -> str:
    """The architecture, the vocabulary and the embedding rows it takes at this TP size, and the tokenizer."""
    vocab, rows = spec.vocab_size, spec.padded_vocab_size(tensor_parallel_size)
    padding = "" if rows == vocab else ": the padding rows are never sampled or trained"
    rows_text = f"{rows} embedding rows at TP {tensor_parallel_size}{padding}"
    return f"{architecture_name(spec.arch)}, vocabulary {vocab} ({rows_text}); tokenizer {tokenizer}"


def _placement(config: SCConfig, device: str) -> str:
    generation = config.policy.generation
    if generation.backend == "vllm":
        resources = generation.colocated.resources
        gpus = resources.num_nodes * (resources.gpus_per_node or 0)
        where = f"{gpus} GPUs on {resources.num_nodes} node(s)" if gpus else "the CPU"
        return f"vllm engines in Ray actors ({where}, TP {generation.vllm_cfg.tensor_parallel_size} each)"
    if generation.colocated.enabled:
        return f"megatron engine in the trainer process (colocated, on {device})"
    gpus = megatron_engine_gpus(config, torch.device(device))
    if gpus > 1:
        return f"megatron engines in Ray actors ({gpus} GPUs, a replica on each, requests routed to the least busy)"
    return "megatron engine in its own Ray actor" + (" (a GPU of its own)" if gpus else "")


def _sampler(config: SCConfig) -> str:
    sampler, resolved = config.async_rl.sampler, resolve(config)
    knobs = {k: getattr(sampler, k, None) for k in _SAMPLER_WINDOW_KNOBS}
    window = ", ".join(
        f"{k} {value:g}" if isinstance(value, float) else f"{k} {value}"
        for k, value in knobs.items()
        if value is not None
    )
    drain = "" if config.async_rl.in_flight_weight_updates else "; each refit drains the rollouts in flight"
    return (
        f"{sampler.name}{f' ({window})' if window else ''}, {resolved.groups_per_step} groups x "
        f"{config.algo.num_generations_per_prompt} generations per step, buffer {resolved.max_buffered_rollouts} "
        f"groups{drain}"
    )


def _checkpoints(config: SCConfig) -> str:
    checkpointing, snapshots = config.checkpointing, config.rollout_checkpointing
    if not checkpointing.enabled:
        return "off (checkpointing.enabled: false)"
    period = checkpointing.save_period
    text = f"{checkpointing.checkpoint_dir} every {period} step{'s' if period != 1 else ''}"
    if snapshots.snapshot_attempt_interval_s is not None:
        text += f", rollout snapshots every {snapshots.snapshot_attempt_interval_s:g} s"
    return text


def human_count(number: int) -> str:
    """``number`` in thousands, millions, billions or trillions, as a model summary writes it: ``84.9 K``,
    ``1.3 B``, ``123`` (one decimal below 100 of a unit, none from 100 on)."""
    digits = int(math.floor(math.log10(number)) + 1) if number > 0 else 1
    index = min(math.ceil(digits / 3), len(_COUNT_UNITS)) - 1
    scaled = number * 10 ** (-3 * index)
    text = f"{int(scaled):,d}" if index < 1 or scaled >= 100 else f"{scaled:,.1f}"
    return f"{text} {_COUNT_UNITS[index]}".strip()


def run_facts(
    models: Mapping[str, torch.nn.Module],
    *,
    layout: str,
    device: str,
    devices: int,
    nodes: int,
    loggers: Sequence[Any],
    endpoint_url: str | None,
    spec: ModelSpec | None = None,
    tokenizer: Any = None,
) -> RunFacts:
    """The started run's facts, on the leader (nothing here is a collective): the trained ones of ``models`` counted,
    each of the trainer's ``loggers`` named with its directory, the fast kernels missing on a CUDA ``device``, the
    policy's ``spec`` and ``tokenizer`` (named as it was loaded; whether it has a chat template)."""
    return RunFacts(
        parameters={
            name: sum(p.numel() for p in model.parameters())
            for name, model in models.items()
            if any(p.requires_grad for p in model.parameters())
        },
        layout=layout,
        device=device,
        devices=devices,
        nodes=nodes,
        loggers=tuple(_logger_text(logger) for logger in loggers),
        endpoint_url=endpoint_url,
        missing_kernels=_missing_kernels() if device == "cuda" else (),
        spec=spec,
        tokenizer=_tokenizer_text(tokenizer),
    )


def _tokenizer_text(tokenizer: Any) -> str:
    name = getattr(tokenizer, "name", None) or repr(tokenizer)
    chat = getattr(getattr(tokenizer, "transformers_tokenizer", None), "chat_template", None)
    return f"{name} (chat template)" if chat else name


def _logger_text(logger: Any) -> str:
    where = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None)
    if where is None:
        return type(logger).__name__
    path = os.path.relpath(where) if os.path.isabs(where) and where.startswith(os.getcwd()) else where
    return f"{type(logger).__name__} {path}"


def _missing_kernels() -> tuple[str, ...]:
    return tuple(name for module, name in _FAST_KERNELS.items() if importlib.util.find_spec(module) is None)


def print_banner(config: SCConfig, facts: RunFacts) -> None:
    """Print the banner to stderr (the console; stdout stays for what a command is asked to print)."""
    print(banner(config, facts), file=sys.stderr, flush=True)
