"""What a policy's model name names, read without building the model: its architecture and its tokenizer.

``policy.model_name`` is a ``"builtin:<name>"`` model or a Hugging Face directory/id; these read its config and
tokenizer (``transformers`` for an HF one). No megatron-core here: the driver reads both once and hands them to
processes that only build the model (engine actors).
"""

from __future__ import annotations

from sc_lightning.models.hf_config import mcore_spec_from_hf_config
from sc_lightning.models.hf_dir import read_vision_config, resolve_model_dir
from sc_lightning.models.spec import ModelSpec, builtin_spec
from sc_lightning.tokenizer import Tokenizer, load_tokenizer


def model_spec(model_name: str) -> ModelSpec:
    """The architecture ``model_name`` names (a ``"builtin:<name>"`` or an HF directory/id's config, with the vision
    side of a vision-language model directory), read without building the model."""
    if model_name.startswith("builtin:"):
        return builtin_spec(model_name)
    from transformers import AutoConfig

    root = resolve_model_dir(model_name)
    try:
        spec = mcore_spec_from_hf_config(AutoConfig.from_pretrained(str(root), local_files_only=True))
    except NotImplementedError as err:
        raise NotImplementedError(f"{root / 'config.json'}: {err}") from None
    vision = read_vision_config(root)
    return spec if vision is None else spec.replace(vision=vision)


def policy_tokenizer(model_name: str, tokenizer_name: str | None = None) -> Tokenizer:
    """The tokenizer of a policy ``model_name``: ``tokenizer_name``'s, else the model's own (a built-in's, or the
    one in its HF directory)."""
    if tokenizer_name:
        return load_tokenizer(tokenizer_name)
    return load_tokenizer(model_name if model_name.startswith("builtin:") else str(resolve_model_dir(model_name)))
