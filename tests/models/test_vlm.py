"""The vision-language model: builtin:tiny-vlm's shape and tokenizer, merged embeddings, the full forward."""

from __future__ import annotations

import pytest
import torch

from sc_lightning.models.spec import VisionSpec, builtin_spec
from sc_lightning.tokenizer import CharImageTokenizer, load_tokenizer
from tests.helpers.vlm import image_prompt, random_images

pytestmark = pytest.mark.usefixtures("model_parallel")
SPEC = builtin_spec("builtin:tiny-vlm")
BOS, TEXT = [2], [4, 13, 5, 16]  # "1+2="


@pytest.fixture(scope="module")
def vlm():
    from sc_lightning.models.vlm import build_vlm

    return build_vlm(SPEC, seed=0)


def test_tiny_vlm_spec_tokenizer_and_parameters(vlm) -> None:
    from sc_lightning.models.vlm_weights import vision_param_shapes

    vision = SPEC.vision
    assert (vision.image_size, vision.patch_size, vision.tokens_per_image) == (32, 8, 16)
    tokenizer = load_tokenizer("builtin:tiny-vlm")
    assert isinstance(tokenizer, CharImageTokenizer)
    assert tokenizer.image_token_id == vision.image_token_id and tokenizer.vocab_size == SPEC.vocab_size
    assert tokenizer.encode("<image>1+2=") == [vision.image_token_id, *TEXT]
    assert tokenizer.decode([vision.image_token_id, *TEXT]) == "1+2="
    vision_params = {n: tuple(p.shape) for n, p in vlm.named_parameters() if not n.startswith("language_model.")}
    assert vision_params == vision_param_shapes(SPEC)
    assert sum(p.numel() for p in vlm.parameters()) == SPEC.num_parameters
    with pytest.raises(ValueError, match="patch_size"):
        VisionSpec(30, 8, 32, 1, 2, 64, 64, image_token_id=18)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        SPEC.replace(vocab_size=18)
    with pytest.raises(ValueError, match="one pipeline stage"):
        SPEC.check_parallel(1, 2)


def test_merged_embeddings_replace_image_positions_in_order(vlm) -> None:
    from sc_lightning.models.vlm import image_embeddings, merged_embeddings

    images = random_images(SPEC, 3, seed=1)
    ids = torch.tensor(
        [image_prompt(SPEC, BOS, 0, TEXT, 1, TEXT), image_prompt(SPEC, BOS, TEXT, 2, TEXT, TEXT[:1] * 16)]
    )
    with torch.no_grad():
        merged = merged_embeddings(vlm, ids, None, [images[:2], images[2:]]).transpose(0, 1)  # (B, T, h)
        words = vlm.language_model.embedding.word_embeddings(ids)
        patches = image_embeddings(vlm, images)  # (3, 16, h)
    is_image = ids == SPEC.vision.image_token_id
    assert torch.equal(merged[~is_image], words[~is_image])  # text positions untouched
    first = torch.nonzero(is_image[0])[:, 0]
    assert torch.equal(merged[0, first[:16]], patches[0]) and torch.equal(merged[0, first[16:]], patches[1])
    assert torch.equal(merged[1, is_image[1]], patches[2])
    assert not torch.allclose(patches[0], patches[1])  # different images, different embeddings


def test_merged_embeddings_refuse_a_wrong_image_count(vlm) -> None:
    from sc_lightning.models.vlm import merged_embeddings

    ids = torch.tensor([image_prompt(SPEC, BOS, 0, TEXT)])
    with pytest.raises(ValueError, match="row 0 holds 16 <image> ids but 2 image"):
        merged_embeddings(vlm, ids, None, [random_images(SPEC, 2, seed=0)])
    with pytest.raises(ValueError, match="holds 16 <image> ids but 0"):
        merged_embeddings(vlm, ids, None, None)
    with pytest.raises(ValueError, match="uint8 \\(N, 32, 32, 3\\)"):
        merged_embeddings(vlm, ids, None, [torch.zeros(1, 16, 16, 3, dtype=torch.uint8)])


def test_vlm_logits_see_the_image_after_it_and_only_after_it(vlm) -> None:
    from sc_lightning.models.logprobs import logprobs_from_logits
    from sc_lightning.models.vlm import vlm_logits

    ids = torch.tensor([image_prompt(SPEC, BOS, TEXT, 0, TEXT)] * 2)
    images = random_images(SPEC, 2, seed=3)
    with torch.no_grad():
        logits = vlm_logits(vlm, ids, [images[:1], images[1:]])
    assert logits.shape == (2, ids.shape[1], SPEC.vocab_size)
    before = 1 + len(TEXT)  # causal: positions before the image do not see it
    assert torch.equal(logits[0, :before], logits[1, :before])
    assert (logits[0, before:] - logits[1, before:]).abs().max() > 1e-4
    logprobs = logprobs_from_logits(logits.clone(), ids)
    assert torch.isfinite(logprobs).all()
    loss = -logprobs_from_logits(vlm_logits(vlm, ids, [images[:1], images[1:]]), ids).sum()
    loss.backward()  # gradients reach the vision tower through the merged embeddings
    assert vlm.vision_model.conv1.weight.grad.abs().sum() > 0
    assert vlm.vision_projection.encoder.linear_fc2.weight.grad.abs().sum() > 0
    vlm.zero_grad(set_to_none=True)


def test_vlm_state_round_trips_through_the_interchange_names(vlm) -> None:
    from sc_lightning.models.convert import export_hf_weights, hf_to_megatron_state, megatron_to_hf_state
    from sc_lightning.models.megatron import megatron_weights

    exported = dict(export_hf_weights(vlm, SPEC))
    assert "vision_model.conv1.weight" in exported and "model.embed_tokens.weight" in exported
    state = hf_to_megatron_state(exported, SPEC)
    live = dict(megatron_weights(vlm))
    assert state.keys() == live.keys()
    assert all(torch.equal(state[n], live[n]) for n in live)
    back = megatron_to_hf_state(state, SPEC)
    assert back.keys() == exported.keys() and all(torch.equal(back[n], exported[n]) for n in back)
    with pytest.raises(ValueError, match="vision weights not in the model"):
        hf_to_megatron_state({**exported, "vision_model.extra.weight": torch.zeros(1)}, SPEC)
