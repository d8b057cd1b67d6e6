"""Write a trained policy as a Hugging Face model directory that ``transformers.AutoModelForCausalLM`` loads.

    DIR/config.json               the source directory's own config.json (its RoPE scaling, tied embeddings, QK-norm
                                  and special-token ids kept), ``dtype`` set to the weights'; a built-in model (no
                                  directory) gets the config of its ModelSpec (``Qwen2ForCausalLM``: q/k/v biases)
    DIR/model.safetensors         the weights under their HF names, or ``model-0000i-of-0000n.safetensors`` with
                                  ``model.safetensors.index.json`` when they exceed ``max_shard_bytes``
    DIR/tokenizer.json, ...       the tokenizer the run used, saved by ``transformers``; the built-in character
                                  tokenizer as its equivalent fast tokenizer (``models/tiny_tokenizer.py``)
    DIR/generation_config.json    the source's, its missing bos/eos/pad ids filled from that tokenizer

:class:`PolicySource` is what an export needs besides the weights; a trainer bundle records it. The directory is
written beside ``DIR`` and renamed into place, so an interrupted export leaves nothing at ``DIR``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sc_lightning.models.convert import hf_param_shapes
from sc_lightning.models.hf_config import hf_config_dict, mcore_spec_from_hf_config
from sc_lightning.models.hf_dir import resolve_model_dir
from sc_lightning.models.spec import ModelSpec, VisionSpec
from sc_lightning.tokenizer import HuggingFaceTokenizer, Tokenizer, load_tokenizer

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
"""The largest safetensors file an export writes by default (5 GB, as ``transformers``' ``save_pretrained``)."""
INDEX_FILE = "model.safetensors.index.json"
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class ExportError(ValueError):
    """An export cannot be written (its output exists, its source is gone); the message names the path and the fix."""


@dataclass(frozen=True)
class PolicySource:
    """Where a trained policy came from: what its export needs besides the weights (each bundle records it)."""

    model_name: str  # "builtin:<name>", a Hugging Face directory (absolute), or a model id in the local HF cache
    tokenizer_name: str | None  # policy.tokenizer_name; None: the model's own tokenizer
    precision: str  # policy.precision: the dtype the weights are exported in
    spec: ModelSpec

    def to_dict(self) -> dict[str, Any]:
        """Plain data (``torch.load(weights_only=True)`` reads it back)."""
        return {**dataclasses.asdict(self), "spec": dataclasses.asdict(self.spec)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicySource:
        """The source :meth:`to_dict` wrote (a vision-language spec's vision side as its :class:`VisionSpec`)."""
        vision = data["spec"].get("vision")
        spec = ModelSpec(**{**data["spec"], "vision": None if vision is None else VisionSpec(**vision)})
        return cls(**{**data, "spec": spec})

    def directory(self) -> Path | None:
        """The source's Hugging Face directory (None for a built-in model); ExportError when it is gone."""
        if self.model_name.startswith("builtin:"):
            return None
        try:
            return resolve_model_dir(self.model_name)
        except FileNotFoundError as err:
            raise ExportError(
                f"the policy was trained from {self.model_name!r}, whose config.json and tokenizer the export copies, "
                f"but it is gone ({err}); put the directory back where it was"
            ) from None


def check_exportable(source: PolicySource) -> None:
    """ExportError when the policy ``source`` describes has no Hugging Face form: a vision-language policy, whose
    vision side (megatron-core's CLIP ViT and projector) no ``transformers`` architecture loads (docs/vlm.md)."""
    if source.spec.vision is not None:
        raise ExportError(
            f"the policy ({source.model_name}) is a vision-language model; its vision tower and projector have no "
            "Hugging Face form that transformers loads, so it cannot be exported (docs/vlm.md, 'Weights'); resume "
            "from the bundle itself (fit --ckpt_path) instead"
        )


def check_output_dir(output: Path) -> None:
    """ExportError unless ``output`` is free: absent, or an empty directory (an export never overwrites)."""
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ExportError(f"{output} exists and is not an empty directory; export to a new path (nothing is replaced)")


def write_hf_export(
    output: Path,
    source: PolicySource,
    weights: Iterable[tuple[str, Tensor]],
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: bool = False,
) -> Path:
    """Write ``weights`` (HF names, as :func:`~sc_lightning.models.convert.export_hf_weights` streams them) of the
    policy ``source`` describes as a Hugging Face directory at ``output``; returns ``output``.

    ``progress`` shows a bar over the tensors (on a terminal). ExportError when ``output`` is not free, or the policy
    is a vision-language one (:func:`check_exportable`).
    """
    check_exportable(source)
    check_output_dir(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.parent / f".{output.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        write_hf_files(staging, source, weights, max_shard_bytes=max_shard_bytes, progress=progress)
        if output.exists():
            output.rmdir()  # the empty directory the export replaces
        os.rename(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output


def write_hf_files(
    directory: Path,
    source: PolicySource,
    weights: Iterable[tuple[str, Tensor]],
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: bool = False,
) -> None:
    """Write the files of :func:`write_hf_export` into the existing ``directory`` (in place: no staging)."""
    tokenizer = save_tokenizer(directory, source)
    dtype = write_safetensors(directory, source.spec, weights, max_shard_bytes=max_shard_bytes, progress=progress)
    _save_config(directory, source, tokenizer, dtype)
    _save_generation_config(directory, source, tokenizer)


def save_tokenizer(directory: Path, source: PolicySource) -> Tokenizer:
    """Save the tokenizer the run used into ``directory`` with ``transformers``; returns it."""
    tokenizer = load_tokenizer(source.tokenizer_name or str(source.directory() or source.model_name))
    if isinstance(tokenizer, HuggingFaceTokenizer):
        tokenizer.transformers_tokenizer.save_pretrained(str(directory))
    else:  # the built-in character tokenizer (with <image>: a vision-language model's)
        from sc_lightning.models.tiny_tokenizer import save_char_tokenizer

        image_token = getattr(tokenizer, "IMAGE_TOKEN", None)
        save_char_tokenizer(directory, model_max_length=source.spec.max_position_embeddings, image_token=image_token)
    return tokenizer


def write_safetensors(
    directory: Path,
    spec: ModelSpec,
    weights: Iterable[tuple[str, Tensor]],
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: bool = False,
) -> torch.dtype:
    """Write ``weights`` as ``model.safetensors``, or shards of at most ``max_shard_bytes`` (a larger tensor alone)
    and their index; a tied model's ``lm_head.weight`` is left out, as ``transformers`` saves it. Returns the dtype."""
    from safetensors.torch import save_file
    from tqdm import tqdm

    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
    files: list[list[str]] = []
    shard: dict[str, Tensor] = {}
    shard_bytes, total_bytes, dtype = 0, 0, torch.float32

    def flush() -> None:
        """Write the tensors gathered so far as the next shard."""
        save_file(shard, str(directory / f"shard-{len(files)}.tmp"), metadata={"format": "pt"})
        files.append(list(shard))
        shard.clear()

    names = [n for n in hf_param_shapes(spec) if not (spec.tie_word_embeddings and n == "lm_head.weight")]
    bar = tqdm(weights, total=len(names), desc="export", unit="tensor", disable=None if progress else True)
    for name, tensor in bar:  # disable=None: a bar on a terminal only
        if name == "lm_head.weight" and spec.tie_word_embeddings:
            continue
        size = tensor.numel() * tensor.element_size()
        if shard and shard_bytes + size > max_shard_bytes:
            flush()
            shard_bytes = 0
        shard[name] = tensor.detach().to("cpu").contiguous().clone()  # q, k, v may be views of one tensor
        shard_bytes, total_bytes, dtype = shard_bytes + size, total_bytes + size, tensor.dtype
    if shard or not files:
        flush()
    _name_shards(directory, files, total_bytes)
    return dtype


def _name_shards(directory: Path, files: list[list[str]], total_bytes: int) -> None:
    """Rename the written shards to ``transformers``' names, and index them when there are several."""
    if len(files) == 1:
        os.rename(directory / "shard-0.tmp", directory / "model.safetensors")
        return
    weight_map = {}
    for i, names in enumerate(files):
        final = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        os.rename(directory / f"shard-{i}.tmp", directory / final)
        weight_map.update(dict.fromkeys(names, final))
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def _save_config(directory: Path, source: PolicySource, tokenizer: Tokenizer, dtype: torch.dtype) -> None:
    """``config.json``: the source directory's own, checked to describe the trained model, or the spec's."""
    root = source.directory()
    if root is not None and (root / "config.json").is_file():
        raw = json.loads((root / "config.json").read_text())
        found = mcore_spec_from_hf_config(raw)
        if found != source.spec:
            raise ExportError(
                f"{root / 'config.json'} describes {found}, not the trained model {source.spec}: the directory changed "
                "since the run started; put back the one it trained from"
            )
        raw.pop("torch_dtype", None)  # transformers 4's spelling of dtype
        raw["dtype"] = _DTYPE_NAMES[dtype]
        (directory / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
        return
    from transformers import AutoConfig

    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = hf_config_dict(source.spec, **ids, pad_token_id=tokenizer.pad_token_id, dtype=_DTYPE_NAMES[dtype])
    AutoConfig.for_model(**config).save_pretrained(str(directory))


def _save_generation_config(directory: Path, source: PolicySource, tokenizer: Tokenizer) -> None:
    """``generation_config.json``: the source's, its missing special-token ids filled from ``tokenizer``."""
    from transformers import GenerationConfig

    root = source.directory()
    has_own = root is not None and (root / "generation_config.json").is_file()
    config = GenerationConfig.from_pretrained(str(root)) if has_own else GenerationConfig()
    ids = {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id}
    for role, token_id in ids.items():
        if getattr(config, f"{role}_token_id") is None:
            setattr(config, f"{role}_token_id", token_id)
    config.save_pretrained(str(directory))
