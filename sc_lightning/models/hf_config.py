"""Hugging Face ``config.json`` <-> :class:`ModelSpec`: which architectures train, and what each config says.

sc_lightning trains the decoders of :data:`ARCHITECTURES` (docs/config-reference.md, ``policy.model_name``):
Llama (Llama-3.x RoPE scaling; tied or untied embeddings), Qwen2 / Qwen2.5 (q/k/v biases) and Qwen3 dense
(QK-norm: a per-head RMSNorm of the queries and keys before RoPE). :func:`hf_config_problems` reads a
``config.json`` dict with the standard library only, so ``fit --dry_run`` refuses another architecture, or a
feature megatron-core cannot hold (sliding-window attention, another RoPE scaling, MLP or output biases), before
anything heavy is imported. :func:`mcore_spec_from_hf_config` and :func:`hf_config_dict` map the supported ones
both ways; the spec keeps the architecture (``ModelSpec.arch``), so a trained model can be written back as one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sc_lightning.models.spec import Arch, ModelSpec

ARCHITECTURES: dict[str, Arch] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
"""The ``architectures`` value of each supported ``config.json``, and its ``model_type``."""
QKV_BIAS: dict[Arch, bool] = {"llama": False, "qwen2": True, "qwen3": False}
"""Whether each architecture has q/k/v biases (Qwen2 always; the others never, here)."""
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
"""The Llama-3 RoPE scaling parameters megatron-core hard-codes (every Llama-3.x checkpoint uses them)."""


def architecture_name(arch: Arch) -> str:
    """The ``architectures`` entry of a ``config.json`` of ``arch`` (``"qwen3"`` -> ``"Qwen3ForCausalLM"``)."""
    return next(name for name, model_type in ARCHITECTURES.items() if model_type == arch)


def hf_config_problems(raw: Mapping[str, Any]) -> list[str]:
    """Why the ``config.json`` dict ``raw`` describes a model sc_lightning cannot train, one line each (empty: it can).

    Reads ``raw`` as written; a key it lacks takes its architecture's default (none of which is a problem).
    """
    architectures, model_type = raw.get("architectures"), raw.get("model_type")
    supported = ", ".join(ARCHITECTURES)
    if architectures:
        if len(architectures) != 1 or architectures[0] not in ARCHITECTURES:
            return [f"has architectures {list(architectures)}; sc_lightning trains {supported}"]
        if model_type != ARCHITECTURES[architectures[0]]:
            return [f"has model_type {model_type!r}, not {ARCHITECTURES[architectures[0]]!r} as {architectures[0]} has"]
    elif model_type not in ARCHITECTURES.values():
        return [f"has model_type {model_type!r} and no architectures; sc_lightning trains {supported}"]
    problems = []
    if raw.get("hidden_act", "silu") != "silu":
        problems.append(f"has hidden_act {raw['hidden_act']!r}; only SwiGLU (silu) MLPs train")
    if raw.get("mlp_bias"):
        problems.append("has mlp_bias: true; MLP biases are not supported")
    if model_type != "qwen2" and raw.get("attention_bias"):
        problems.append("has attention_bias: true; the output projection's bias is not supported")
    if raw.get("use_sliding_window"):
        problems.append("has use_sliding_window: true; sliding-window attention is not supported")
    sliding = sorted({kind for kind in raw.get("layer_types") or () if kind != "full_attention"})
    if sliding:
        problems.append(f"has layer_types {sliding}; only full_attention layers are supported")
    rope_problem = _rope_problem(raw)
    return problems + ([rope_problem] if rope_problem else [])


def _rope_parameters(raw: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The key holding ``raw``'s RoPE settings (transformers 5 ``rope_parameters``, 4.x ``rope_scaling``) and them."""
    for key in ("rope_parameters", "rope_scaling"):
        if raw.get(key):
            return key, dict(raw[key])
    return "rope_parameters", {}


def _rope_type(params: Mapping[str, Any]) -> str:
    """The RoPE scaling a config's RoPE settings name (``rope_type``, or 4.x's ``type``); ``"default"`` for none."""
    return params.get("rope_type", params.get("type", "default"))


def _rope_problem(raw: Mapping[str, Any]) -> str | None:
    """Why ``raw``'s RoPE is not plain RoPE or Llama-3 scaling with megatron's fixed parameters, or None."""
    key, params = _rope_parameters(raw)
    rope_type = _rope_type(params)
    if rope_type == "default":
        return None
    if rope_type == "llama3" and all(float(params.get(k, -1)) == v for k, v in LLAMA3_ROPE.items()):
        return None
    return f"has {key} {params}; of RoPE scalings only llama3 with {LLAMA3_ROPE} is supported"


def mcore_spec_from_hf_config(hf_config: Any) -> ModelSpec:
    """The :class:`ModelSpec` of a supported ``transformers`` config (object, or its ``config.json`` dict).

    NotImplementedError listing :func:`hf_config_problems` for any other. A dict's missing keys take the
    architecture's ``transformers`` defaults.
    """
    raw = dict(hf_config) if isinstance(hf_config, Mapping) else hf_config.to_dict()
    problems = hf_config_problems(raw)
    if problems:
        raise NotImplementedError(f"this config {'; '.join(problems)}")
    cfg = _with_defaults(raw) if isinstance(hf_config, Mapping) else raw
    arch: Arch = cfg["model_type"]
    _, rope = _rope_parameters(cfg)
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    scaled = _rope_type(rope) == "llama3"
    return ModelSpec(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_query_groups=cfg.get("num_key_value_heads") or heads,
        ffn_hidden_size=cfg["intermediate_size"],
        max_position_embeddings=cfg["max_position_embeddings"],
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta") or 10000.0)),
        qkv_bias=QKV_BIAS[arch],
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        norm_eps=cfg["rms_norm_eps"],
        head_dim=head_dim if head_dim != cfg["hidden_size"] // heads else None,
        rope_scaling_factor=float(rope["factor"]) if scaled else None,
        arch=arch,
    )


def _with_defaults(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` completed with its architecture's ``transformers`` defaults."""
    from transformers import AutoConfig

    fields = dict(raw)
    return AutoConfig.for_model(fields.pop("model_type"), **fields).to_dict()


def hf_config_dict(spec: ModelSpec, **extra: Any) -> dict[str, Any]:
    """A ``config.json`` dict describing ``spec`` for ``transformers`` (``extra`` adds or overrides keys)."""
    if spec.qkv_bias != QKV_BIAS[spec.arch]:
        raise ValueError(f"a {spec.arch} ModelSpec must have qkv_bias={QKV_BIAS[spec.arch]}, got {spec.qkv_bias}")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": spec.rope_theta}
    if spec.rope_scaling_factor is not None:
        rope = {"rope_type": "llama3", "rope_theta": spec.rope_theta, "factor": spec.rope_scaling_factor, **LLAMA3_ROPE}
    cfg: dict[str, Any] = {
        "architectures": [architecture_name(spec.arch)],
        "model_type": spec.arch,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.ffn_hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_query_groups,
        "head_dim": spec.kv_channels,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": spec.norm_eps,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "rope_parameters": rope,  # transformers >= 5 spelling of rope_theta / rope_scaling
    }
    if spec.arch != "qwen2":
        cfg.update(attention_bias=False, mlp_bias=False)
    cfg.update(extra)
    return cfg
