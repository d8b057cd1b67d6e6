"""Images for the tests: encoded PNG/JPEG files of flat or patterned pixels, and the tiny VLM's image format."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TinyImageFormat:
    """The image format of ``builtin:tiny-vlm`` (its ``VisionSpec`` numbers: 32x32 images, patch 8 -> 16 tokens,
    ``<image>`` id 18), as :class:`sc_lightning.rollout.images.ImageFormat` asks for it."""

    image_size: int = 32
    image_token_id: int = 18
    tokens_per_image: int = 16


def pattern(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A seeded RGB uint8 array of ``height x width x 3`` in large flat blocks (so resizing keeps their colours)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(2, 2, 3), dtype=np.uint8)
    return np.repeat(np.repeat(blocks, -(-height // 2), axis=0), -(-width // 2), axis=1)[:height, :width]


def encoded(array: np.ndarray, fmt: str = "PNG", mode: str | None = None) -> bytes:
    """``array`` (RGB) as the bytes of a ``fmt`` file, converted to PIL ``mode`` first when given."""
    from PIL import Image

    image = Image.fromarray(array, mode="RGB")
    if mode is not None:
        image = image.convert(mode)
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()
