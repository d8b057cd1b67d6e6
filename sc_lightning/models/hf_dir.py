"""Hugging Face model directories: write a built-in policy as one, and find the one a model name means.

Engines that load models by path (vLLM) and the cached warm start of the tiny example write them; the directory loads
back with :func:`~sc_lightning.models.megatron.load_policy` and with ``transformers``. A vision-language model's
directory (a warm-started ``builtin:tiny-vlm``) is ours only: ``config.json`` describes its language model, and
:data:`VISION_CONFIG_FILE` beside it the vision side, whose tensors keep their megatron names in the safetensors
(there is no Hugging Face form of it, docs/vlm.md). :func:`resolve_model_dir` finds
a model's directory (a local path, or a snapshot in the local HF cache) without importing megatron-core.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path

import torch

from sc_lightning.models.spec import ModelSpec, VisionSpec

VISION_CONFIG_FILE = "vision_config.json"
"""The file of a vision-language model directory that holds its :class:`VisionSpec` (absent: a text model)."""


def save_hf_directory(spec: ModelSpec, weights: Iterable[tuple[str, torch.Tensor]], path: Path) -> Path:
    """Save HF-named ``weights`` of a built-in ``spec`` model with the character tokenizer as an HF directory at
    ``path`` (created, or written into), as :func:`~sc_lightning.models.hf_export.write_hf_files` lays it out; a
    vision-language ``spec`` with the tokenizer's ``<image>`` token and its :data:`VISION_CONFIG_FILE`.

    ``weights`` is what :func:`~sc_lightning.models.convert.export_hf_weights` yields for a TP=1 model.
    """
    from sc_lightning.models.hf_export import PolicySource, write_hf_files

    path.mkdir(parents=True, exist_ok=True)
    tokenizer = "builtin:char" if spec.vision is None else "builtin:tiny-vlm"
    write_hf_files(path, PolicySource(tokenizer, None, "fp32", spec), weights)
    if spec.vision is not None:
        (path / VISION_CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(spec.vision), indent=2) + "\n")
    return path


def read_vision_config(root: Path) -> VisionSpec | None:
    """The vision side of the model directory ``root`` (its :data:`VISION_CONFIG_FILE`); None: a text model."""
    file = root / VISION_CONFIG_FILE
    return VisionSpec(**json.loads(file.read_text())) if file.is_file() else None


def resolve_model_dir(model_name: str) -> Path:
    """The local directory of a Hugging Face model: ``model_name`` itself, or its snapshot in the local HF cache."""
    path = Path(model_name).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_name, local_files_only=True))
    except Exception as err:
        raise FileNotFoundError(
            f"model {model_name!r} is neither a local directory nor in the local Hugging Face cache "
            f"(nothing is downloaded at run time): {type(err).__name__}: {err}"
        ) from err
