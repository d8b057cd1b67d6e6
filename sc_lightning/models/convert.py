"""Hugging Face (Llama / Qwen2 / Qwen3) <-> megatron-core ``GPTModel`` weights, both ways, tensor- and pipeline-aware.

Layout of the megatron side (local layer spec), per TP rank ``r`` of ``tp``:

- ``embedding.word_embeddings.weight`` / ``output_layer.weight``: the vocabulary, zero-padded to
  ``spec.padded_vocab_size(tp)`` rows, split in ``tp`` contiguous row blocks. Tied embeddings have no
  ``output_layer`` (except on a last pipeline stage that is not also the first, which holds a copy).
- ``self_attention.linear_qkv``: q, k, v interleaved per KV group, ``[g0: q_0..q_{h/g-1} k v | g1: ... ]``,
  split in row blocks of whole groups (weights ``[rows, hidden]`` and Qwen2 biases ``[rows]``).
- ``self_attention.q_layernorm`` / ``k_layernorm`` (Qwen3's ``q_norm`` / ``k_norm``): one ``[head_dim]`` RMSNorm
  weight shared by every head, replicated like the other norms.
- ``mlp.linear_fc1``: ``[gate_r; up_r]`` where ``gate_r``/``up_r`` are this rank's row blocks of gate/up.
- ``self_attention.linear_proj`` / ``mlp.linear_fc2``: column blocks. Norms are replicated.
- Pipeline stage ``p`` of ``pp`` numbers its layers from 0; global layer = ``p * num_layers // pp + local``.

``_extra_state`` entries (Transformer Engine metadata) are ignored, and both norm spellings (local spec
``input_layernorm``/``pre_mlp_layernorm`` and TE's fused ``layer_norm_weight``) are read on export.

A vision-language ``spec`` (``spec.vision``, :mod:`sc_lightning.models.vlm`) has its language model's tensors under
these names (megatron side: under ``language_model.``) and its vision side's under their megatron names, whole
(:mod:`sc_lightning.models.vlm_weights`); every function here takes either kind.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from sc_lightning.models.spec import ModelSpec
from sc_lightning.models.vlm_weights import (
    is_vision_name,
    random_vision_state,
    shard_vision_state,
    unshard_vision_tensor,
    vision_param_shapes,
    vision_unit_headers,
    vision_units,
)

Kind = Literal["vocab", "norm", "qkv", "row", "fc1"]
_TE_NORM_SPELLINGS = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
}
_IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)
LANGUAGE_PREFIX = "language_model."
"""Where a vision-language model keeps its language model (a ``GPTModel``), as megatron's ``LLaVAModel`` does."""


@dataclass(frozen=True)
class ParamMapping:
    """One megatron parameter and the Hugging Face tensors it is made of."""

    mcore: str
    hf: tuple[str, ...]
    kind: Kind


def hf_param_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face parameter of ``spec`` and its shape, in export order (``lm_head`` last, even if tied; a
    vision-language model's vision tensors after it)."""
    if spec.vision is not None:
        return {**hf_param_shapes(spec.language), **vision_param_shapes(spec)}
    h, d, f = spec.hidden_size, spec.kv_channels, spec.ffn_hidden_size
    q_rows, kv_rows = spec.num_attention_heads * d, spec.num_query_groups * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, h)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        projections = (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows))
        shapes.update({f"{p}self_attn.{name}.weight": (rows, h) for name, rows in projections})
        if spec.qkv_bias:
            shapes.update({f"{p}self_attn.{name}.bias": (rows,) for name, rows in projections})
        if spec.qk_layernorm:
            shapes.update({f"{p}self_attn.{name}_norm.weight": (d,) for name in "qk"})
        shapes[p + "self_attn.o_proj.weight"] = (h, q_rows)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (f, h)
        shapes[p + "mlp.up_proj.weight"] = (f, h)
        shapes[p + "mlp.down_proj.weight"] = (h, f)
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (spec.vocab_size, h)
    return shapes


def random_hf_state(spec: ModelSpec, seed: int, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """Seeded random weights of ``spec`` in Hugging Face naming (normal(0, 0.02); scaled for o/down projections).

    Uses its own generator (the global RNG is untouched), so the same seed gives the same function at any TP size.
    Norms start at 1, biases at 0; tied models get one table for both ends. The tensors are on the CPU whatever the
    default device (Lightning builds models under its device context). A vision-language model's vision side comes
    from :func:`~sc_lightning.models.vlm_weights.random_vision_state`.
    """
    if spec.vision is not None:
        return {**random_hf_state(spec.language, seed, dtype), **random_vision_state(spec, seed, dtype)}
    gen = torch.Generator().manual_seed(seed)
    std, out_std = 0.02, 0.02 / (2.0 * spec.num_layers) ** 0.5
    state: dict[str, Tensor] = {}
    for name, shape in hf_param_shapes(spec).items():
        if name == "lm_head.weight" and spec.tie_word_embeddings:
            continue
        if name.endswith("norm.weight"):
            state[name] = torch.ones(shape, dtype=dtype, device="cpu")
        elif name.endswith(".bias"):
            state[name] = torch.zeros(shape, dtype=dtype, device="cpu")
        else:
            scale = out_std if name.endswith(("o_proj.weight", "down_proj.weight")) else std
            state[name] = (torch.randn(shape, generator=gen, device="cpu") * scale).to(dtype)
    return state


def parameter_mappings(spec: ModelSpec, *, pp_rank: int = 0, pp_size: int = 1) -> list[ParamMapping]:
    """The megatron parameters of pipeline stage ``pp_rank`` (local layer numbers) and their HF sources."""
    spec.check_parallel(1, pp_size)
    per_stage = spec.num_layers // pp_size
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    out = [ParamMapping("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab")] if first else []
    for local in range(per_stage):
        m, p = f"decoder.layers.{local}.", f"model.layers.{pp_rank * per_stage + local}."
        qkv = tuple(f"{p}self_attn.{n}_proj.weight" for n in "qkv")
        out += [
            ParamMapping(m + "input_layernorm.weight", (p + "input_layernorm.weight",), "norm"),
            ParamMapping(m + "self_attention.linear_qkv.weight", qkv, "qkv"),
        ]
        if spec.qkv_bias:
            bias = tuple(name.replace(".weight", ".bias") for name in qkv)
            out.append(ParamMapping(m + "self_attention.linear_qkv.bias", bias, "qkv"))
        if spec.qk_layernorm:
            qk_norms = [(f"{n}_layernorm", f"{n}_norm") for n in "qk"]
            out += [
                ParamMapping(f"{m}self_attention.{a}.weight", (f"{p}self_attn.{b}.weight",), "norm")
                for a, b in qk_norms
            ]
        out += [
            ParamMapping(m + "self_attention.linear_proj.weight", (p + "self_attn.o_proj.weight",), "row"),
            ParamMapping(m + "pre_mlp_layernorm.weight", (p + "post_attention_layernorm.weight",), "norm"),
            ParamMapping(m + "mlp.linear_fc1.weight", (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"), "fc1"),
            ParamMapping(m + "mlp.linear_fc2.weight", (p + "mlp.down_proj.weight",), "row"),
        ]
    if last:
        out.append(ParamMapping("decoder.final_layernorm.weight", ("model.norm.weight",), "norm"))
        if not spec.tie_word_embeddings:
            out.append(ParamMapping("output_layer.weight", ("lm_head.weight",), "vocab"))
        elif not first:  # the last stage keeps its own copy of the tied embedding
            out.append(ParamMapping("output_layer.weight", ("model.embed_tokens.weight",), "vocab"))
    return out


def _merge_qkv(spec: ModelSpec, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Interleave q, k, v per KV group: ``[g0: q.. k v | g1: ...]`` (weights ``[rows, hidden]`` or biases)."""
    g, d = spec.num_query_groups, spec.kv_channels
    hpg, tail = spec.num_attention_heads // g, q.shape[1:]
    parts = (q.reshape(g, hpg * d, *tail), k.reshape(g, d, *tail), v.reshape(g, d, *tail))
    return torch.cat(parts, dim=1).reshape(-1, *tail)


def _split_qkv(spec: ModelSpec, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of :func:`_merge_qkv` on the full (all-rank) tensor."""
    g, d = spec.num_query_groups, spec.kv_channels
    hpg, tail = spec.num_attention_heads // g, qkv.shape[1:]
    q, k, v = torch.split(qkv.reshape(g, (hpg + 2) * d, *tail), [hpg * d, d, d], dim=1)
    return q.reshape(-1, *tail), k.reshape(-1, *tail), v.reshape(-1, *tail)


def _shard(spec: ModelSpec, kind: Kind, hf: Sequence[Tensor], rank: int, tp: int) -> Tensor:
    """This TP rank's megatron tensor built from the full HF tensors ``hf``."""
    if kind == "norm":
        return hf[0]
    if kind == "row":
        return torch.chunk(hf[0], tp, dim=1)[rank]
    if kind == "fc1":
        return torch.cat([torch.chunk(hf[0], tp, dim=0)[rank], torch.chunk(hf[1], tp, dim=0)[rank]], dim=0)
    if kind == "qkv":
        return torch.chunk(_merge_qkv(spec, *hf), tp, dim=0)[rank]
    table = hf[0]  # vocab
    pad = spec.padded_vocab_size(tp) - table.shape[0]
    if pad:
        table = torch.cat([table, table.new_zeros(pad, *table.shape[1:])], dim=0)
    return torch.chunk(table, tp, dim=0)[rank]


def _unshard(spec: ModelSpec, kind: Kind, shards: Sequence[Tensor]) -> tuple[Tensor, ...]:
    """The full HF tensors of one megatron parameter, from its shards in TP-rank order."""
    if kind == "norm":
        return (shards[0],)
    if kind == "row":
        return (torch.cat(list(shards), dim=1),)
    if kind == "fc1":
        halves = [torch.chunk(s, 2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves], dim=0), torch.cat([h[1] for h in halves], dim=0)
    if kind == "qkv":
        return _split_qkv(spec, torch.cat(list(shards), dim=0))
    return (torch.cat(list(shards), dim=0)[: spec.vocab_size],)  # vocab: drop the padding rows


def hf_to_megatron_state(
    hf_state: Mapping[str, Tensor],
    spec: ModelSpec,
    *,
    tp_rank: int = 0,
    tp_size: int = 1,
    pp_rank: int = 0,
    pp_size: int = 1,
    partial: bool = False,
) -> dict[str, Tensor]:
    """This (TP, PP) rank's megatron state dict from a full Hugging Face state dict.

    Raises KeyError naming a missing HF tensor, and (for ``pp_size == 1``) ValueError listing HF tensors that
    nothing consumed, so a wrong architecture never loads silently. With ``partial`` (one bucket of a refit), a
    megatron parameter none of whose HF tensors is given is left out; one given only in part is still a KeyError.
    """
    spec.check_parallel(tp_size, pp_size)
    if spec.vision is not None:
        return _vlm_hf_to_megatron_state(hf_state, spec, tp_rank=tp_rank, tp_size=tp_size, partial=partial)
    state, used = {}, set()
    for m in parameter_mappings(spec, pp_rank=pp_rank, pp_size=pp_size):
        missing = [name for name in m.hf if name not in hf_state]
        if partial and len(missing) == len(m.hf):
            continue
        if missing:
            raise KeyError(f"Hugging Face weights lack {missing[0]!r} (needed for megatron {m.mcore!r})")
        used.update(m.hf)
        state[m.mcore] = _shard(spec, m.kind, [hf_state[n] for n in m.hf], tp_rank, tp_size).contiguous()
    if pp_size == 1:
        ignorable = {"lm_head.weight"} if spec.tie_word_embeddings else set()
        unused = [n for n in hf_state if n not in used and n not in ignorable and not n.endswith(_IGNORED_HF_SUFFIXES)]
        if unused:
            raise ValueError(f"Hugging Face weights not used by the {spec.arch} converter: {sorted(unused)[:8]}")
    return state


def _vlm_hf_to_megatron_state(
    hf_state: Mapping[str, Tensor], spec: ModelSpec, *, tp_rank: int, tp_size: int, partial: bool
) -> dict[str, Tensor]:
    """:func:`hf_to_megatron_state` of a vision-language model (one pipeline stage)."""
    vision = {name: t for name, t in hf_state.items() if is_vision_name(name)}
    expected = vision_param_shapes(spec)
    unexpected = sorted(vision.keys() - expected.keys())
    if unexpected:
        raise ValueError(f"vision weights not in the model: {unexpected[:8]}")
    missing = [] if partial else [name for name in expected if name not in vision]
    if missing:
        raise KeyError(f"vision weights lack {missing[0]!r}")
    text = {name: t for name, t in hf_state.items() if not is_vision_name(name)}
    language = hf_to_megatron_state(text, spec.language, tp_rank=tp_rank, tp_size=tp_size, partial=partial)
    return {
        **{LANGUAGE_PREFIX + name: t for name, t in language.items()},
        **shard_vision_state(vision, tp_rank, tp_size),
    }


def _norm_lookup(state: Mapping[str, Tensor], name: str) -> Tensor:
    """``state[name]``, also trying Transformer Engine's fused spelling of layer norms."""
    if name in state:
        return state[name]
    for local, fused in _TE_NORM_SPELLINGS.items():
        if name.endswith(local):
            alt = name[: -len(local)] + fused
            if alt in state:
                return state[alt]
    raise KeyError(f"megatron state lacks {name!r}")


def megatron_to_hf_state(
    tp_states: Mapping[str, Tensor] | Sequence[Mapping[str, Tensor]], spec: ModelSpec
) -> dict[str, Tensor]:
    """The full Hugging Face state dict from one megatron state (TP=1) or all TP ranks' states in rank order.

    Tied embeddings also produce ``lm_head.weight`` (the same tensor as ``model.embed_tokens.weight``).
    """
    shards = [tp_states] if isinstance(tp_states, Mapping) else list(tp_states)
    if spec.vision is not None:
        text = [
            {k.removeprefix(LANGUAGE_PREFIX): t for k, t in s.items() if k.startswith(LANGUAGE_PREFIX)} for s in shards
        ]
        vision = {name: unshard_vision_tensor(name, [s[name] for s in shards]) for name in vision_param_shapes(spec)}
        return {**megatron_to_hf_state(text, spec.language), **vision}
    out: dict[str, Tensor] = {}
    for m in parameter_mappings(spec):
        for name, tensor in zip(m.hf, _unshard(spec, m.kind, [_norm_lookup(s, m.mcore) for s in shards]), strict=True):
            out[name] = tensor
    if spec.tie_word_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def export_hf_weights(
    model: torch.nn.Module, spec: ModelSpec, *, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, Tensor]]:
    """Stream ``(hf_name, tensor)`` for every HF parameter of a (TP-sharded) megatron model's pipeline stage.

    At TP > 1 every rank of the tensor-parallel group must iterate together (each parameter is all-gathered) and
    every rank receives full tensors. At PP > 1 a stage yields its own layers (under their model-wide HF names), and
    the embedding or output layer it holds. Tensors may share memory with the live parameters: copy them if they
    must outlive the next optimizer step. ``dtype`` casts them (None keeps the model's dtype).
    """
    for unit in export_hf_units(model, spec, dtype=dtype):
        yield from unit


def export_hf_units(
    model: torch.nn.Module, spec: ModelSpec, *, dtype: torch.dtype | None = None
) -> Iterator[list[tuple[str, Tensor]]]:
    """:func:`export_hf_weights` in *units*: the HF tensors of one megatron module together (a layer's q, k, v
    weights and biases; its gate and up projections; ...), and a tied ``lm_head.weight`` alone, in the same order.

    A refit sends a unit whole, in one bucket: an engine that fuses those tensors (vLLM's ``qkv_proj`` and
    ``gate_up_proj``, the megatron engine's ``linear_qkv`` and ``linear_fc1``) then loads each of its modules at
    once. The same collectives as :func:`export_hf_weights` (one all-gather per megatron parameter; the tied
    embedding is gathered again for ``lm_head``, so no unit is held past its yield); :func:`export_hf_unit_headers`
    describes the units without gathering.
    """
    local = _local_state(model)
    text, text_spec = _text_state(local, spec), spec.language
    for unit in _unit_mappings(text_spec):
        # a fresh list per yield: the generator keeps no reference to a unit once its consumer has it
        yield [pair for m in unit for pair in _export_mapping(text_spec, text, m, dtype)]
    if spec.vision is not None:
        yield from vision_units(spec, local, dtype)


def export_hf_unit_headers(
    model: torch.nn.Module, spec: ModelSpec, *, dtype: torch.dtype | None = None
) -> list[list[tuple[str, tuple[int, ...], torch.dtype]]]:
    """``(hf_name, shape, dtype)`` of every tensor :func:`export_hf_units` yields, unit by unit; no collectives."""
    local = _local_state(model)
    text, text_spec = _text_state(local, spec), spec.language
    shapes = hf_param_shapes(text_spec)
    headers = [
        [(name, shapes[name], dtype or _norm_lookup(text, m.mcore).dtype) for m in unit for name in m.hf]
        for unit in _unit_mappings(text_spec)
    ]
    return headers + (vision_unit_headers(spec, local, dtype) if spec.vision is not None else [])


def _local_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """``model``'s state (this rank's shards) under unwrapped megatron names, the live tensors."""
    return {unwrapped_name(name): t for name, t in model.state_dict(keep_vars=True).items()}


def _text_state(local: Mapping[str, Tensor], spec: ModelSpec) -> Mapping[str, Tensor]:
    """The language model's part of ``local`` under ``GPTModel`` names (all of it for a text model)."""
    if spec.vision is None:
        return local
    return {name.removeprefix(LANGUAGE_PREFIX): t for name, t in local.items() if name.startswith(LANGUAGE_PREFIX)}


def _unit_mappings(spec: ModelSpec) -> list[list[ParamMapping]]:
    """This pipeline stage's megatron parameters grouped by module, in export order; a tied model's ``lm_head``
    (the embedding again) last, alone."""
    from megatron.core import parallel_state

    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    units: list[list[ParamMapping]] = []
    for m in parameter_mappings(spec, pp_rank=pp_rank, pp_size=pp_size):
        module = m.mcore.rsplit(".", 1)[0]
        if units and units[-1][0].mcore.rsplit(".", 1)[0] == module:
            units[-1].append(m)
        else:
            units.append([m])
    embedding = [m for unit in units for m in unit if m.hf == ("model.embed_tokens.weight",)]
    if spec.tie_word_embeddings and embedding:
        units.append([ParamMapping(embedding[-1].mcore, ("lm_head.weight",), "vocab")])
    return units


def _export_mapping(
    spec: ModelSpec, local: Mapping[str, Tensor], m: ParamMapping, dtype: torch.dtype | None
) -> list[tuple[str, Tensor]]:
    """The full HF tensors of one megatron parameter (all-gathered over the tensor-parallel group)."""
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    tensor = _norm_lookup(local, m.mcore).detach()
    shards = [tensor]
    if tp > 1 and m.kind != "norm":
        shards = [torch.empty_like(tensor) for _ in range(tp)]
        group = parallel_state.get_tensor_model_parallel_group()
        torch.distributed.all_gather(shards, tensor.contiguous(), group=group)
    full = _unshard(spec, m.kind, shards)
    return [(name, t if dtype is None else t.to(dtype)) for name, t in zip(m.hf, full, strict=True)]


def unwrapped_name(name: str) -> str:
    """A state-dict key without the ``module.`` prefixes of wrappers (Float16Module, DDP)."""
    while name.startswith("module."):
        name = name[len("module.") :]
    return name


def read_hf_safetensors(path: str | Path) -> dict[str, Tensor]:
    """All tensors of a Hugging Face model directory (``model.safetensors`` or a sharded ``*.index.json``)."""
    from safetensors.torch import load_file

    state: dict[str, Tensor] = {}
    for file in weight_files(Path(path)):
        state.update(load_file(str(file)))
    return state


def weight_files(root: Path) -> list[Path]:
    """The safetensors files of the Hugging Face model directory ``root``: ``model.safetensors``, or the shards its
    ``model.safetensors.index.json`` maps; FileNotFoundError when it has neither, ValueError for an index that is no
    such map."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            return [root / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{index} is not a safetensors index (a weight_map of file names): {err!r}") from None
    if (root / "model.safetensors").is_file():
        return [root / "model.safetensors"]
    raise FileNotFoundError(f"{root} has neither model.safetensors nor model.safetensors.index.json")
