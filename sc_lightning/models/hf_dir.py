"""Hugging Face model directories: write a megatron-core policy as one, and find the one a model name means.

Engines that load models by path (vLLM) and the cached warm start of the tiny example write them; the directory loads
back with :func:`~sc_lightning.models.megatron.load_policy` and with ``transformers``. :func:`resolve_model_dir` finds
a model's directory (a local path, or a snapshot in the local HF cache) without importing megatron-core.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from sc_lightning.models.hf_config import hf_config_dict
from sc_lightning.models.spec import ModelSpec
from sc_lightning.tokenizer import CharTokenizer


def save_hf_directory(spec: ModelSpec, weights: Iterable[tuple[str, torch.Tensor]], path: Path) -> Path:
    """Save HF-named ``weights`` of a ``spec`` model with the character tokenizer as an HF directory at ``path``.

    ``weights`` is what :func:`~sc_lightning.models.convert.export_hf_weights` yields for a TP=1 ``GPTModel``.
    """
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from sc_lightning.models.tiny_tokenizer import save_char_tokenizer

    tok = CharTokenizer()
    path.mkdir(parents=True, exist_ok=True)
    config = hf_config_dict(spec, pad_token_id=tok.PAD, eos_token_id=tok.EOS, bos_token_id=tok.BOS)
    AutoConfig.for_model(**config).save_pretrained(str(path))
    save_file({name: t.detach().contiguous().clone() for name, t in weights}, path / "model.safetensors")
    save_char_tokenizer(path)
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
