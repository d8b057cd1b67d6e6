"""Hugging Face model directories: write a built-in policy as one, and find the one a model name means.

Engines that load models by path (vLLM) and the cached warm start of the tiny example write them; the directory loads
back with :func:`~sc_lightning.models.megatron.load_policy` and with ``transformers``. :func:`resolve_model_dir` finds
a model's directory (a local path, or a snapshot in the local HF cache) without importing megatron-core.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from sc_lightning.models.spec import ModelSpec


def save_hf_directory(spec: ModelSpec, weights: Iterable[tuple[str, torch.Tensor]], path: Path) -> Path:
    """Save HF-named ``weights`` of a built-in ``spec`` model with the character tokenizer as an HF directory at
    ``path`` (created, or written into), as :func:`~sc_lightning.models.hf_export.write_hf_files` lays it out.

    ``weights`` is what :func:`~sc_lightning.models.convert.export_hf_weights` yields for a TP=1 ``GPTModel``.
    """
    from sc_lightning.models.hf_export import PolicySource, write_hf_files

    path.mkdir(parents=True, exist_ok=True)
    write_hf_files(path, PolicySource("builtin:char", None, "fp32", spec), weights)
    return path


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
