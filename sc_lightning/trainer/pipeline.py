"""Pipeline parallelism in the train pump: micro-batches through megatron-core's pipeline schedule, the RL losses
and every per-token read (pi_old, the reference's logprobs, the critic's values) on the last stage.

    stage 0:  embed + its layers ──send──► stage 1 … ──► last stage: layers + output layer → logits / values
    training (1F1B): each stage runs forwards ahead, then one backward per forward; gradients accumulate as raw sums
    forward only: the same pass without backward, under no_grad; the last stage reads each micro-batch's output

Every stage of a data-parallel replica runs the same micro-batches (the same rows, planned the same way), so
they agree on the count and the shapes (``variable_seq_lengths``: each micro-batch's width is exchanged). A
micro-batch is a pair: the token ids every stage needs (the first embeds them) and what the last stage needs with
its output (the rows, the targets). Loss, metrics and per-token reads exist on the last stage only:
:class:`~sc_lightning.trainer.step_totals.StepTotals` folds the counts and metrics over the pipeline group before a
step is normalised, :func:`from_last_stage` hands a value the last stage computed to every stage, and the
optimizer's ``finalize_model_grads`` sums the data-parallel gradients (and tied embeddings across the first and last
stages). Micro-batches are cut lazily, one at a time, as the schedule asks for them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from sc_lightning.models.cpu_compat import cuda_calls_on
from sc_lightning.models.logprobs import device_of
from sc_lightning.trainer.chunks import TrainChunk
from sc_lightning.trainer.microbatch import MicroBatchPlan

_P = TypeVar("_P")


ModelInput = torch.Tensor | tuple[torch.Tensor, Sequence[torch.Tensor]]
"""What a micro-batch feeds the model: token ids (b, t), or token ids and each row's images (uint8 (n, H, W, 3)) for
a vision-language policy (:class:`~sc_lightning.models.vlm.VisionLanguageModel`)."""

MicroBatches = Iterable[tuple[ModelInput, _P]]
"""Micro-batches as (the model's input, what the last stage needs with the output)."""

LastStage = Callable[[_P, torch.Tensor], torch.Tensor | None]
"""The last stage's work on a micro-batch's output: training returns its loss (a raw sum, backpropagated as is);
a forward-only read returns None."""


def pipeline_parallel_size() -> int:
    """The number of pipeline stages (1 before megatron's parallel state is initialised)."""
    if not parallel_state.model_parallel_is_initialized():
        return 1
    return parallel_state.get_pipeline_model_parallel_world_size()


def model_input(rows: TrainChunk) -> ModelInput:
    """What the model is fed for ``rows``: their token ids, and each row's images when the chunk carries them."""
    return rows.input_ids if rows.pixel_values is None else (rows.input_ids, rows.pixel_values)


def microbatch_shape(plans: Sequence[MicroBatchPlan]) -> tuple[int, int]:
    """The largest (rows, columns) of planned micro-batches (the pipeline schedule's buffer shape)."""
    return max((len(plan.rows) for plan in plans), default=0), max((plan.width for plan in plans), default=0)


def train_microbatches(
    model: torch.nn.Module,
    microbatches: MicroBatches,
    last_stage: LastStage,
    *,
    count: int,
    shape: tuple[int, int],
    backward: Callable[[torch.Tensor], None],
) -> None:
    """Forward and backward ``count`` micro-batches; ``last_stage`` returns each one's loss (a raw sum) from the
    model's output. Gradients accumulate in the parameters' buffers. With pipeline stages megatron's schedule runs
    them (every stage of the replica calls this with the same micro-batches; ``shape`` is the largest one's (rows,
    columns)); otherwise each is run and ``backward`` is called on its loss."""
    _run_microbatches(model, microbatches, last_stage, count=count, shape=shape, backward=backward)


def forward_microbatches(
    model: torch.nn.Module, microbatches: MicroBatches, last_stage: LastStage, *, count: int, shape: tuple[int, int]
) -> None:
    """Forward ``count`` micro-batches in eval mode without gradients; ``last_stage`` reads each output (through
    megatron's schedule with pipeline stages, as :func:`train_microbatches`)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            _run_microbatches(model, microbatches, last_stage, count=count, shape=shape, backward=None)
    finally:
        model.train(was_training)


def _run_microbatches(
    model: torch.nn.Module,
    microbatches: MicroBatches,
    last_stage: LastStage,
    *,
    count: int,
    shape: tuple[int, int],
    backward: Callable[[torch.Tensor], None] | None,
) -> None:
    """Through megatron's schedule with pipeline stages, else one by one; ``backward`` None: forward only."""
    if pipeline_parallel_size() > 1:
        _run_schedule(model, microbatches, last_stage, count=count, shape=shape, forward_only=backward is None)
        return
    device = device_of(model)
    with _sequence_parallel_calls(model, device):
        for inputs, payload in microbatches:
            result = last_stage(payload, _forward(model, inputs, device))
            if backward is not None:
                backward(result)


def per_token_forward(
    model: torch.nn.Module,
    chunk: TrainChunk,
    plans: Sequence[MicroBatchPlan],
    of_output: Callable[[TrainChunk, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """A (B, T) fp32 per-token read of ``chunk`` without gradient: ``of_output(micro-batch, model output)`` placed at
    each planned micro-batch's rows and columns; 0 elsewhere (rows no plan covers, columns past a micro-batch's
    width), and everywhere on the stages before the last (which never read it)."""
    out = torch.zeros(chunk.input_ids.shape, dtype=torch.float32, device=chunk.input_ids.device)

    def read(item: tuple[MicroBatchPlan, TrainChunk], output: torch.Tensor) -> None:
        """Place one micro-batch's values."""
        plan, rows = item
        out[torch.tensor(plan.rows, device=out.device), : plan.width] = of_output(rows, output).to(out.device)

    batches = ((model_input(rows), (plan, rows)) for plan in plans for rows in [chunk.select(plan)])
    forward_microbatches(model, batches, read, count=len(plans), shape=microbatch_shape(plans))
    return out


def _run_schedule(
    model: torch.nn.Module,
    microbatches: MicroBatches,
    last_stage: LastStage,
    *,
    count: int,
    shape: tuple[int, int],
    forward_only: bool,
) -> None:
    if count == 0:
        return
    device = device_of(model)

    multiple = _width_multiple(model)

    def forward_step(data: Iterator[tuple[torch.Tensor, Any]], stage: torch.nn.Module) -> tuple[torch.Tensor, Any]:
        """One micro-batch through this stage: its output, and the function the last stage applies to it."""
        inputs, payload = next(data)
        output = _call(stage, inputs, multiple, device)
        return output, partial(_last_stage_output, last_stage, payload, _token_ids(inputs).shape[1])

    with cuda_calls_on(device):
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(microbatches),
            model=[model],
            num_microbatches=count,
            seq_length=-(-shape[1] // multiple) * multiple,
            micro_batch_size=shape[0],
            forward_only=forward_only,
        )


def _last_stage_output(
    last_stage: LastStage, payload: Any, width: int, output: torch.Tensor
) -> tuple[torch.Tensor, Any, dict]:
    """megatron's loss-function protocol with ``calculate_per_token_loss``: (loss, tokens, reduced); the schedule
    then backpropagates the loss unscaled (the trainer normalises the whole step once). The output is cut back to the
    micro-batch's ``width`` (sequence parallelism pads it)."""
    loss = last_stage(payload, _cut(output, width))
    if loss is None:  # a forward-only read
        loss = torch.zeros((), device=output.device)
    return loss, torch.tensor(0, dtype=torch.int), {}


def _width_multiple(model: torch.nn.Module) -> int:
    """What a micro-batch's width must be a multiple of: the TP size under sequence parallelism (each rank keeps an
    equal slice of the sequence), else 1."""
    config = getattr(model, "config", None)
    if config is None or not config.sequence_parallel:
        return 1
    return parallel_state.get_tensor_model_parallel_world_size()


def _pad_width(input_ids: torch.Tensor, multiple: int) -> torch.Tensor:
    """``input_ids`` right-padded (with id 0) to a width that is a multiple of ``multiple``. Attention is causal, so
    the padding changes no output at the real positions."""
    missing = -input_ids.shape[1] % multiple
    return torch.nn.functional.pad(input_ids, (0, missing)) if missing else input_ids


def _sequence_parallel_calls(model: torch.nn.Module, device: torch.device) -> contextlib.AbstractContextManager:
    """Around a sequence-parallel model's forwards and backwards on the CPU: megatron's sequence gathers and
    scatters allocate on ``torch.cuda.current_device()`` (:func:`~sc_lightning.models.cpu_compat.cuda_calls_on`)."""
    return cuda_calls_on(device) if _width_multiple(model) > 1 else contextlib.nullcontext()


def _forward(model: torch.nn.Module, inputs: ModelInput, device: torch.device) -> torch.Tensor:
    """``model``'s output for ``inputs`` (padded as sequence parallelism needs, the output cut back)."""
    return _cut(_call(model, inputs, _width_multiple(model), device), _token_ids(inputs).shape[1])


def _token_ids(inputs: ModelInput) -> torch.Tensor:
    """The token ids of a micro-batch's model input."""
    return inputs if isinstance(inputs, torch.Tensor) else inputs[0]


def _call(model: torch.nn.Module, inputs: ModelInput, multiple: int, device: torch.device) -> torch.Tensor:
    """``model``'s output for ``inputs``, the token ids padded to a width that is a multiple of ``multiple``."""
    input_ids = _pad_width(_token_ids(inputs), multiple).to(device)
    if isinstance(inputs, torch.Tensor):
        return model(input_ids, None, None)
    return model(input_ids, None, None, images=inputs[1])


def _cut(output: torch.Tensor, width: int) -> torch.Tensor:
    """``output`` (B, T', ...) cut back to ``width`` columns (contiguous, as megatron's cross entropy needs)."""
    return output if output.shape[1] == width else output[:, :width].contiguous()


def from_last_stage(value: float, device: torch.device) -> float:
    """``value`` as the last pipeline stage computed it, on every stage (itself without pipelining)."""
    if pipeline_parallel_size() == 1:
        return value
    group = parallel_state.get_pipeline_model_parallel_group()
    last = parallel_state.get_pipeline_model_parallel_last_rank()  # a global rank
    held = torch.tensor([value], dtype=torch.float64, device=device)
    torch.distributed.broadcast(held, src=last, group=group)
    return float(held.item())
