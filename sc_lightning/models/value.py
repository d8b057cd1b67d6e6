"""The PPO critic: a megatron-core ``GPTModel`` whose vocabulary projection is replaced by a scalar value head.

The backbone is built like a policy (:func:`~sc_lightning.models.megatron.load_policy`: a builtin or an HF
checkpoint), then :func:`attach_value_head` swaps ``output_layer`` for :class:`ValueHead` — a zero-initialised
``hidden -> 1`` linear, so a fresh critic predicts 0 everywhere — and unties it from the embedding. Everything else
(transformer layers, final norm, TP/PP) is megatron-core's own.

:func:`token_values` aligns values with log-probs: ``values[:, t]`` is the estimate for the state *before* token
``t`` (read from position ``t - 1``), 0 at ``t = 0``.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core import tensor_parallel
from torch import Tensor

from sc_lightning.models.logprobs import device_of


class ValueHead(torch.nn.Module):
    """``hidden (S, B, H) -> values (S, B, 1)``, called like a GPTModel output layer; starts at zero.

    Its parameters are ``weight`` (1, H) and ``bias`` (1,), the names megatron's sharded state dict expects of an
    output layer (checkpoints that name them ``linear.weight`` / ``linear.bias`` still load). With
    ``sequence_parallel`` the hidden states arrive as this tensor-parallel rank's slice of the sequence: the head
    gathers the whole sequence first (every rank then holds the same values and computes the same loss, so the
    backward hands each rank its own slice's gradient instead of summing the copies).
    """

    def __init__(self, hidden_size: int, dtype: torch.dtype, *, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=dtype))
        self.sequence_parallel = sequence_parallel  # also read by GPTModel's inference path
        self.register_load_state_dict_pre_hook(_rename_linear_keys)

    def forward(self, hidden: Tensor, weight: Tensor | None = None, **_: Any) -> tuple[Tensor, None]:
        """The values and no bias (the output-layer calling convention)."""
        if self.sequence_parallel:
            hidden = tensor_parallel.gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return torch.nn.functional.linear(hidden, self.weight, self.bias), None


def _rename_linear_keys(_: torch.nn.Module, state_dict: dict[str, Tensor], prefix: str, *__: Any) -> None:
    """Load a head saved as ``linear.weight`` / ``linear.bias`` (before its parameters took megatron's names)."""
    for name in ("weight", "bias"):
        if f"{prefix}linear.{name}" in state_dict:
            state_dict[f"{prefix}{name}"] = state_dict.pop(f"{prefix}linear.{name}")


def attach_value_head(model: torch.nn.Module) -> torch.nn.Module:
    """Replace ``model``'s vocabulary projection by a :class:`ValueHead` (untied from the embedding).

    With pipeline stages only the last stage has the projection; every stage unties (megatron then sums no
    embedding gradient between the first and the last stage).
    """
    config = model.config
    if model.post_process:
        device = next(model.parameters()).device
        head = ValueHead(config.hidden_size, config.params_dtype, sequence_parallel=config.sequence_parallel)
        model.output_layer = head.to(device)
    model.share_embeddings_and_output_weights = False
    return model


def values_from_output(output: Tensor) -> Tensor:
    """``(B, T)`` fp32 values aligned with log-probs from the critic's (last stage's) output ``(B, T, 1)``."""
    values = output[..., 0].float()  # (B, T): after reading token t
    return torch.nn.functional.pad(values[:, :-1], (1, 0))  # shift right: the state before token t


def token_values(critic: torch.nn.Module, input_ids: Tensor) -> Tensor:
    """``(B, T)`` fp32 values aligned with log-probs (the state before each token; 0 at ``t = 0``); differentiable."""
    return values_from_output(critic(input_ids.to(device_of(critic)), None, None))


def load_critic(model_name: str, **policy_kwargs: Any) -> torch.nn.Module:
    """A critic on the backbone ``model_name`` (``policy_kwargs`` as for ``load_policy``), with a fresh value head.

    The backbone's own tokenizer is not used (the critic reads the policy's token ids), so it is not checked here.
    """
    from sc_lightning.models.megatron import load_policy

    model, _, _ = load_policy(model_name, check_tokenizer=False, **policy_kwargs)
    return attach_value_head(model)
