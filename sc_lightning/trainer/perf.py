"""Training throughput of each RL step: ``perf/tokens_per_s``, ``perf/mfu`` and ``perf/peak_memory_gib``.

Model FLOPs of one trained row of ``L`` tokens (forward + backward, the usual dense-transformer count)::

    6 * P * L  +  12 * layers * hidden * L**2

``P`` counts every parameter (embeddings included); the second term is attention's score and value products
(causal masking not discounted, as megatron and PaLM count it). Only tokens the model actually ran count: a row's
length ends at its last loss-counted token and padding is excluded. MFU is those FLOPs over the step's training time
and the device's dense bf16 peak (:data:`DENSE_BF16_PEAK_TFLOPS`, matched on the device name; no MFU is logged on a
CPU or an unknown GPU). The time is the step's policy-training time (waits for rollouts excluded), read after the
device has finished its work. For PPO the critic's work is in that time but not in the FLOPs.
"""

from __future__ import annotations

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


class StepPerf:
    """Measures one training step at a time: ``start()``, then ``finish(lengths, seconds)`` gives its perf metrics."""

    def __init__(self, model: torch.nn.Module, spec: ModelSpec) -> None:
        self.spec = spec
        self.parameters = sum(p.numel() for p in model.parameters())
        self.device = next(model.parameters()).device
        self.peak = peak_tflops(self.device)

    def start(self) -> None:
        """Open a step: reset the device's peak-memory counter."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def synchronize(self) -> None:
        """Wait for the device's queued work, so a clock read after it covers the step."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def finish(self, lengths: list[int], seconds: float) -> dict[str, float]:
        """``tokens_per_s``, and on a GPU ``peak_memory_gib`` and (for a known device) ``mfu``, of the step."""
        metrics = {"tokens_per_s": sum(lengths) / seconds if seconds > 0 else 0.0}
        if self.device.type == "cuda":
            metrics["peak_memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        if self.peak is not None and seconds > 0:
            metrics["mfu"] = training_flops(self.spec, self.parameters, lengths) / seconds / (self.peak * 1e12)
        return metrics
