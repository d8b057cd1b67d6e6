"""The parts of an e2e step timed in their own benchmarks, on the very work the fit's last step did.

``benchmarks/e2e.py`` runs the fit; this module rebuilds its last step's answer lengths (:func:`step_lengths`: the
prompt stream, the rollout manager's sampling seeds and the ``fixed_length`` environment's draw) and times
(:func:`components`) a ``MegatronEngine`` configured as the fit's generating them (``engine.py``'s ``engine_run``),
the colocated refit (``refit.py``'s ``refit_s``) and one GRPO step over rows of those lengths (``train_step.py``'s
``median_ms``); on a GPU also the generation's memory floor (:func:`generation_bytes` over the copy bandwidth
measured beside it). :func:`report_efficiency` prints them beside the fit's split: the orchestration efficiency.
"""

from __future__ import annotations

import asyncio
import functools
import gc
from typing import Any

import torch
from decode_attention import copy_bandwidth  # benchmarks/*.py (the script's folder is on sys.path)
from engine import cache_value_bytes, decode_weight_bytes, engine_run, kv_bytes_per_position, prompts
from refit import refit_s
from step_profile import profiled
from train_step import median_ms

from sc_lightning.config import SCConfig
from sc_lightning.rollout.datasets import build_dataset
from sc_lightning.rollout.envs.fixed_length import answer_length
from sc_lightning.rollout.manager import sample_seed
from sc_lightning.rollout.prompts import PromptStream
from sc_lightning.tokenizer import CharTokenizer


def step_lengths(config: SCConfig, step: int) -> list[int]:
    """The answer lengths of RL step ``step`` of the run: its prompts (the stream's ``step``-th batch, first epoch)
    times the manager's sampling seeds, drawn by the environment as the fit drew them."""
    algo = config.algo
    dataset = build_dataset(config.data, CharTokenizer(), seed=algo.seed)
    stream = PromptStream(dataset, algo.num_prompts_per_step, shuffle=False, seed=algo.seed, max_epochs=1)
    batch = [next(stream) for _ in range(step + 1)][-1]
    cap = config.policy.generation.max_new_tokens
    return [
        answer_length(sample_seed(algo.seed, p.prompt_id, 0, i), cap)
        for p in batch
        for i in range(algo.num_generations_per_prompt)
    ]


def components(config: SCConfig, device: str, lengths: list[int], *, profile_train: bool = False) -> dict[str, Any]:
    """Seconds of the step's parts in their own benchmarks on ``device``: generation of ``lengths``, the refit, one
    GRPO step; on a GPU also the generation's memory floor (module docstring); with ``profile_train`` the training
    step once more under the profiler (``train_profile``: ``step_profile.profile_summary``)."""
    from sc_lightning.models import load_policy

    policy, on = config.policy, torch.device(device)
    model, spec, _ = load_policy(policy.model_name, precision=policy.precision, seed=config.algo.seed, device=on)
    generation_s, decode_steps, refit = asyncio.run(_generation_and_refit(config, on, model, spec.vocab_size, lengths))
    floor = {}
    if on.type == "cuda":  # the generation's memory traffic against this GPU's own copy bandwidth
        kv_dtype = policy.generation.mcore_generation_config.kv_cache_dtype
        prompt = config.data.max_prompt_length
        floor["generation_bytes"] = generation_bytes(model, spec, prompt, lengths, decode_steps, kv_dtype)
        floor["copy_bytes_per_s"] = copy_bandwidth(reps=5)
        floor["generation_floor_s"] = floor["generation_bytes"] / floor["copy_bytes_per_s"]
        gc.collect()  # the engine's replica (its worker thread and the engine refer to each other)
        torch.cuda.empty_cache()  # the engine's replica and KV cache are gone: the trainer takes the memory
    train = _train_s(config, model, spec, lengths, profile_train)
    return {"generation_s": generation_s, "refit_s": refit} | train | floor


async def _generation_and_refit(
    config: SCConfig, device: torch.device, model: torch.nn.Module, vocab: int, lengths: list[int]
) -> tuple[float, int, float]:
    """A colocated engine as the fit's answers the step's prompts with its lengths: its seconds and decode steps;
    then the refit's seconds."""
    from sc_lightning.engines.megatron.engine import MegatronEngine
    from sc_lightning.models.megatron import megatron_weights

    policy = config.policy
    engine = MegatronEngine.from_pretrained(
        policy.model_name,
        precision=policy.precision,
        seed=config.algo.seed,
        device=device,
        max_seq_len=policy.max_total_sequence_length,
        max_batch_size=policy.generation.mcore_generation_config.max_batch_size,
        kv_cache_dtype=policy.generation.mcore_generation_config.kv_cache_dtype,
        kv_cache_layout=policy.generation.mcore_generation_config.kv_cache_layout,
        stop_on_eos=False,  # the fit's requests ignore eos (fixed_length)
    )
    try:
        group = config.algo.num_generations_per_prompt  # the fit's prompt groups: its engine shares their prompts
        batch = prompts(len(lengths), config.data.max_prompt_length, vocab, group)
        await engine_run(engine, batch, lengths)  # warm-up, as the fit's first step: CUDA graphs, Triton kernels
        before = engine.stats.decode_steps
        seconds, generations = await engine_run(engine, batch, lengths)
        decode_steps = engine.stats.decode_steps - before
        assert [len(g.token_ids) for g in generations] == lengths
        refit = await refit_s(engine, functools.partial(megatron_weights, model), reps=3)
    finally:
        await engine.shutdown()
    return seconds, decode_steps, refit


def generation_bytes(
    model: torch.nn.Module, spec: Any, prompt: int, lengths: list[int], decode_steps: int, kv_cache_dtype: str
) -> float:
    """What generating ``lengths`` after ``prompt``-token prompts must read from memory at least: the weights once
    per decode step, and for each new token its row's K/V up to its own position."""
    rows = round(sum(lengths) / max(decode_steps, 1))  # the mean batch: its embedding rows are read too
    weights = decode_steps * decode_weight_bytes(model, spec, rows)
    per_position = kv_bytes_per_position(spec, cache_value_bytes(model, kv_cache_dtype))
    return weights + sum(n * prompt + n * (n + 1) / 2 for n in lengths) * per_position


def _train_s(config: SCConfig, model: torch.nn.Module, spec: Any, lengths: list[int], profile: bool) -> dict[str, Any]:
    """Seconds of one GRPO step over rows of prompt + ``lengths`` tokens, as the fit's module trains them: warm
    (``train_s``: the allocator holding the memory of the step before), and right after ``torch.cuda.empty_cache()``
    (``train_cold_s``: as in the colocated fit, where the engine's stand-down hands the memory back before every
    training step); with ``profile`` one more step under the profiler (``train_profile``)."""
    from sc_lightning.algorithms import ClippedPGLoss
    from sc_lightning.trainer.chunks import TrainChunk
    from sc_lightning.trainer.optim import adamw
    from sc_lightning.trainer.policy_update import PolicyUpdate

    policy, device = config.policy, next(model.parameters()).device
    prompt = config.data.max_prompt_length
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, spec.vocab_size, (len(lengths), prompt + max(lengths)), generator=g)
    mask = torch.zeros(ids.shape)
    for row, length in enumerate(lengths):
        mask[row, prompt : prompt + length] = 1
    chunk = TrainChunk(
        input_ids=ids,
        token_mask=mask,
        generation_logprobs=-torch.rand(ids.shape, generator=g),
        sample_mask=torch.ones(len(lengths)),
        advantages=torch.randn(len(lengths), 1, generator=g) * mask,
        rewards=torch.rand(len(lengths), generator=g),
        group_ids=[f"g{i // config.algo.num_generations_per_prompt}" for i in range(len(lengths))],
        start_weights=[0] * len(lengths),
    ).to(device)
    optimizer, _ = adamw(model, policy.optimizer, config.algo.max_num_steps)
    update = PolicyUpdate(
        model,
        optimizer,
        ClippedPGLoss.from_config(config.loss_fn),
        micro_batch_size=policy.train_micro_batch_size,
        micro_batch_tokens=policy.train_micro_batch_tokens,
        micro_batch_width_multiple=policy.train_micro_batch_width_multiple,
        clip_grad=policy.optimizer.clip_grad,
        vocab_size=spec.vocab_size,
    )

    def step() -> None:
        update.begin()
        update.train_chunk(chunk)
        update.finish()

    times = {"train_s": median_ms(step, device, reps=1, warmups=1) / 1e3}
    if device.type == "cuda":
        torch.cuda.empty_cache()
    times["train_cold_s"] = median_ms(step, device, reps=1, warmups=0) / 1e3
    if not profile:
        return times
    with profiled(device) as summary:
        step()
    return times | {"train_profile": summary()}


def report_efficiency(last: dict[str, float], parts: dict[str, float]) -> float:
    """Print the last step's parts in the fit beside their own benchmarks; return the orchestration efficiency."""
    step = last["timing/train/total_step_time"]
    explained = parts["generation_s"] + parts["train_s"] + parts["refit_s"]
    print(f"\norchestration efficiency, step {last['step']:.0f} (its own work in the component benchmarks):")
    print("| part | in the fit s | own benchmark s |\n|---|---:|---:|")
    for name in ("generation", "train", "refit"):
        inside = last[f"perf/split_{name}_s"] + (last["perf/split_logprob_s"] if name == "train" else 0.0)
        print(f"| {name} | {inside:.3f} | {parts[f'{name}_s']:.3f} |")
    print(f"| step | {step:.3f} | {explained:.3f} |")
    print(f"(train with a cold allocator, after torch.cuda.empty_cache(): {parts['train_cold_s']:.3f} s)")
    print(f"orchestration efficiency = {explained:.3f} / {step:.3f} = {explained / step:.1%}")
    if "generation_floor_s" in parts:
        floor, generation = parts["generation_floor_s"], last["perf/split_generation_s"]
        ceiling = last["perf/step_tokens"] / (step - generation + floor)
        print(
            f"generation's memory floor: {parts['generation_bytes'] / 1e12:.2f} TB (weights once a decode step, each "
            f"token's K/V up to its position) at this GPU's copy bandwidth "
            f"({parts['copy_bytes_per_s'] / 1e12:.2f} TB/s) = {floor:.2f} s: the fit's generation ran at "
            f"{floor / generation:.0%} of it, its own benchmark at {floor / parts['generation_s']:.0%}; with "
            f"generation at the floor and the rest of the step as it ran, {ceiling:,.0f} tokens/s/GPU"
        )
    return explained / step
