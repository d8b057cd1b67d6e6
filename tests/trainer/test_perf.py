"""Throughput metrics: the FLOP count of the documented formula, and which metrics a device gets."""

from __future__ import annotations

import pytest
import torch

from sc_lightning.models import build_gpt_model, builtin_spec
from sc_lightning.trainer.perf import (
    StepPerf,
    StepWork,
    peak_tflops,
    rank_training_flops,
    step_throughput,
    training_flops,
)


def test_training_flops_count_each_row_by_its_own_length() -> None:
    spec = builtin_spec("builtin:tiny")
    attention = 12 * spec.num_layers * spec.hidden_size
    assert training_flops(spec, 1000, [3, 5]) == 6 * 1000 * 8 + attention * (9 + 25)
    assert training_flops(spec, 1000, [8]) > training_flops(spec, 1000, [4, 4])  # attention grows with length


def test_a_rank_counts_its_share_of_the_whole_models_flops() -> None:
    """MFU under tensor or pipeline parallelism: each of a replica's TP x PP ranks does an equal share of the whole
    model's FLOPs (its own parameters would drop the rest of the model from the first term but not attention's)."""
    spec = builtin_spec("builtin:tiny")
    model = build_gpt_model(spec, precision="fp32", seed=0)
    whole = training_flops(spec, sum(p.numel() for p in model.parameters()), [12, 20])  # one rank holds it all
    assert rank_training_flops(spec, [12, 20]) == whole
    assert rank_training_flops(spec, [12, 20], model_parallel=4) == whole / 4


def test_a_cpu_step_reports_tokens_per_second_only() -> None:
    model = build_gpt_model(builtin_spec("builtin:tiny"), precision="fp32", seed=0)
    perf = StepPerf(model, builtin_spec("builtin:tiny"))
    assert peak_tflops(torch.device("cpu")) is None
    perf.start()
    perf.synchronize()
    assert perf.finish([10, 30], seconds=0.5) == {"tokens_per_s": pytest.approx(80.0)}


def test_the_step_throughput_is_nemo_rls_figure_and_its_split_adds_up_to_the_wall_time() -> None:
    window = {"productive": 3.0, "wait_rollouts": 4.0, "refit": 0.5, "checkpoint": 0.25, "other": 0.25}  # 8 s
    perf = step_throughput(window, StepWork(tokens=64_000, logprob_s=1.0), generated_tokens=48_000, gpus=2)
    assert perf["tokens_per_s_per_gpu"] == 64_000 / 8.0 / 2  # prompt + response tokens / wall / GPUs = 4,000
    assert perf["generated_tokens_per_s"] == 48_000 / 8.0
    split = {part: perf[f"split_{part}_s"] for part in ("generation", "logprob", "train", "refit", "other")}
    assert split == {"generation": 4.0, "logprob": 1.0, "train": 2.0, "refit": 0.5, "other": 0.5}
    assert sum(split.values()) == 8.0
    assert perf["step_tokens"] == 64_000 and perf["step_generated_tokens"] == 48_000
    # a logprob time past the training step's (clocks a few microseconds apart) never makes the train part negative
    assert step_throughput(window, StepWork(10, 3.5), 5, 1)["split_train_s"] == 0.0
