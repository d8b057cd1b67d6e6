"""Per-token log-probabilities of a megatron ``GPTModel``, the one definition training, inference and tests share.

``token_logprobs(model, ids)[b, t] = log p(ids[b, t] | ids[b, :t])`` for ``t >= 1`` and 0 at ``t = 0`` (nothing
predicts the first token). Attention is causal, so right-padding never changes the values at real tokens; left
padding is not supported (RoPE positions always start at 0). Logits stay vocab-parallel at TP > 1: the softmax
normaliser is all-reduced over the tensor-parallel group (megatron's ``vocab_parallel_cross_entropy``, computed in
fp32), never gathered. Embedding rows past the real vocabulary (TP padding) are masked out of the softmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from torch import Tensor

from sc_lightning.models.fused import target_logprobs

REAL_VOCAB_ATTR = "real_vocab_size"


def real_vocab_size(model: torch.nn.Module) -> int | None:
    """The unpadded vocabulary recorded on ``model`` (or on the module a wrapper holds) by ``build_gpt_model``."""
    while model is not None:
        size = getattr(model, REAL_VOCAB_ATTR, None)
        if size is not None:
            return int(size)
        model = getattr(model, "module", None)
    return None


def device_of(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s parameters (token ids are moved there)."""
    return next(model.parameters()).device


def _mask_padded_vocab(logits: Tensor, vocab_size: int | None) -> Tensor:
    """``logits`` (this rank's vocab slice) with the columns of ids ``>= vocab_size`` set to -inf."""
    local = logits.size(-1)
    start = parallel_state.get_tensor_model_parallel_rank() * local
    if vocab_size is None or start + local <= vocab_size:
        return logits
    ids = torch.arange(start, start + local, device=logits.device)
    return logits.masked_fill(ids >= vocab_size, float("-inf"))


def logprobs_from_logits(
    logits: Tensor, input_ids: Tensor, *, vocab_size: int | None = None, temperature: float = 1.0
) -> Tensor:
    """``(B, T)`` fp32 log-probs of ``input_ids`` from vocab-parallel ``logits`` ``(B, T, V/TP)`` (position 0 is 0).

    Differentiable. ``logits`` may be overwritten (megatron's cross entropy works in place to save memory) when it
    is already fp32 and no temperature or masking applies: do not reuse it afterwards.
    """
    targets = torch.roll(input_ids, shifts=-1, dims=1)  # (B, T): position t scores token t+1; the last is a dummy
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        width = logits.size(-1)
        real = width if vocab_size is None else min(vocab_size, width)
        fused = target_logprobs(logits.reshape(-1, width), targets.reshape(-1), real, temperature)
        if fused is not None:  # on a GPU: one pass over the logits instead of megatron's six
            return F.pad(fused.view(targets.shape)[:, :-1], (1, 0), value=0.0)
    if temperature != 1.0:
        logits = logits / temperature
    logits = _mask_padded_vocab(logits, vocab_size)
    nll = tensor_parallel.vocab_parallel_cross_entropy(logits, targets)  # (B, T) fp32
    return F.pad(-nll[:, :-1], (1, 0), value=0.0)


def token_logprobs(
    model: torch.nn.Module, input_ids: Tensor, *, temperature: float = 1.0, vocab_size: int | None = None
) -> Tensor:
    """``(B, T)`` fp32: ``log p(input_ids[:, t] | input_ids[:, :t])``, 0 at ``t = 0``; differentiable.

    ``input_ids`` is ``(B, T)`` long, right-padded with any id (moved to the model's device). ``temperature``
    divides the logits first (use the sampling temperature to score what an engine sampled). ``vocab_size``
    defaults to the real vocabulary recorded by ``build_gpt_model``. Works at any TP size (all TP ranks call it
    with the same ids).
    """
    input_ids = input_ids.to(device_of(model))
    logits = model(input_ids, None, None)  # (B, T, V/TP)
    vocab = vocab_size if vocab_size is not None else real_vocab_size(model)
    return logprobs_from_logits(logits, input_ids, vocab_size=vocab, temperature=temperature)


def logits_of(model: torch.nn.Module, input_ids: Tensor, *, vocab_size: int | None = None) -> Tensor:
    """``(B, T, vocab)`` fp32 logits over the real vocabulary (all-gathered at TP > 1, without gradient there)."""
    logits = model(input_ids.to(device_of(model)), None, None).float()  # (B, T, V/TP)
    tp = parallel_state.get_tensor_model_parallel_world_size()
    if tp > 1:
        parts = [torch.empty_like(logits) for _ in range(tp)]
        group = parallel_state.get_tensor_model_parallel_group()
        torch.distributed.all_gather(parts, logits.detach().contiguous(), group=group)
        logits = torch.cat(parts, dim=-1)
    vocab = vocab_size if vocab_size is not None else real_vocab_size(model)
    return logits if vocab is None else logits[..., :vocab]
