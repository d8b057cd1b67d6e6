"""Tiny random Hugging Face model directories as a user brings them: written by ``transformers`` itself (its config
class, its random init, ``save_pretrained``), with a byte-level BPE tokenizer trained by ``tokenizers`` on a small
corpus and a chat template in the style of the architecture's instruct models. Nothing is downloaded."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class TokenizerStyle:
    """The special tokens and chat template of one model family's instruct tokenizer (bos None: it has none)."""

    bos: str | None
    eos: str
    pad: str | None
    extra_specials: tuple[str, ...]
    chat_template: str


LLAMA3_STYLE = TokenizerStyle(
    bos="<|begin_of_text|>",
    eos="<|eot_id|>",
    pad=None,  # Llama-3 has no pad token: the eos pads
    extra_specials=("<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>"),
    chat_template=(
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
)
QWEN_STYLE = TokenizerStyle(
    bos=None,
    eos="<|im_end|>",
    pad="<|endoftext|>",
    extra_specials=("<|im_start|>",),
    chat_template=(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
)


@dataclass(frozen=True)
class HFArchitecture:
    """One architecture's tiny config (``transformers`` keyword arguments) and its tokenizer's style."""

    model_type: str
    style: TokenizerStyle
    config: dict[str, Any] = field(default_factory=dict)


TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 256,
}
HF_ARCHITECTURES: dict[str, HFArchitecture] = {
    "llama3": HFArchitecture(
        "llama",
        LLAMA3_STYLE,
        {
            "tie_word_embeddings": False,
            "max_position_embeddings": 16384,  # above the scaling's original context, as in Llama-3.x
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
    ),
    "qwen2.5": HFArchitecture("qwen2", QWEN_STYLE, {"tie_word_embeddings": True, "rope_theta": 1000000.0}),
    "qwen3": HFArchitecture("qwen3", QWEN_STYLE, {"tie_word_embeddings": True, "rope_theta": 1000000.0}),
}
"""Llama-3.x (llama3 RoPE scaling, untied), Qwen2.5 (q/k/v biases, tied) and Qwen3 (QK-norm, tied), at tiny sizes."""
HF_VARIANTS = tuple(f"hf-{name}" for name in HF_ARCHITECTURES)
"""The model-layer tests' names of the :data:`HF_ARCHITECTURES` directories (beside ``TINY_VARIANTS``)."""
CORPUS = [f"{a}+{b}={a + b}" for a in range(10) for b in range(10)] + [
    "Add the numbers and answer with their sum.",
    "You are a helpful assistant. What is the answer?",
    "system user assistant",
]
"""What the BPE tokenizer is trained on: the arithmetic prompts, their answers and the chat words."""


def save_bpe_tokenizer(path: Path, style: TokenizerStyle, vocab_size: int = 320) -> Any:
    """A byte-level BPE tokenizer trained on :data:`CORPUS` with ``style``'s special tokens and chat template, saved
    at ``path`` as a Hugging Face tokenizer (``tokenizer.json``, ``tokenizer_config.json``); the transformers one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [t for t in (style.bos, style.eos, style.pad, *style.extra_specials) if t is not None]
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    raw.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=style.bos,
        eos_token=style.eos,
        pad_token=style.pad,
        chat_template=style.chat_template,
    )
    tokenizer.save_pretrained(str(path))
    return tokenizer


def make_hf_model_dir(path: Path, name: str, *, seed: int = 0, **overrides: Any) -> Path:
    """A tiny random :data:`HF_ARCHITECTURES` ``name`` model with its BPE tokenizer, written to ``path`` by
    ``transformers``, its config changed by ``overrides`` (``tie_word_embeddings=True``, ``vocab_size`` above the
    tokenizer's); returns ``path``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = HF_ARCHITECTURES[name]
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = save_bpe_tokenizer(path, arch.style)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = AutoConfig.for_model(
        arch.model_type,
        pad_token_id=tokenizer.pad_token_id,
        **(ids | {"vocab_size": len(tokenizer)} | TINY_SHAPE | arch.config | overrides),
    )
    with torch.random.fork_rng():  # transformers' random init draws from the global generator
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(path))  # config.json names its class in architectures
    return path
