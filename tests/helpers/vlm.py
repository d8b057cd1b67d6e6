"""Image prompts for the vision-language model tests: random images and token ids with their ``<image>`` runs."""

from __future__ import annotations

import torch

from sc_lightning.models.spec import ModelSpec


def random_images(spec: ModelSpec, count: int, seed: int) -> torch.Tensor:
    """``count`` seeded random uint8 images ``(count, H, W, 3)`` of ``spec``'s image size."""
    size = spec.vision.image_size
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count, size, size, 3), dtype=torch.uint8, generator=generator)


def image_prompt(spec: ModelSpec, *pieces: list[int] | int) -> list[int]:
    """Token ids from ``pieces``: a list is text ids, an int ``n`` stands for image ``n``'s ``tokens_per_image``
    ``<image>`` ids (the number only orders them for the reader: images take their runs in order)."""
    ids: list[int] = []
    for piece in pieces:
        image = [spec.vision.image_token_id] * spec.vision.tokens_per_image
        ids += image if isinstance(piece, int) else piece
    return ids
