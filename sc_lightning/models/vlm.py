"""A vision-language policy from megatron-core's multimodal pieces: a CLIP ViT, an MLP projector, a ``GPTModel``.

    pixels (N, H, W, 3) uint8 ─► /255, CLIP mean/std ─► CLIPViTModel (patches → vision hidden, no class token)
        ─► MultimodalProjector (2-layer GELU MLP) ─► image embeddings (N, tokens_per_image, hidden)
    input_ids (B, T) ─► the language model's word embeddings, each row's <image> positions replaced, in order, by
        its images' embeddings (:func:`merged_embeddings`) ─► GPTModel(decoder_input=...) ─► logits (B, T, V/TP)

:class:`VisionLanguageModel` holds the three under megatron's ``LLaVAModel`` attribute names (``vision_model``,
``vision_projection``, ``language_model``), so its state-dict names are LLaVAModel's. It is not LLaVAModel itself:

- LLaVAModel's forward expects *one* image token per image and expands it into the image's embeddings, shifting
  every later position (and the labels, the loss mask). Our prompts already hold ``tokens_per_image`` ``<image>``
  ids per image (the rollout side expands them when it tokenizes; a row's token positions, masks and logprobs then
  line up 1:1 with the language model's sequence, in the trainer and in the engine's KV cache alike), so the
  embeddings are merged in place instead.
- LLaVAModel builds its ``GPTModel`` itself; ours is :func:`~sc_lightning.models.megatron.build_gpt_model`'s, the
  text policy's exactly (SDPA attention, torch norms, its weights and tensor-parallel attributes).

The ViT is ``CLIPViTModel`` with megatron's local ViT layer spec, its core attention swapped for
:class:`~sc_lightning.models.attention.SDPACoreAttention` over all patches (CLIP's attention is bidirectional; the
local spec's causal mask type is a quirk of that spec, megatron's TE ViT spec has none). Runs on the CPU (fp32)
and at TP > 1 (the ViT's and projector's linears are column/row parallel); not with pipeline stages or sequence
parallelism (refused when built).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.vision.clip_vit_model import CLIPViTModel
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

from sc_lightning.models.attention import SDPACoreAttention
from sc_lightning.models.convert import random_hf_state
from sc_lightning.models.cpu_compat import cuda_calls_on
from sc_lightning.models.logprobs import REAL_VOCAB_ATTR, device_of
from sc_lightning.models.megatron import (
    build_gpt_model,
    load_megatron_state,
    mark_tensor_parallel_weights,
    quiet_megatron,
)
from sc_lightning.models.spec import ModelSpec, VisionSpec
from sc_lightning.models.vlm_weights import is_vision_name, shard_vision_state

NEVER_LOGIT = -1.0e4
"""The logit a VLM gives ``<image>`` as a next token, in the trainer and the engine alike: its probability is exactly
0 after the softmax (so a completion never holds one, and both sides normalise over the same tokens), yet a
position whose target *is* ``<image>`` (a prompt position, outside the loss) keeps a finite logprob (-inf there
would turn a masked product into NaN)."""

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
"""Per-channel normalisation of pixels in [0, 1] (OpenAI CLIP's, which LLaVA-style towers were trained with)."""


class VisionLanguageModel(MegatronModule):
    """A megatron-core VLM: ``vision_model`` (CLIPViTModel) → ``vision_projection`` (MultimodalProjector) → the
    ``<image>`` positions of ``language_model`` (a GPTModel)'s input.

    ``forward(input_ids, position_ids, attention_mask, images=None)`` is ``GPTModel``'s with each row's images
    (``images[b]``: uint8 ``(n_b, H, W, 3)``; None: a text-only batch) merged in (:func:`merged_embeddings`).
    """

    def __init__(
        self,
        language_model: GPTModel,
        vision_model: CLIPViTModel,
        vision_projection: MultimodalProjector,
        vision: VisionSpec,
    ) -> None:
        super().__init__(config=language_model.config)
        self.language_model = language_model
        self.vision_model = vision_model
        self.vision_projection = vision_projection
        self.vision = vision
        self.share_embeddings_and_output_weights = language_model.share_embeddings_and_output_weights

    def shared_embedding_or_output_weight(self) -> Tensor:
        """The language model's word embeddings (megatron's gradient finalisation asks the model for them)."""
        return self.language_model.shared_embedding_or_output_weight()

    def set_input_tensor(self, input_tensor: Tensor | list[Tensor]) -> None:
        """megatron's pipeline hook; one stage only, so there is never an input from an earlier stage."""
        self.language_model.set_input_tensor(input_tensor)

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor | None,
        attention_mask: Tensor | None,
        images: Sequence[Tensor] | None = None,
    ) -> Tensor:
        """Logits ``(B, T, V/TP)`` of ``input_ids`` with each row's images at its ``<image>`` positions; the
        ``<image>`` column is :data:`NEVER_LOGIT`."""
        decoder_input = merged_embeddings(self, input_ids, position_ids, images)
        logits = self.language_model(input_ids, position_ids, attention_mask, decoder_input=decoder_input)
        never_predict(logits, self.vision.image_token_id)
        return logits


def never_predict(logits: Tensor, token_id: int) -> None:
    """Set column ``token_id`` of vocab-parallel ``logits`` ``(..., V/TP)`` to :data:`NEVER_LOGIT` in place, on the
    tensor-parallel rank whose slice holds it (a decode step's logits: ``(R, V)`` at TP=1)."""
    local = logits.shape[-1]
    start = parallel_state.get_tensor_model_parallel_rank() * local
    if start <= token_id < start + local:
        logits[..., token_id - start] = NEVER_LOGIT


def language_model_of(model: torch.nn.Module) -> torch.nn.Module:
    """The ``GPTModel`` that decodes text: a VLM's language model, or ``model`` itself (a text policy)."""
    return model.language_model if isinstance(model, VisionLanguageModel) else model


def vision_of(model: torch.nn.Module) -> VisionSpec | None:
    """The vision side's spec of ``model`` (a VLM, or one a wrapper holds as ``.module``); None: a text model."""
    while model is not None:
        if isinstance(model, VisionLanguageModel):
            return model.vision
        model = getattr(model, "module", None)
    return None


def check_images_out_of_loss(input_ids: Tensor, loss_tokens: Tensor, vision: VisionSpec) -> None:
    """ValueError naming the rows whose ``<image>`` positions count in the loss (``loss_tokens`` (B, T) nonzero
    there): image tokens are prompt tokens, never trained (one device read)."""
    leaked = ((input_ids.to(loss_tokens.device) == vision.image_token_id) & (loss_tokens != 0)).any(dim=1)
    if leaked.any():
        rows = torch.nonzero(leaked)[:, 0].tolist()
        raise ValueError(
            f"rows {rows[:8]} have <image> tokens (id {vision.image_token_id}) in the loss (token_mask 1): image "
            f"tokens belong to the prompt, and a completion never holds one"
        )


def image_embeddings(model: VisionLanguageModel, pixels: Tensor) -> Tensor:
    """``(N, tokens_per_image, hidden)`` projected patch embeddings of uint8 ``pixels`` ``(N, H, W, 3)``.

    The pixels (RGB, already ``image_size`` square) are scaled to [0, 1] and normalised with CLIP's mean and std here.
    """
    size = model.vision.image_size
    if pixels.dim() != 4 or tuple(pixels.shape[1:]) != (size, size, 3):
        raise ValueError(f"images must be uint8 (N, {size}, {size}, 3), got {tuple(pixels.shape)}")
    param = next(model.vision_model.parameters())
    x = pixels.to(param.device).permute(0, 3, 1, 2).to(param.dtype) / 255.0  # (N, 3, H, W)
    mean = torch.tensor(CLIP_MEAN, dtype=param.dtype, device=param.device)[:, None, None]
    std = torch.tensor(CLIP_STD, dtype=param.dtype, device=param.device)[:, None, None]
    return model.vision_projection(model.vision_model((x - mean) / std))  # (N, P, vision) -> (N, P, hidden)


def merged_embeddings(
    model: VisionLanguageModel, input_ids: Tensor, position_ids: Tensor | None, images: Sequence[Tensor] | None
) -> Tensor:
    """The language model's input ``(T, B, hidden)`` (megatron's ``decoder_input``): its embeddings of ``input_ids``
    ``(B, T)``, row ``b``'s ``<image>`` positions replaced, in order, by the embeddings of ``images[b]``'s images.

    Each image fills ``tokens_per_image`` positions; a row's ``<image>`` count must be exactly that times its image
    count (ValueError otherwise). ``images`` None: no row has images (and none may hold ``<image>`` ids).
    """
    language = model.language_model
    embeddings = language.embedding(input_ids=input_ids, position_ids=position_ids)  # (T, B, h)
    is_image = input_ids.to(embeddings.device) == model.vision.image_token_id  # (B, T)
    per_row = [0] * input_ids.shape[0] if images is None else [len(row) for row in images]
    if len(per_row) != input_ids.shape[0]:
        raise ValueError(f"{len(per_row)} rows of images for {input_ids.shape[0]} rows of tokens")
    counts = is_image.sum(dim=1).tolist()
    tokens = model.vision.tokens_per_image
    for row, (found, n) in enumerate(zip(counts, per_row, strict=True)):
        if found != n * tokens:
            raise ValueError(
                f"row {row} holds {found} <image> ids but {n} image(s) of {tokens} tokens each: every image needs "
                f"exactly tokens_per_image ({tokens}) consecutive <image> ids"
            )
    if not any(per_row):
        return embeddings
    pixels = torch.cat([row for row in images if len(row)])  # (N, H, W, 3), rows in order, images in order
    patches = image_embeddings(model, pixels).reshape(-1, embeddings.shape[-1]).to(embeddings.dtype)
    merged = embeddings.transpose(0, 1).masked_scatter(is_image[..., None], patches)  # fills row-major: in order
    return merged.transpose(0, 1).contiguous()


def vlm_logits(model: VisionLanguageModel, input_ids: Tensor, images: Sequence[Tensor] | None) -> Tensor:
    """The full forward: logits ``(B, T, V/TP)`` (vocab-parallel at TP > 1) of ``input_ids`` with ``images``."""
    return model(input_ids.to(device_of(model)), None, None, images=images)


def _vision_layer_spec() -> ModuleSpec:
    """megatron's local ViT layer spec with SDPA core attention and no attention mask (CLIP is bidirectional)."""
    spec = get_vit_layer_with_local_spec()
    attention = spec.submodules.self_attention
    attention = dataclasses.replace(
        attention,
        params={**attention.params, "attn_mask_type": AttnMaskType.no_mask},
        submodules=dataclasses.replace(attention.submodules, core_attention=SDPACoreAttention),
    )
    return dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, self_attention=attention))


def vision_configs(language: TransformerConfig, vision: VisionSpec) -> tuple[TransformerConfig, TransformerConfig]:
    """The ViT's and the projector's ``TransformerConfig``: the language model's (precision, TP, initialisation,
    fusions) with LayerNorm, GELU, biases, and their own widths (the projector outputs the language width)."""
    common = {
        "normalization": "LayerNorm",
        "gated_linear_unit": False,
        "activation_func": F.gelu,
        "add_bias_linear": True,
        "use_te_activation_func": False,
        "apply_rope_fusion": False,
        "qk_layernorm": False,
    }
    tower = dataclasses.replace(
        language,
        num_layers=vision.num_layers,
        hidden_size=vision.hidden_size,
        num_attention_heads=vision.num_attention_heads,
        num_query_groups=vision.num_attention_heads,
        kv_channels=vision.hidden_size // vision.num_attention_heads,
        ffn_hidden_size=vision.ffn_hidden_size,
        layernorm_epsilon=vision.norm_eps,
        add_qkv_bias=True,
        **common,
    )
    projector = dataclasses.replace(language, ffn_hidden_size=vision.projector_hidden_size, **common)
    return tower, projector


def build_vlm(
    spec: ModelSpec,
    *,
    precision: str = "fp32",
    seed: int = 0,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    sequence_parallel: bool = False,
    activation_checkpointing: bool = False,
    hf_state: dict[str, Tensor] | None = None,
    device: str | torch.device = "cpu",
    fused_kernels: bool | None = None,
) -> VisionLanguageModel:
    """The :class:`VisionLanguageModel` of ``spec`` (``spec.vision`` set) for this rank, with ``hf_state`` weights
    (the VLM interchange state, :mod:`~sc_lightning.models.vlm_weights`) or seeded random ones.

    The language model is :func:`~sc_lightning.models.megatron.build_gpt_model`'s of ``spec.language`` (same
    options); the vision side is built beside it and loaded with this rank's blocks of the whole tensors.
    """
    if spec.vision is None:
        raise ValueError("build_vlm needs a ModelSpec with vision; build a text model with build_gpt_model")
    if sequence_parallel:
        raise ValueError("a vision-language model does not support sequence_parallel; set it to false")
    spec.check_parallel(tensor_parallel_size, pipeline_parallel_size)
    weights = hf_state if hf_state is not None else random_hf_state(spec, seed)
    language = build_gpt_model(
        spec.language,
        precision=precision,
        seed=seed,
        tensor_parallel_size=tensor_parallel_size,
        activation_checkpointing=activation_checkpointing,
        hf_state={name: t for name, t in weights.items() if not is_vision_name(name)},
        device=device,
        fused_kernels=fused_kernels,
    )
    vision = spec.vision
    with quiet_megatron(), cuda_calls_on(torch.device("cpu")):  # CLIPViTModel puts its position ids on .cuda()
        tower_config, projector_config = vision_configs(language.config, vision)
        tower = CLIPViTModel(
            tower_config,
            _vision_layer_spec(),
            ln_pre_impl=WrappedTorchNorm,
            add_class_token=False,
            class_token_len=0,
            patch_dim=vision.patch_size,
            img_h=vision.image_size,
            img_w=vision.image_size,
        )
        projector = MultimodalProjector(
            projector_config,
            MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
            "mlp",
            vision.hidden_size,
        )
    full = {name: t.to(language.config.params_dtype) for name, t in weights.items() if is_vision_name(name)}
    blocks = shard_vision_state(full, parallel_state.get_tensor_model_parallel_rank(), tensor_parallel_size)
    for prefix, module in (("vision_model.", tower), ("vision_projection.", projector)):
        mark_tensor_parallel_weights(module)
        load_megatron_state(module, {n.removeprefix(prefix): t for n, t in blocks.items() if n.startswith(prefix)})
        module.to(device=device, dtype=language.config.params_dtype)
    tower.position_ids = tower.position_ids.to(device)  # a plain attribute, which .to() leaves behind
    model = VisionLanguageModel(language, tower, projector, vision)
    setattr(model, REAL_VOCAB_ATTR, spec.vocab_size)  # token_logprobs masks the TP padding rows with it
    return model
