"""Reference computations for the engine tests: full forward passes without a KV cache."""

from __future__ import annotations

import torch


def full_logits(model: torch.nn.Module, ids: tuple[int, ...]) -> torch.Tensor:
    """``(T, vocab)`` fp32 logits of one sequence from a plain full forward pass."""
    from sc_lightning.models import logits_of

    with torch.no_grad():
        return logits_of(model, torch.tensor([ids]))[0]


def greedy_reference(model: torch.nn.Module, prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
    """The greedy continuation of ``prompt`` by repeated full forward passes (no KV cache), ``n`` tokens."""
    ids = tuple(prompt)
    for _ in range(n):
        ids += (int(full_logits(model, ids)[-1].argmax()),)
    return ids[len(prompt) :]


def follows_argmax(model: torch.nn.Module, prompt: tuple[int, ...], tokens: tuple[int, ...]) -> list[bool]:
    """For each completion token: whether it is the argmax of a full forward pass over prompt + completion."""
    logits = full_logits(model, tuple(prompt) + tuple(tokens))
    argmax = logits[len(prompt) - 1 : -1].argmax(-1).tolist()
    return [a == t for a, t in zip(argmax, tokens, strict=True)]
