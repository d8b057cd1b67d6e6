"""Throughput of each RL step: the training step's ``perf/tokens_per_s``, ``perf/mfu``, ``perf/peak_memory_gib`` and
``perf/alloc_retries``, and the whole step's ``perf/tokens_per_s_per_gpu`` with the split of its wall time
(:func:`step_throughput`).

Model FLOPs of one trained row of ``L`` tokens (forward + backward, the usual dense-transformer count)::

    6 * P * L  +  12 * layers * hidden * L**2

``P`` counts every parameter of the whole model (embeddings included); the second term is attention's score and value
products (causal masking not discounted, as megatron and PaLM count it). A rank's share is its data-parallel replica's
rows' FLOPs over the replica's tensor- x pipeline-parallel ranks (:func:`rank_training_flops`). Only tokens the model
actually ran count: a row's length ends at its last loss-counted token and padding is excluded. MFU is those FLOPs over
the step's training time and the device's dense bf16 peak (:data:`DENSE_BF16_PEAK_TFLOPS`, matched on the device name;
no MFU is logged on a CPU or an unknown GPU). The time is the step's policy-training time (waits for rollouts excluded),
read after the device has finished its work. For PPO the critic's work is in that time but not in the FLOPs.

The whole step's throughput is NeMo-RL's figure: prompt + response tokens of the step (every rank's trained rows,
counted as above) / the step's wall time (from the previous refit's end to this one's) / the GPUs of the run
(training and generation). The wall time splits into generation (the trainer waiting for rollouts), logprob
passes (the frozen forwards inside the training step: a reference policy's, PPO's pi_old), training (the rest of
the training step), refit and other (the step's bundle, Lightning's loop, logging), which add up to it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from sc_lightning.models.spec import ModelSpec

DENSE_BF16_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "H800": 989.0, "B200": 2250.0, "A100": 312.0, "L40S": 362.0}
"""Datasheet dense (no sparsity) bf16 tensor-core peaks, by a substring of ``torch.cuda.get_device_name``."""


def peak_tflops(device: torch.device) -> float | None:
    """The dense bf16 peak of ``device`` in TFLOP/s, or None (a CPU, or a GPU not in the table)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in DENSE_BF16_PEAK_TFLOPS.items() if key in name), None)


def training_flops(spec: ModelSpec, parameters: int, lengths: list[int]) -> float:
    """Forward + backward model FLOPs of rows of ``lengths`` tokens (the module docstring's formula)."""
    attention = 12 * spec.num_layers * spec.hidden_size
    return float(sum(6 * parameters * length + attention * length * length for length in lengths))


def rank_training_flops(spec: ModelSpec, lengths: list[int], model_parallel: int = 1) -> float:
    """This rank's share of the training FLOPs of its data-parallel replica's rows of ``lengths``: the whole model's
    (:func:`training_flops` over ``spec``'s parameters) split evenly over the replica's ``model_parallel`` ranks
    (TP x PP), as MFU counts them. A rank's own parameters would miss the rest of the model's, yet with attention's
    term count every layer's."""
    return training_flops(spec, spec.num_parameters, lengths) / model_parallel


def model_parallel_size() -> int:
    """The tensor- x pipeline-parallel ranks of one data-parallel replica (1 before megatron's parallel state)."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 1
    tp = parallel_state.get_tensor_model_parallel_world_size()
    return tp * parallel_state.get_pipeline_model_parallel_world_size()


class StepPerf:
    """Measures one training step at a time: ``start()``, then ``finish(lengths, seconds)`` gives its perf metrics."""

    def __init__(self, model: torch.nn.Module, spec: ModelSpec) -> None:
        self.spec = spec
        self.model_parallel = model_parallel_size()  # the ranks that share each row's FLOPs
        self.device = next(model.parameters()).device
        self.peak = peak_tflops(self.device)
        self.logprob_s = 0.0  # seconds of this step's frozen logprob passes (logprob_pass)
        self._alloc_retries = 0  # the caching allocator's retries before the step (a cumulative counter)

    def start(self) -> None:
        """Open a step: reset the device's peak-memory counter and the step's logprob-pass time."""
        self.logprob_s = 0.0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._alloc_retries = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)

    @contextlib.contextmanager
    def logprob_pass(self) -> Iterator[None]:
        """Time a frozen logprob pass (device work included) into :attr:`logprob_s`, the step's total."""
        self.synchronize()
        started = time.perf_counter()
        try:
            yield
        finally:
            self.synchronize()
            self.logprob_s += time.perf_counter() - started

    def synchronize(self) -> None:
        """Wait for the device's queued work, so a clock read after it covers the step."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def finish(self, lengths: list[int], seconds: float) -> dict[str, float]:
        """``tokens_per_s``, and on a GPU ``peak_memory_gib``, ``alloc_retries`` (the caching allocator's retries in
        the step: a failed allocation made it free its cached blocks and try again, stalling the device each time; 0
        unless memory is short) and (for a known device) ``mfu``, of the step."""
        metrics = {"tokens_per_s": sum(lengths) / seconds if seconds > 0 else 0.0}
        if self.device.type == "cuda":
            metrics["peak_memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            retries = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)
            metrics["alloc_retries"] = float(retries - self._alloc_retries)
        if self.peak is not None and seconds > 0:
            flops = rank_training_flops(self.spec, lengths, self.model_parallel)
            metrics["mfu"] = flops / seconds / (self.peak * 1e12)
        return metrics


@dataclass(frozen=True)
class StepWork:
    """What one RL step's training did, for its throughput: the tokens it trained and its logprob passes' time."""

    tokens: int  # prompt + response tokens of the step's trained rows, every data-parallel rank's
    logprob_s: float  # seconds of the frozen logprob passes inside the training step (the leader's)


SPLIT = ("generation", "logprob", "train", "refit", "other")
"""The parts of an RL step's wall time, logged as ``perf/split_<part>_s``."""


def step_throughput(window: Mapping[str, float], work: StepWork, generated_tokens: int, gpus: int) -> dict[str, float]:
    """An RL step's ``tokens_per_s_per_gpu`` (NeMo-RL's definition), ``generated_tokens_per_s`` and its split.

    ``window`` is the trainer's step window as :class:`~sc_lightning.callbacks.goodput.GoodputMonitor` splits it
    (``productive``, ``wait_rollouts``, ``refit``, ``checkpoint``, ``other``: they add up to the wall time);
    ``generated_tokens`` the completion tokens the step trained; ``gpus`` the run's devices (training and
    generation). The ``split_*_s`` parts add up to the wall time.
    """
    wall = sum(window.values())
    logprob = min(work.logprob_s, window["productive"])
    split = {
        "generation": window["wait_rollouts"],
        "logprob": logprob,
        "train": window["productive"] - logprob,
        "refit": window["refit"],
        "other": window["checkpoint"] + window["other"],
    }
    metrics = {f"split_{part}_s": split[part] for part in SPLIT}
    metrics |= {"step_tokens": float(work.tokens), "step_generated_tokens": float(generated_tokens)}
    if wall > 0:
        metrics["tokens_per_s_per_gpu"] = work.tokens / wall / max(gpus, 1)
        metrics["generated_tokens_per_s"] = generated_tokens / wall
    return metrics
