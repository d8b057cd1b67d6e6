"""Throughput metrics: the FLOP count of the documented formula, and which metrics a device gets."""

from __future__ import annotations

import pytest
import torch

from sc_lightning.models import build_gpt_model, builtin_spec
from sc_lightning.trainer.perf import StepPerf, peak_tflops, training_flops


def test_training_flops_count_each_row_by_its_own_length() -> None:
    spec = builtin_spec("builtin:tiny")
    attention = 12 * spec.num_layers * spec.hidden_size
    assert training_flops(spec, 1000, [3, 5]) == 6 * 1000 * 8 + attention * (9 + 25)
    assert training_flops(spec, 1000, [8]) > training_flops(spec, 1000, [4, 4])  # attention grows with length


def test_a_cpu_step_reports_tokens_per_second_only() -> None:
    model = build_gpt_model(builtin_spec("builtin:tiny"), precision="fp32", seed=0)
    perf = StepPerf(model, builtin_spec("builtin:tiny"))
    assert peak_tflops(torch.device("cpu")) is None
    perf.start()
    perf.synchronize()
    assert perf.finish([10, 30], seconds=0.5) == {"tokens_per_s": pytest.approx(80.0)}
