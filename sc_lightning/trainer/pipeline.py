"""Pipeline parallelism in the train pump: micro-batches through megatron-core's pipeline schedule, the RL loss on
the last stage.

    stage 0:  embed + its layers ──send──► stage 1 … ──► last stage: layers + output layer → logits → RL loss
    1F1B: each stage runs forwards ahead, then one backward per forward; gradients accumulate as raw sums

Every stage of a data-parallel replica runs the same micro-batches (the same rows, planned the same way), so
they agree on the count and the shapes (``variable_seq_lengths``: each micro-batch's width is exchanged). The loss
function, metrics and valid counts exist on the last stage only; :class:`~sc_lightning.trainer.step_totals.
StepTotals` folds them over the pipeline group before the step is normalised, and the optimizer's
``finalize_model_grads`` sums the data-parallel gradients (and tied embeddings across the first and last stages).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from sc_lightning.models.cpu_compat import cuda_calls_on
from sc_lightning.models.logprobs import device_of
from sc_lightning.trainer.chunks import TrainChunk

LossOf = Callable[[TrainChunk, torch.Tensor], torch.Tensor]
"""The last stage's loss of a micro-batch from its logits (a raw sum; it backpropagates as is)."""


def pipeline_parallel_size() -> int:
    """The number of pipeline stages (1 before megatron's parallel state is initialised)."""
    if not parallel_state.model_parallel_is_initialized():
        return 1
    return parallel_state.get_pipeline_model_parallel_world_size()


def train_pipelined(model: torch.nn.Module, microbatches: Sequence[TrainChunk], loss_of: LossOf) -> None:
    """Forward and backward ``microbatches`` through the pipeline (every stage of the replica calls this with the
    same micro-batches); ``loss_of`` runs on the last stage. Gradients accumulate in the parameters' buffers."""
    if not microbatches:
        return
    device = device_of(model)

    def forward_step(data: Iterator[TrainChunk], stage: torch.nn.Module) -> tuple[torch.Tensor, Callable]:
        """One micro-batch through this stage: its output, and the loss function the last stage applies."""
        batch = next(data)
        return stage(batch.input_ids.to(device), None, None), partial(_last_stage_loss, loss_of, batch)

    with cuda_calls_on(device):
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(microbatches),
            model=[model],
            num_microbatches=len(microbatches),
            seq_length=max(batch.input_ids.shape[1] for batch in microbatches),
            micro_batch_size=max(len(batch) for batch in microbatches),
            forward_only=False,
        )


def _last_stage_loss(
    loss_of: LossOf, batch: TrainChunk, logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """megatron's loss-function protocol with ``calculate_per_token_loss``: (loss, tokens, reduced); the schedule
    then backpropagates the loss unscaled (the trainer normalises the whole step once)."""
    return loss_of(batch, logits), torch.tensor(0, dtype=torch.int), {}
