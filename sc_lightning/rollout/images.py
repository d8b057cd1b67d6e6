"""A prompt's images: decoded and resized once where the prompt is loaded, placed in its token ids, viewed as tensors.

- :func:`decode_image` turns a PNG or JPEG file's bytes into a :class:`~sc_lightning.types.PromptImage`: RGB,
  resized to the model's square image size (bicubic), so the engine and the trainer take the pixels as they are;
- :func:`image_prompt_ids` places the images in a prompt's token ids: each ``<image>`` placeholder of the text
  marks one image's place, in order; a text without any gets its images first. Each place becomes
  ``tokens_per_image`` ids ``image_token_id`` (the placeholder is never given to the tokenizer to spell);
- :func:`images_tensor` views a prompt's images as one uint8 ``(N, H, W, 3)`` tensor (the ``pixel_values`` row
  field, the model's input); :func:`engine_images` hands them to an engine's ``generate``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from sc_lightning.tokenizer import IMAGE_PLACEHOLDER, Tokenizer
from sc_lightning.types import Prompt, PromptImage

if TYPE_CHECKING:
    import numpy as np
    from PIL.Image import Image


class ImageFormat(Protocol):
    """How a vision-language policy takes its images: their square side in pixels, and the ``<image>`` token's id
    and how many of them stand for one image (the policy's ``VisionSpec``, ``sc_lightning/models/spec.py``)."""

    @property
    def image_size(self) -> int:
        """Side of the square images, in pixels."""

    @property
    def image_token_id(self) -> int:
        """The ``<image>`` token's id."""

    @property
    def tokens_per_image(self) -> int:
        """How many ``<image>`` ids stand for one image."""


def prompt_image(image: Image, size: int) -> PromptImage:
    """A PIL image as a prompt's image: converted to RGB, resized to ``size`` x ``size`` (bicubic) unless it is."""
    from PIL import Image as PILImage

    image = image.convert("RGB")
    if image.size != (size, size):
        image = image.resize((size, size), PILImage.Resampling.BICUBIC)
    return PromptImage(size, size, image.tobytes())


def decode_image(data: bytes, size: int) -> PromptImage:
    """A PNG or JPEG file's bytes (or any format PIL reads) as a prompt's image of ``size`` x ``size``; ValueError
    saying why when PIL cannot decode them."""
    from PIL import Image as PILImage

    try:
        with PILImage.open(io.BytesIO(data)) as image:
            image.load()
            return prompt_image(image, size)
    except (OSError, ValueError, PILImage.DecompressionBombError) as err:  # UnidentifiedImageError is an OSError
        raise ValueError(f"cannot decode the image ({len(data)} bytes): {err}") from None


def array_image(array: np.ndarray, size: int) -> PromptImage:
    """An RGB uint8 ``H x W x 3`` array (a rendered scene) as a prompt's image of ``size`` x ``size``."""
    from PIL import Image as PILImage

    return prompt_image(PILImage.fromarray(array, mode="RGB"), size)


def images_tensor(images: Sequence[PromptImage]) -> torch.Tensor:
    """The images as one uint8 ``(N, H, W, 3)`` tensor (N may be 0: then ``(0, 0, 0, 3)``); ValueError when their
    sizes differ."""
    if not images:
        return torch.empty((0, 0, 0, 3), dtype=torch.uint8)
    sizes = {(image.height, image.width) for image in images}
    if len(sizes) > 1:
        raise ValueError(f"the images of one prompt must share a size, got {sorted(sizes)}")
    (height, width), data = sizes.pop(), b"".join(image.pixels for image in images)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).reshape(len(images), height, width, 3)


def engine_images(prompt: Prompt) -> dict[str, torch.Tensor]:
    """The keyword arguments that give an engine's ``generate`` the prompt's images (``images=``, uint8
    ``(N, H, W, 3)``); none for a text prompt, so text-only engines are called as before."""
    return {"images": images_tensor(prompt.images)} if prompt.images else {}


def image_prompt_ids(tokenizer: Tokenizer, text: str, count: int, fmt: ImageFormat) -> tuple[int, ...]:
    """A prompt's token ids with ``count`` images: bos (when the tokenizer has one), then the text's pieces between
    ``<image>`` placeholders, each placeholder replaced by ``fmt.tokens_per_image`` ids ``fmt.image_token_id``; with
    no placeholder, the images come first. ValueError when the text holds placeholders, but not ``count``."""
    pieces = text.split(IMAGE_PLACEHOLDER)
    if len(pieces) == 1:
        pieces = [""] * count + pieces
    elif len(pieces) - 1 != count:
        raise ValueError(f"the text holds {len(pieces) - 1} {IMAGE_PLACEHOLDER} placeholder(s) for {count} image(s)")
    image = [fmt.image_token_id] * fmt.tokens_per_image
    ids = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    for i, piece in enumerate(pieces):
        if i:
            ids += image
        ids += tokenizer.encode(piece) if piece else []
    return tuple(ids)
