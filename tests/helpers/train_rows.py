"""Rows to train the tiny policy and critic on, the seeded tiny policy, and one policy step over chunks of rows."""

from __future__ import annotations

import torch

from sc_lightning.algorithms import ClippedPGLoss
from sc_lightning.models import build_gpt_model, builtin_spec
from sc_lightning.trainer.chunks import TrainChunk
from sc_lightning.trainer.policy_update import PolicyUpdate

SPEC = builtin_spec("builtin:tiny")


def step_rows(seed: int, groups: int = 4, gens: int = 4, length: int = 12) -> TrainChunk:
    """Random rows of ``groups`` complete groups: 5 prompt tokens, then a completion of random length."""
    g = torch.Generator().manual_seed(seed)
    rows = groups * gens
    input_ids = torch.randint(3, SPEC.vocab_size, (rows, length), generator=g)
    completion = torch.randint(2, length - 5 + 1, (rows,), generator=g)
    positions = torch.arange(length)
    token_mask = ((positions >= 5) & (positions < 5 + completion[:, None])).float()
    return TrainChunk(
        input_ids=input_ids,
        token_mask=token_mask,
        generation_logprobs=-torch.rand(rows, length, generator=g) * token_mask,
        sample_mask=torch.ones(rows),
        advantages=torch.randn(rows, 1, generator=g).expand(rows, length) * token_mask,
        rewards=torch.rand(rows, generator=g),
        group_ids=[f"g{i // gens}" for i in range(rows)],
        start_weights=[0] * rows,
    )


def run_step(
    model,
    chunks: list[TrainChunk],
    *,
    micro_batch_size: int,
    token_level: bool = True,
    step: int = 0,
    version: int | None = None,
    **kwargs,
):
    """One step over ``chunks`` at trainer weight ``version``; ``kwargs`` go to PolicyUpdate (e.g.
    ``seq_logprob_error_threshold``)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss_fn = ClippedPGLoss(token_level_loss=token_level, reference_policy_kl_penalty=0.0)
    update = PolicyUpdate(model, optimizer, loss_fn, micro_batch_size=micro_batch_size, clip_grad=1.0, **kwargs)
    update.begin(step=step, version=version)
    for chunk in chunks:
        update.train_chunk(chunk)
    return update.finish()


def fresh() -> torch.nn.Module:
    """The same seeded tiny policy every time (megatron models hold process groups, so they do not deepcopy)."""
    return build_gpt_model(SPEC, precision="fp32", seed=0)


def critic_rows() -> TrainChunk:
    """Six seeded rows of 4 prompt and 3 completion tokens (the last row's completion one shorter) to train a
    critic on."""
    ids = torch.randint(0, 18, (6, 7), generator=torch.Generator().manual_seed(0))
    token_mask = torch.zeros(6, 7)
    token_mask[:, 4:] = 1
    token_mask[5, 6] = 0  # a shorter completion
    return TrainChunk(
        input_ids=ids,
        token_mask=token_mask,
        generation_logprobs=torch.zeros(6, 7),
        sample_mask=torch.ones(6),
        advantages=torch.zeros(6, 7),
        rewards=torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
    )
