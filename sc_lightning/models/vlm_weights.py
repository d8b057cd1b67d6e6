"""The weights of a vision-language model's vision side as full tensors: names, shapes, seeded values, TP shards.

A VLM's *interchange state* (what ``random_hf_state``, ``hf_to_megatron_state`` and a refit's ``export_hf_units``
carry for a :class:`~sc_lightning.models.spec.ModelSpec` with ``vision``) is its language model's Hugging Face
tensors plus the vision side's under their megatron names (``vision_model.*``: the CLIP ViT of
:mod:`sc_lightning.models.vlm`; ``vision_projection.*``: the MLP projector), whole (the TP=1 layout). No Hugging
Face format exists for this tower (see ``docs/vlm.md``), so the names are megatron's own.

A tensor-parallel rank holds a contiguous block of each column-parallel weight and bias (``linear_qkv``,
``linear_fc1``: dim 0; q, k, v are interleaved per head in megatron's layout, so a block is whole heads) and of each
row-parallel weight (``linear_proj``, ``linear_fc2``: dim 1); everything else is replicated.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import Tensor

from sc_lightning.models.spec import ModelSpec, VisionSpec

VISION_PREFIXES = ("vision_model.", "vision_projection.")
"""Where a VLM's vision tower and projector live (megatron's ``LLaVAModel`` names them so too)."""


def is_vision_name(name: str) -> bool:
    """Whether ``name`` is a vision-side tensor of a VLM's interchange or megatron state."""
    return name.startswith(VISION_PREFIXES)


def split_dim(name: str) -> int | None:
    """The dimension a tensor-parallel rank's block of vision tensor ``name`` is cut along; None: replicated."""
    module, kind = name.rsplit(".", 2)[-2:]
    if module in ("linear_qkv", "linear_fc1"):
        return 0
    if module in ("linear_proj", "linear_fc2") and kind == "weight":
        return 1
    return None


def vision_param_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every vision-side tensor of VLM ``spec`` and its full shape, in the model's parameter order."""
    vision: VisionSpec = spec.vision
    h, f, p = vision.hidden_size, vision.ffn_hidden_size, vision.projector_hidden_size
    shapes: dict[str, tuple[int, ...]] = {
        "vision_model.position_embeddings.weight": (vision.tokens_per_image, h),
        "vision_model.ln_pre.weight": (h,),
        "vision_model.ln_pre.bias": (h,),
        "vision_model.conv1.weight": (h, 3, vision.patch_size, vision.patch_size),
    }
    for i in range(vision.num_layers):
        layer = f"vision_model.decoder.layers.{i}."
        for name, shape in (
            ("input_layernorm", (h,)),
            ("self_attention.linear_proj", (h, h)),
            ("self_attention.linear_qkv", (3 * h, h)),
            ("pre_mlp_layernorm", (h,)),
            ("mlp.linear_fc1", (f, h)),
            ("mlp.linear_fc2", (h, f)),
        ):
            shapes[f"{layer}{name}.weight"] = shape
            shapes[f"{layer}{name}.bias"] = (shape[0],)
    for name, shape in (("linear_fc1", (p, h)), ("linear_fc2", (spec.hidden_size, p))):
        shapes[f"vision_projection.encoder.{name}.weight"] = shape
        shapes[f"vision_projection.encoder.{name}.bias"] = (shape[0],)
    return shapes


def random_vision_state(spec: ModelSpec, seed: int, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """Seeded random vision-side weights of VLM ``spec`` (normal(0, 0.02); norms 1, biases 0), whole, on the CPU.

    Its own generator (the global RNG is untouched), so the same seed gives the same tower at any TP size.
    """
    generator = torch.Generator().manual_seed(seed + 7919)  # a stream apart from the language model's
    state = {}
    for name, shape in vision_param_shapes(spec).items():
        if name.endswith("bias"):
            state[name] = torch.zeros(shape, dtype=dtype, device="cpu")
        elif "layernorm" in name or "ln_pre" in name:
            state[name] = torch.ones(shape, dtype=dtype, device="cpu")
        else:
            state[name] = (torch.randn(shape, generator=generator, device="cpu") * 0.02).to(dtype)
    return state


def shard_vision_state(state: Mapping[str, Tensor], tp_rank: int, tp_size: int) -> dict[str, Tensor]:
    """Tensor-parallel rank ``tp_rank``'s block of each whole vision tensor in ``state`` (contiguous copies)."""
    out = {}
    for name, tensor in state.items():
        dim = split_dim(name)
        block = tensor if dim is None or tp_size == 1 else tensor.chunk(tp_size, dim=dim)[tp_rank]
        out[name] = block.contiguous()
    return out


def unshard_vision_tensor(name: str, shards: list[Tensor]) -> Tensor:
    """The whole vision tensor ``name`` from every tensor-parallel rank's block, in rank order."""
    dim = split_dim(name)
    return shards[0] if dim is None or len(shards) == 1 else torch.cat(shards, dim=dim)


def _module_units(names: list[str]) -> list[list[str]]:
    """``names`` grouped into runs of one module's tensors (``a.b.weight``, ``a.b.bias`` → one unit)."""
    units: list[list[str]] = []
    for name in names:
        if units and units[-1][0].rsplit(".", 1)[0] == name.rsplit(".", 1)[0]:
            units[-1].append(name)
        else:
            units.append([name])
    return units


def vision_unit_headers(
    spec: ModelSpec, local: Mapping[str, Tensor], dtype: torch.dtype | None = None
) -> list[list[tuple[str, tuple[int, ...], torch.dtype]]]:
    """``(name, whole shape, dtype)`` of every tensor :func:`vision_units` yields, unit by unit; no collectives."""
    shapes = vision_param_shapes(spec)
    return [[(n, shapes[n], dtype or local[n].dtype) for n in unit] for unit in _module_units(list(shapes))]


def vision_units(
    spec: ModelSpec, local: Mapping[str, Tensor], dtype: torch.dtype | None = None
) -> Iterator[list[tuple[str, Tensor]]]:
    """The whole vision tensors of VLM ``spec`` (``local``: this rank's state, megatron names), one unit per module
    in :func:`vision_param_shapes` order; at TP > 1 every tensor-parallel rank must iterate (blocks are
    all-gathered)."""
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    group = parallel_state.get_tensor_model_parallel_group() if tp > 1 else None
    for unit in _module_units(list(vision_param_shapes(spec))):
        out = []
        for name in unit:
            tensor = local[name].detach()
            shards = [tensor]
            if tp > 1 and split_dim(name) is not None:
                shards = [torch.empty_like(tensor) for _ in range(tp)]
                torch.distributed.all_gather(shards, tensor.contiguous(), group=group)
            whole = unshard_vision_tensor(name, shards)
            out.append((name, whole if dtype is None else whole.to(dtype)))
        yield out
