"""A prompt's images: decoding and resizing once, their place in the token ids, their tensor view, their round trip
through the recovery ledger's plain data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sc_lightning.rollout.images import array_image, decode_image, image_prompt_ids, images_tensor
from sc_lightning.tokenizer import CharImageTokenizer, CharTokenizer, decode_with_images
from sc_lightning.types import Prompt, PromptImage, prompt_from_dict, prompt_to_dict
from tests.helpers.images import TinyImageFormat, encoded, pattern

FMT = TinyImageFormat()


def test_a_png_of_the_model_size_decodes_to_its_exact_pixels() -> None:
    array = pattern(32, 32, seed=1)
    image = decode_image(encoded(array), 32)
    assert (image.height, image.width) == (32, 32)
    assert images_tensor([image])[0].numpy().tolist() == array.tolist()


@pytest.mark.parametrize(("fmt", "mode"), [("PNG", "RGBA"), ("PNG", "L"), ("JPEG", None)])
def test_other_sizes_modes_and_formats_come_as_rgb_at_the_model_size(fmt: str, mode: str | None) -> None:
    array = pattern(64, 48, seed=2)
    image = decode_image(encoded(array, fmt, mode), 32)
    pixels = images_tensor([image])[0]
    assert pixels.shape == (32, 32, 3) and pixels.dtype == torch.uint8
    expected = array if mode != "L" else np.repeat(np.asarray(_grey(array))[..., None], 3, axis=-1)
    corner = torch.from_numpy(expected[4, 4].astype(np.int16))
    assert (pixels[2, 2].to(torch.int16) - corner).abs().max() <= 8  # a flat block keeps its colour (JPEG: nearly)


def _grey(array: np.ndarray) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(array, mode="RGB").convert("L"))


def test_bytes_that_are_no_image_raise_saying_so() -> None:
    with pytest.raises(ValueError, match="cannot decode the image \\(9 bytes\\)"):
        decode_image(b"not a png", 32)


def test_images_tensor_stacks_a_prompts_images_and_refuses_mixed_sizes() -> None:
    first, second = array_image(pattern(32, 32, 3), 32), array_image(pattern(32, 32, 4), 32)
    stacked = images_tensor([first, second])
    assert stacked.shape == (2, 32, 32, 3)
    assert stacked[1].numpy().tobytes() == second.pixels
    assert images_tensor([]).shape == (0, 0, 0, 3)
    with pytest.raises(ValueError, match="share a size"):
        images_tensor([first, array_image(pattern(8, 8), 8)])


def test_a_prompt_image_needs_its_pixels() -> None:
    with pytest.raises(ValueError, match="needs 12 bytes, got 11"):
        PromptImage(2, 2, bytes(11))


def test_placeholders_mark_the_images_places_in_the_token_ids() -> None:
    tok = CharTokenizer()
    image = [FMT.image_token_id] * FMT.tokens_per_image
    ids = image_prompt_ids(tok, "1+<image>=<image>", 2, FMT)
    assert list(ids) == [tok.BOS, *tok.encode("1+"), *image, *tok.encode("="), *image]


def test_a_text_without_placeholders_gets_its_images_first() -> None:
    tok = CharTokenizer()
    ids = image_prompt_ids(tok, "+1=", 2, FMT)
    assert list(ids) == [tok.BOS, *[FMT.image_token_id] * (2 * FMT.tokens_per_image), *tok.encode("+1=")]


@pytest.mark.parametrize("text", ["1+<image>=<image>", "<image><image>+1=", "+1=<image>", "2*3="])
def test_decode_with_images_gives_back_the_text_with_its_placeholders(text: str) -> None:
    """The inverse of image_prompt_ids: each image's run of ids is one placeholder, even two images side by side."""
    tok = CharImageTokenizer()
    ids = image_prompt_ids(tok, text, text.count("<image>"), FMT)
    shown = decode_with_images(tok, ids, image_token_id=FMT.image_token_id, tokens_per_image=FMT.tokens_per_image)
    assert shown == text
    assert decode_with_images(tok, ids) == text.replace("<image>", "")  # without the id: decode drops them


def test_placeholders_must_match_the_images() -> None:
    with pytest.raises(ValueError, match="holds 1 <image> placeholder\\(s\\) for 2 image"):
        image_prompt_ids(CharTokenizer(), "<image>+1=", 2, FMT)


def test_a_prompt_with_images_survives_the_ledgers_torch_save_with_weights_only(tmp_path) -> None:
    image = array_image(pattern(32, 32, 5), 32)
    prompt = Prompt("p", (2, 18, 3), text="+1=", answer="1", task="clevr", extra={"kind": "count"}, images=(image,))
    torch.save({"prompt": prompt_to_dict(prompt)}, tmp_path / "ledger.pt")
    loaded = torch.load(tmp_path / "ledger.pt", weights_only=True)
    assert prompt_from_dict(loaded["prompt"]) == prompt
    text_only = Prompt("q", (2, 3))
    assert "images" not in prompt_to_dict(text_only)  # a text prompt's record is as before images existed
    assert prompt_from_dict(prompt_to_dict(text_only)) == text_only
