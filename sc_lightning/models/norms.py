"""The layer norms of every model here: torch's own, carrying megatron's sequence-parallel mark.

megatron-core's torch-norm wrapper refuses sequence parallelism (its fused norms come from Transformer Engine or
Apex, neither of which the CPU boxes or the GPU image have). Under sequence parallelism each tensor-parallel rank
normalises its own slice of the sequence, so a norm weight's gradient covers that slice only; megatron sums such
gradients over the tensor-parallel group (``finalize_model_grads``) for every parameter marked
``sequence_parallel``. :class:`TorchNorm` builds the same torch module megatron's wrapper builds and marks its
parameters, so the sum happens and the weights stay identical on every rank.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.transformer_config import TransformerConfig


class TorchNorm:
    """``torch.nn.RMSNorm`` or ``torch.nn.LayerNorm`` per ``config.normalization``, built like a megatron norm
    module (its spec calling convention), its parameters marked with ``config.sequence_parallel``."""

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_: object) -> torch.nn.Module:
        """The norm module (not a TorchNorm: the class only builds it)."""
        kinds = {"RMSNorm": torch.nn.RMSNorm, "LayerNorm": torch.nn.LayerNorm}
        if config.normalization not in kinds:
            raise ValueError(f"normalization {config.normalization!r} is not one of {sorted(kinds)}")
        norm = kinds[config.normalization](normalized_shape=hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel  # megatron's mark: sum the gradient over TP
        return norm
