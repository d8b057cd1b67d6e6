"""The model layer: megatron-core ``GPTModel`` policies and vision-language ones, HF <-> megatron conversion, token
log-probs, CPU support.

Names are imported lazily (``from sc_lightning.models import load_policy`` loads megatron-core only then), so
reading a :class:`ModelSpec` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "spec": ("BUILTIN_SPECS", "ModelSpec", "VisionSpec", "builtin_spec"),
    "megatron": ("build_gpt_model", "init_model_parallel", "load_hf_weights", "load_policy", "transformer_config"),
    "convert": (
        "export_hf_weights",
        "hf_to_megatron_state",
        "megatron_to_hf_state",
        "random_hf_state",
        "read_hf_safetensors",
    ),
    "hf_config": ("ARCHITECTURES", "hf_config_dict", "hf_config_problems", "mcore_spec_from_hf_config"),
    "logprobs": ("logits_of", "logprobs_from_logits", "token_logprobs"),
    "cpu_compat": ("apply_cpu_compat",),
    "attention": ("SDPACoreAttention", "gpt_layer_spec_sdpa"),
    "hf_dir": ("save_hf_directory",),
    "value": ("ValueHead", "attach_value_head", "load_critic", "token_values"),
    "vlm": ("VisionLanguageModel", "build_vlm", "image_embeddings", "merged_embeddings", "vlm_logits"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Import ``name`` from its submodule on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
