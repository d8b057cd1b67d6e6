"""What one trainer rank's GPU must hold for a model, estimated from its shape before anything is built.

The estimate is a floor, not a forecast: it counts what must exist at the peak of a training micro-batch and leaves
out what varies (the allocator's fragmentation, cuBLAS workspaces, NCCL buffers, CUDA graphs). A config whose floor
exceeds the device cannot run, and preflight says so before anything starts, naming the knob that fixes it
(:func:`memory_problem`); one under it may still run short, and the engine's KV cache then takes only what is left
(its own budget, ``mcore_generation_config.kv_cache_memory_fraction``).

Per rank, with ``P`` the model's parameters over its tensor- and pipeline-parallel split:

    state        bf16: weights 2 B, gradients 2 B, fp32 master weights 4 B and two AdamW moments 8 B a parameter
                 (the masters and moments divided by the data-parallel ranks under the distributed optimizer);
                 fp32: 4 + 4 + 8 B
    activations  a micro-batch's tokens x (layers x 34 h bytes in 16-bit, 68 in fp32: what a transformer layer keeps
                 for its backward without recomputation, attention scores not materialised; with activation
                 checkpointing each layer keeps its 2 h input and one layer at a time the 34 h) + the logits, 6 B a
                 vocabulary entry (the bf16 logits and their fp32 log-softmax)
    engine       a colocated engine's own replica (2 B a parameter in bf16) and one KV-cache row (its context, all
                 layers, K and V): it stands down, freeing its cache, while the trainer steps, but keeps its replica

Measured at the 1.26B shape (hidden 2048, 24 layers, 16K-token micro-batches): ~28 GB of activations, 35 h bytes a
token a layer; the 34 h above is that without the logits (benchmarks/README.md, "End to end").
"""

from __future__ import annotations

from dataclasses import dataclass

from sc_lightning.models.spec import ModelSpec

GIB = 1024**3
LAYER_BYTES_PER_HIDDEN = 34
"""16-bit bytes a transformer layer keeps per token and unit of hidden size for its backward (no recomputation)."""


@dataclass(frozen=True)
class Parallel:
    """How a model is split over the ranks: tensor- and pipeline-parallel sizes, data-parallel ranks, and whether the
    optimizer state is sharded over the latter (megatron-core's distributed optimizer)."""

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    distributed_optimizer: bool = False


@dataclass(frozen=True)
class TrainingMemory:
    """The floor of one rank's GPU memory at a training micro-batch's peak, in bytes, by what holds it."""

    state: int  # weights, gradients, master weights and optimizer moments of every trained model
    activations: int  # one micro-batch of the policy, kept for its backward, and its logits
    engine: int  # a colocated engine's replica and one KV-cache row
    activation_per_token: int  # what each micro-batch token adds to ``activations``

    @property
    def total(self) -> int:
        """Everything that must fit at once."""
        return self.state + self.activations + self.engine


def state_bytes(spec: ModelSpec, precision: str, parallel: Parallel) -> int:
    """Weights, gradients, fp32 masters and AdamW moments of one rank's share of ``spec``'s model."""
    params = spec.num_parameters // (parallel.tensor * parallel.pipeline)
    sharded = parallel.data if parallel.distributed_optimizer else 1
    if precision == "bf16":
        return params * (2 + 2) + params * (4 + 8) // sharded
    return params * (4 + 4) + params * 8 // sharded


def activation_bytes_per_token(spec: ModelSpec, precision: str, parallel: Parallel, *, checkpointing: bool) -> int:
    """Bytes one micro-batch token keeps on a rank until its backward: the layers' activations and the logits."""
    width = 2 if precision == "bf16" else 4  # bytes of an activation
    layers = spec.num_layers // parallel.pipeline
    per_layer = LAYER_BYTES_PER_HIDDEN // 2 * width * spec.hidden_size // parallel.tensor
    kept = layers * width * spec.hidden_size + per_layer if checkpointing else layers * per_layer
    logits = spec.padded_vocab_size(parallel.tensor) // parallel.tensor * (width + 4)
    return kept + logits


def kv_row_bytes(spec: ModelSpec, positions: int) -> int:
    """One request's bf16 KV cache over ``positions`` positions: every layer's K and V for each query group."""
    return spec.num_layers * 2 * spec.num_query_groups * spec.kv_channels * positions * 2


def training_memory(
    spec: ModelSpec,
    *,
    precision: str,
    micro_batch_tokens: int,
    parallel: Parallel = Parallel(),
    checkpointing: bool = False,
    colocated_context: int | None = None,
    critic: ModelSpec | None = None,
) -> TrainingMemory:
    """The floor of one rank's memory (module docstring) training ``spec`` in micro-batches of
    ``micro_batch_tokens`` padded tokens, with a colocated engine over ``colocated_context`` positions when given, and
    a critic of shape ``critic`` beside it."""
    state = state_bytes(spec, precision, parallel)
    if critic is not None:
        state += state_bytes(critic, precision, parallel)
    per_token = activation_bytes_per_token(spec, precision, parallel, checkpointing=checkpointing)
    engine = 0
    if colocated_context is not None:
        engine = spec.num_parameters * 2 + kv_row_bytes(spec, colocated_context)
    return TrainingMemory(state, per_token * micro_batch_tokens, engine, per_token)


def memory_problem(
    plan: TrainingMemory,
    device_bytes: int,
    *,
    model_knob: str,
    tokens_knob: str,
    micro_batch_tokens: int,
    row: tuple[str, int] | None = None,
) -> tuple[str, str] | None:
    """``(knob, why)`` when ``plan`` cannot fit a device of ``device_bytes``, or None when its floor fits.

    Without room for the state (and the engine) the model is too big for the rank (``model_knob``); otherwise the
    micro-batch is, and the largest that fits is named for ``tokens_knob`` — unless even one row of ``row`` (its
    length knob and tokens: a micro-batch holds at least one whole row) does not fit, which names that knob."""
    if plan.total <= device_bytes:
        return None
    fixed = plan.state + plan.engine
    sizes = (
        f"at least {plan.total / GIB:.1f} GiB ({plan.state / GIB:.1f} GiB of weights, gradients and optimizer state, "
        f"{plan.activations / GIB:.1f} GiB of activations for a {micro_batch_tokens:,}-token micro-batch"
        + (f", {plan.engine / GIB:.1f} GiB for the colocated engine" if plan.engine else "")
        + f") on a {device_bytes / GIB:.1f} GiB device"
    )
    if fixed >= device_bytes:
        return model_knob, (
            f"needs {sizes}: the model alone does not fit one rank; split it (policy.megatron_cfg."
            "tensor_model_parallel_size, or use_distributed_optimizer over more data-parallel ranks) or train a "
            "smaller one"
        )
    room = (device_bytes - fixed) // plan.activation_per_token
    if row is not None and room < row[1]:
        return row[0], (
            f"is {row[1]:,} tokens, and a micro-batch holds at least one whole row, but only {room:,} tokens fit "
            f"beside the model: {sizes}; shorten it, or turn on activation checkpointing"
        )
    return tokens_knob, f"needs {sizes}: set it to at most {room:,} tokens (or turn on activation checkpointing)"
