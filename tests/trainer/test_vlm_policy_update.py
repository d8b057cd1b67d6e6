"""A vision-language policy trains through PolicyUpdate: its logprobs are the full forward's with the images, the
reference policy's KL pass sees them too, the vision tower learns, and image tokens never enter the loss."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sc_lightning.algorithms import ClippedPGLoss
from sc_lightning.models.spec import builtin_spec
from sc_lightning.trainer.chunks import TrainChunk
from sc_lightning.trainer.policy_update import PolicyUpdate, frozen_logprobs
from tests.helpers.vlm import image_prompt, random_images

pytestmark = pytest.mark.usefixtures("model_parallel")
SPEC = builtin_spec("builtin:tiny-vlm")
PROMPT = image_prompt(SPEC, [2], 0, [4, 13, 5, 16])  # bos, an image, "1+2="


def vlm_rows(seed: int, rows: int = 4, completion: int = 5) -> TrainChunk:
    """``rows`` rows of one image prompt each (its own image) and a random completion of ``completion`` digits,
    the last row's one shorter (right-padded)."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.tensor(PROMPT).expand(rows, -1)
    ids = torch.cat([prompt, torch.randint(3, 13, (rows, completion), generator=g)], dim=1)
    token_mask = torch.zeros(ids.shape)
    token_mask[:, len(PROMPT) :] = 1
    token_mask[-1, -1] = 0
    return TrainChunk(
        input_ids=ids,
        token_mask=token_mask,
        generation_logprobs=-torch.rand(ids.shape, generator=g) * token_mask,
        sample_mask=torch.ones(rows),
        advantages=torch.randn(rows, 1, generator=g).expand(ids.shape) * token_mask,
        rewards=torch.rand(rows, generator=g),
        group_ids=["g0"] * rows,
        start_weights=[0] * rows,
        pixel_values=list(random_images(SPEC, rows, seed=seed).split(1)),
    )


def new_vlm():
    from sc_lightning.models.vlm import build_vlm

    return build_vlm(SPEC, seed=0)


def test_trainer_logprobs_are_the_full_forward_with_images() -> None:
    from sc_lightning.models.logprobs import logprobs_from_logits
    from sc_lightning.models.vlm import vlm_logits

    model, chunk = new_vlm(), vlm_rows(0)
    got = frozen_logprobs(model, chunk, micro_batch_size=3, vocab_size=None, temperature=1.0)
    with torch.no_grad():
        want = logprobs_from_logits(vlm_logits(model, chunk.input_ids, chunk.pixel_values), chunk.input_ids)
        blind = dataclasses.replace(chunk, pixel_values=list(random_images(SPEC, 4, seed=99).split(1)))
    mask = chunk.token_mask.bool()
    assert (got[mask] - want[mask]).abs().max() < 1e-5
    other = frozen_logprobs(model, blind, micro_batch_size=3, vocab_size=None, temperature=1.0)
    assert (other[mask] - got[mask]).abs().max() > 1e-4  # other images, other logprobs: the images are read


def test_a_step_with_a_reference_policy_trains_the_vision_tower() -> None:
    model, reference = new_vlm(), new_vlm()
    before = model.vision_model.conv1.weight.detach().clone()
    projector = model.vision_projection.encoder.linear_fc1.weight.detach().clone()
    loss_fn = ClippedPGLoss(token_level_loss=True, reference_policy_kl_penalty=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    update = PolicyUpdate(model, optimizer, loss_fn, micro_batch_size=2, clip_grad=1.0, reference_model=reference)
    update.begin(step=0)
    update.train_chunk(vlm_rows(1))
    metrics = update.finish()
    assert abs(metrics["kl_penalty"]) < 1e-6  # the reference is the same weights, fed the same images
    assert metrics["global_valid_toks"] == 4 * 5 - 1
    assert not torch.equal(model.vision_model.conv1.weight, before)
    assert not torch.equal(model.vision_projection.encoder.linear_fc1.weight, projector)


def test_image_tokens_never_enter_the_loss() -> None:
    model, chunk = new_vlm(), vlm_rows(2)
    image_positions = chunk.input_ids == SPEC.vision.image_token_id
    assert image_positions.any() and not chunk.token_mask[image_positions].any()
    leaked = chunk.token_mask.clone()
    leaked[2, 3] = 1  # an <image> position of row 2
    update = PolicyUpdate(
        model,
        torch.optim.AdamW(model.parameters()),
        ClippedPGLoss(token_level_loss=True, reference_policy_kl_penalty=0.0),
        micro_batch_size=4,
        clip_grad=1.0,
    )
    update.begin()
    with pytest.raises(ValueError, match=r"rows \[2\] have <image> tokens .* in the loss"):
        update.train_chunk(dataclasses.replace(chunk, token_mask=leaked))
