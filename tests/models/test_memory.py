"""The GPU-memory floor of a trainer rank: what it counts, that it matches what was measured, and what it names."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sc_lightning.models.memory import (
    GIB,
    Parallel,
    activation_bytes_per_token,
    kv_row_bytes,
    memory_problem,
    state_bytes,
    training_memory,
)
from sc_lightning.models.spec import builtin_spec

MEDIUM = builtin_spec("builtin:medium")
KNOBS = {"model_knob": "policy.model_name", "tokens_knob": "policy.train_micro_batch_tokens"}


def test_the_state_is_sixteen_bytes_a_parameter_and_the_distributed_optimizer_shards_the_fp32_part() -> None:
    params = MEDIUM.num_parameters
    assert state_bytes(MEDIUM, "bf16", Parallel()) == 16 * params
    assert state_bytes(MEDIUM, "fp32", Parallel()) == 16 * params
    assert state_bytes(MEDIUM, "bf16", Parallel(data=4, distributed_optimizer=True)) == 4 * params + 12 * params // 4
    assert state_bytes(MEDIUM, "bf16", Parallel(tensor=2)) == 16 * (params // 2)


def test_a_token_keeps_34_h_a_layer_and_its_logits_and_checkpointing_keeps_only_the_inputs() -> None:
    h, layers, vocab = MEDIUM.hidden_size, MEDIUM.num_layers, MEDIUM.padded_vocab_size()
    assert activation_bytes_per_token(MEDIUM, "bf16", Parallel(), checkpointing=False) == layers * 34 * h + vocab * 6
    assert activation_bytes_per_token(MEDIUM, "fp32", Parallel(), checkpointing=False) == layers * 68 * h + vocab * 8
    recomputed = activation_bytes_per_token(MEDIUM, "bf16", Parallel(), checkpointing=True)
    assert recomputed == layers * 2 * h + 34 * h + vocab * 6


def test_the_1_26b_micro_batch_matches_the_activations_measured_on_the_gpu() -> None:
    """benchmarks/e2e.py's 1.26B shape: 16K-token micro-batches took ~28 GB of activations on the GPU."""
    plan = training_memory(builtin_spec("builtin:bench-1.26b"), precision="bf16", micro_batch_tokens=16_384)
    assert 0.8 * 28e9 <= plan.activations <= 1.2 * 28e9


def test_a_colocated_engine_keeps_its_replica_and_one_kv_row() -> None:
    alone = training_memory(MEDIUM, precision="bf16", micro_batch_tokens=4096)
    beside = training_memory(MEDIUM, precision="bf16", micro_batch_tokens=4096, colocated_context=2056)
    assert beside.engine == 2 * MEDIUM.num_parameters + kv_row_bytes(MEDIUM, 2056) and alone.engine == 0
    assert kv_row_bytes(MEDIUM, 2056) == 12 * 2 * 6 * 128 * 2056 * 2  # layers x K,V x groups x head x positions x bf16
    critic = training_memory(MEDIUM, precision="bf16", micro_batch_tokens=4096, critic=MEDIUM)
    assert critic.state == 2 * alone.state


@given(st.integers(1, 600_000), st.integers(8, 200))
def test_the_micro_batch_named_is_the_largest_that_fits(tokens: int, device_gib: int) -> None:
    plan = training_memory(MEDIUM, precision="bf16", micro_batch_tokens=tokens, colocated_context=2056)
    problem = memory_problem(plan, device_gib * GIB, micro_batch_tokens=tokens, **KNOBS)
    if plan.total <= device_gib * GIB:
        assert problem is None
        return
    assert problem is not None
    knob, why = problem
    if plan.state + plan.engine >= device_gib * GIB:
        assert knob == "policy.model_name" and "does not fit one rank" in why
        return
    assert knob == "policy.train_micro_batch_tokens"
    room = int(why.split("at most ")[1].split(" tokens")[0].replace(",", ""))
    fits = training_memory(MEDIUM, precision="bf16", micro_batch_tokens=room, colocated_context=2056)
    over = training_memory(MEDIUM, precision="bf16", micro_batch_tokens=room + 1, colocated_context=2056)
    assert fits.total <= device_gib * GIB < over.total


def test_a_model_too_big_for_the_device_is_named_with_its_sizes() -> None:
    plan = training_memory(builtin_spec("builtin:bench-1.26b"), precision="bf16", micro_batch_tokens=1024)
    knob, why = memory_problem(plan, 16 * GIB, micro_batch_tokens=1024, **KNOBS) or ("", "")
    assert knob == "policy.model_name"
    assert "of weights, gradients and optimizer state" in why and "on a 16.0 GiB device" in why
    assert "tensor_model_parallel_size" in why


def test_a_row_longer_than_the_room_left_names_the_sequence_length_not_the_micro_batch() -> None:
    """A micro-batch holds at least one whole row: when not even one fits, a smaller micro-batch cannot help."""
    plan = training_memory(MEDIUM, precision="bf16", micro_batch_tokens=300_000)
    room = (8 * GIB - plan.state) // plan.activation_per_token
    knob, why = memory_problem(
        plan, 8 * GIB, micro_batch_tokens=300_000, row=("policy.max_total_sequence_length", room + 1), **KNOBS
    ) or ("", "")
    assert knob == "policy.max_total_sequence_length" and f"only {room:,} tokens fit" in why
    knob, _ = memory_problem(
        plan, 8 * GIB, micro_batch_tokens=300_000, row=("policy.max_total_sequence_length", room), **KNOBS
    ) or ("", "")
    assert knob == "policy.train_micro_batch_tokens"
