"""Architecture numbers of a Llama/Qwen-family decoder (:class:`ModelSpec`), of a vision-language model's vision
side (:class:`VisionSpec`), and the built-in model registry.

Plain data, no torch or megatron import, so configs, engines and tests can read a model's shape cheaply.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

Arch = Literal["llama", "qwen2", "qwen3"]
"""The Hugging Face ``model_type`` of a :class:`ModelSpec` (docs/config-reference.md lists the architectures)."""


@dataclass(frozen=True)
class VisionSpec:
    """The vision side of a vision-language model: a CLIP-style ViT over square RGB images and an MLP projector.

    An image is cut into ``patch_size`` x ``patch_size`` patches, each one image token
    (:attr:`tokens_per_image`); the ViT (``num_layers`` pre-norm LayerNorm + GELU layers of ``hidden_size``, no
    class token) encodes them and a two-layer GELU MLP (``projector_hidden_size`` wide) maps each to the language
    model's width. In a prompt, an image occupies ``tokens_per_image`` consecutive ``image_token_id`` ids.
    """

    image_size: int
    patch_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    ffn_hidden_size: int
    projector_hidden_size: int
    image_token_id: int
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        positive = ("image_size", "patch_size", "hidden_size", "num_layers", "num_attention_heads")
        for name in (*positive, "ffn_hidden_size", "projector_hidden_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"VisionSpec.{name} must be >= 1, got {getattr(self, name)}")
        if self.image_size % self.patch_size:
            raise ValueError(
                f"VisionSpec.image_size ({self.image_size}) is not a multiple of patch_size ({self.patch_size})"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"VisionSpec.hidden_size ({self.hidden_size}) is not a multiple of num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.image_token_id < 0:
            raise ValueError(f"VisionSpec.image_token_id must be >= 0, got {self.image_token_id}")

    @property
    def tokens_per_image(self) -> int:
        """Image tokens (patches) one image occupies in a prompt: ``(image_size // patch_size) ** 2``."""
        return (self.image_size // self.patch_size) ** 2

    def num_parameters(self, language_hidden_size: int) -> int:
        """Parameters of the vision tower and of the projector into a ``language_hidden_size``-wide model."""
        hidden, ffn, proj = self.hidden_size, self.ffn_hidden_size, self.projector_hidden_size
        embed = 3 * self.patch_size**2 * hidden + self.tokens_per_image * hidden + 2 * hidden  # conv, positions, ln_pre
        layer = 4 * hidden * hidden + 4 * hidden + 2 * hidden * ffn + ffn + hidden + 4 * hidden  # attn, mlp, 2 norms
        projector = hidden * proj + proj + proj * language_hidden_size + language_hidden_size
        return embed + self.num_layers * layer + projector

    def check_parallel(self, tensor_parallel_size: int = 1) -> None:
        """Raise ValueError when the vision side cannot be split over ``tensor_parallel_size`` ranks."""
        for name in ("num_attention_heads", "ffn_hidden_size", "projector_hidden_size"):
            if getattr(self, name) % tensor_parallel_size:
                raise ValueError(
                    f"vision {name} ({getattr(self, name)}) is not divisible by tensor_parallel_size "
                    f"({tensor_parallel_size})"
                )


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a RMSNorm + SwiGLU + RoPE + GQA decoder, in Hugging Face terms.

    ``arch`` is the Hugging Face ``model_type`` the model came from (and is written back as); Qwen3 adds QK-norm
    (:attr:`qk_layernorm`). ``vocab_size`` is the real vocabulary (the HF embedding rows); megatron may pad it (see
    :meth:`padded_vocab_size`). ``head_dim`` defaults to ``hidden_size // num_attention_heads``.
    ``rope_scaling_factor`` enables Llama-3 style RoPE scaling (low/high frequency factors 1 and 4, original
    context 8192, the values megatron-core hard-codes). ``vision`` makes it a vision-language model
    (:mod:`sc_lightning.models.vlm`): this decoder is its language model, ``vision`` its vision side.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    norm_eps: float = 1e-6
    head_dim: int | None = None
    rope_scaling_factor: float | None = None
    arch: Arch = "qwen2"
    vision: VisionSpec | None = None

    def __post_init__(self) -> None:
        positive = ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "num_query_groups")
        for name in (*positive, "ffn_hidden_size", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelSpec.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"ModelSpec.num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_query_groups ({self.num_query_groups})"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"ModelSpec.hidden_size ({self.hidden_size}) is not a multiple of num_attention_heads "
                f"({self.num_attention_heads}); give head_dim explicitly"
            )
        if self.vision is not None and not 0 <= self.vision.image_token_id < self.vocab_size:
            raise ValueError(
                f"VisionSpec.image_token_id ({self.vision.image_token_id}) is outside the vocabulary [0, "
                f"{self.vocab_size})"
            )

    @property
    def qk_layernorm(self) -> bool:
        """Whether each attention head's query and key pass through an RMSNorm before RoPE (Qwen3's QK-norm)."""
        return self.arch == "qwen3"

    @property
    def kv_channels(self) -> int:
        """Size of one attention head (megatron's ``kv_channels``)."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def num_parameters(self) -> int:
        """Parameters of the model in Hugging Face terms (the real vocabulary, no padding), counted from the shape."""
        hidden, head = self.hidden_size, self.kv_channels
        query, key_value = self.num_attention_heads * head, self.num_query_groups * head
        attention = 2 * hidden * query + 2 * hidden * key_value  # q, o; k, v
        attention += (query + 2 * key_value) * self.qkv_bias + 2 * head * self.qk_layernorm
        layer = attention + 3 * hidden * self.ffn_hidden_size + 2 * hidden  # + gate, up, down; two norms
        embeddings = self.vocab_size * hidden * (1 if self.tie_word_embeddings else 2)
        vision = 0 if self.vision is None else self.vision.num_parameters(hidden)
        return self.num_layers * layer + embeddings + hidden + vision  # + the final norm

    @property
    def language(self) -> ModelSpec:
        """The decoder alone: this spec without its vision side (itself for a text model)."""
        return self if self.vision is None else self.replace(vision=None)

    def padded_vocab_size(self, tensor_parallel_size: int = 1) -> int:
        """Embedding rows megatron allocates: ``vocab_size`` rounded up to a multiple of ``tensor_parallel_size``.

        The padding rows are zeros that nothing reads: the trainer masks their logits out of every softmax
        (:mod:`sc_lightning.models.logprobs`), the Megatron engine samples from the first ``vocab_size`` logits only,
        and an export drops them."""
        tp = tensor_parallel_size
        return -(-self.vocab_size // tp) * tp

    def check_parallel(self, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1) -> None:
        """Raise ValueError when the model cannot be split ``tensor_parallel_size`` x ``pipeline_parallel_size``."""
        tp, pp = tensor_parallel_size, pipeline_parallel_size
        for name in ("num_attention_heads", "num_query_groups", "ffn_hidden_size"):
            if getattr(self, name) % tp:
                raise ValueError(f"{name} ({getattr(self, name)}) is not divisible by tensor_parallel_size ({tp})")
        if self.num_layers % pp:
            raise ValueError(f"num_layers ({self.num_layers}) is not divisible by pipeline_parallel_size ({pp})")
        if self.vision is not None:
            if pp > 1:
                raise ValueError(f"a vision-language model runs on one pipeline stage, not {pp}")
            self.vision.check_parallel(tp)

    def replace(self, **changes: object) -> ModelSpec:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


# Sized for the CharTokenizer (vocab 18) and the arithmetic tasks: ~70k parameters, a 16 x 32-token GRPO step runs in
# milliseconds on 2 CPU cores.
_TINY = ModelSpec(
    vocab_size=18,
    hidden_size=64,
    num_layers=2,
    num_attention_heads=2,  # head_dim 32: the smallest head size vLLM's CPU attention supports
    num_query_groups=2,
    ffn_hidden_size=128,
    max_position_embeddings=256,
    rope_theta=10000.0,
    qkv_bias=True,
    tie_word_embeddings=False,
    norm_eps=1e-6,
    arch="qwen2",
)
BUILTIN_SPECS: dict[str, ModelSpec] = {
    "builtin:tiny": _TINY,
    # The same family and tokenizer at 142M parameters (12 x 11.8M per layer): big enough that one GPU matters,
    # small enough that a GRPO step on the arithmetic task takes a fraction of a second on an H200.
    "builtin:small": _TINY.replace(
        hidden_size=1024,
        num_layers=12,
        num_attention_heads=16,  # head_dim 64
        num_query_groups=8,
        ffn_hidden_size=2816,
    ),
    # 312M parameters (12 x 26.0M per layer) with a 4,096-token context, for the worked-arithmetic answers of up to
    # 2,045 tokens (configs/grpo_1gpu_long.yaml). Wide and shallow: a decode step's time grows with the layers, and
    # the long tail of the answers is decoded a few rows at a time, one step per token.
    "builtin:medium": _TINY.replace(
        hidden_size=1536,
        num_layers=12,
        num_attention_heads=12,  # head_dim 128
        num_query_groups=6,  # 2 query heads a KV group, as builtin:small and the 1.26B benchmark shape
        ffn_hidden_size=4096,
        max_position_embeddings=4096,
    ),
    # The tiny model as the language model of a vision-language model (sc_lightning.models.vlm): the tokenizer gains
    # an <image> id (18); 32 x 32 images in 8 x 8 patches are 16 image tokens, through a one-layer 32-wide ViT.
    "builtin:tiny-vlm": _TINY.replace(
        vocab_size=19,
        vision=VisionSpec(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            num_layers=1,
            num_attention_heads=2,
            ffn_hidden_size=64,
            projector_hidden_size=64,
            image_token_id=18,
        ),
    ),
    # Benchmark shapes (benchmarks/e2e.py), seeded random over the character tokenizer; an 8K context:
    # the 1.26B Llama-style bench shape of the component benchmarks (issue 16) ...
    "builtin:bench-1.26b": ModelSpec(
        vocab_size=32000,
        hidden_size=2048,
        num_layers=24,
        num_attention_heads=16,
        num_query_groups=8,
        ffn_hidden_size=5632,
        max_position_embeddings=8192,
        arch="llama",
    ),
    # ... and Llama-3.2-1B's shape (128K vocabulary, tied embeddings; its RoPE scaling left out: it moves no work)
    "builtin:bench-llama1b": ModelSpec(
        vocab_size=128256,
        hidden_size=2048,
        num_layers=16,
        num_attention_heads=32,
        num_query_groups=8,
        ffn_hidden_size=8192,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        norm_eps=1e-5,
        arch="llama",
    ),
}


def builtin_spec(name: str) -> ModelSpec:
    """The built-in architecture called ``name`` (``"builtin:tiny"``); unknown names list the known ones."""
    try:
        return BUILTIN_SPECS[name]
    except KeyError:
        raise KeyError(f"unknown built-in model {name!r}; known: {', '.join(sorted(BUILTIN_SPECS))}") from None
