"""An inference-only distillation teacher: a megatron-core model that scores token sequences (docs/distillation.md).

:class:`TeacherModel` loads a teacher as the policy is loaded (``load_policy``: a ``builtin:`` model, an HF directory,
an exported bundle's ``hf/``), checks at start that its tokenizer is the policy's (a teacher that reads other ids
would score nonsense), and returns per-token logprobs: the sampled token's, or with ``full_vocabulary`` the whole
distribution at each position. Its forward passes run in a worker thread, at most ``max_batch_rows`` rows at a time,
so the rollout side's event loop goes on while it scores.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from sc_lightning.models.logprobs import logits_of, token_logprobs
from sc_lightning.models.megatron import load_policy
from sc_lightning.tokenizer import Tokenizer


class TeacherMismatchError(ValueError):
    """A teacher cannot judge the policy's samples (another tokenizer, a vocabulary too large for its knob)."""


def tokenizer_identity(tokenizer: Tokenizer) -> tuple[Any, ...]:
    """What makes two tokenizers produce the same ids: their kind, vocabulary size, special ids and (for a Hugging Face
    tokenizer) the whole token-to-id map."""
    hf = getattr(tokenizer, "transformers_tokenizer", None)
    vocabulary = tuple(sorted(hf.get_vocab().items())) if hf is not None else ()
    ids = (tokenizer.vocab_size, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id)
    return (type(tokenizer).__name__, *ids, vocabulary)


class TeacherModel:
    """One teacher's model in this process: per-token logprobs of token sequences, without gradient."""

    def __init__(
        self,
        alias: str,
        model_name: str,
        *,
        policy_tokenizer: Tokenizer,
        precision: str = "fp32",
        seed: int = 0,
        device: str | torch.device = "cpu",
        full_vocabulary: bool = False,
        max_full_vocabulary_size: int | None = None,
        max_batch_rows: int = 64,
    ) -> None:
        """Load the teacher; TeacherMismatchError naming the teacher and the knob when its tokenizer is not the
        policy's, or (full_vocabulary) its vocabulary exceeds ``max_full_vocabulary_size``."""
        knob = f"on_policy_distillation.teachers.{alias}.model_name"
        self.model, self.spec, tokenizer = load_policy(model_name, precision=precision, seed=seed, device=device)
        if tokenizer_identity(tokenizer) != tokenizer_identity(policy_tokenizer):
            raise TeacherMismatchError(
                f"teacher {alias!r} ({knob}={model_name!r}) has the tokenizer {tokenizer!r}, not the policy's "
                f"{policy_tokenizer!r}: it would score other ids than the policy samples; use a teacher trained with "
                "the policy's tokenizer"
            )
        if full_vocabulary and max_full_vocabulary_size is not None and self.spec.vocab_size > max_full_vocabulary_size:
            raise TeacherMismatchError(
                f"teacher {alias!r} ({knob}={model_name!r}) has a vocabulary of {self.spec.vocab_size}, over "
                f"on_policy_distillation.max_full_vocabulary_size={max_full_vocabulary_size}: full_vocabulary stores "
                f"T x {self.spec.vocab_size} x 4 bytes per row; use full_vocabulary: false or raise the limit"
            )
        self.model.eval()
        self.alias = alias
        self.full_vocabulary = full_vocabulary
        self.max_batch_rows = max_batch_rows

    def logprobs(self, sequences: Sequence[Sequence[int]], temperature: float = 1.0) -> list[torch.Tensor]:
        """Each sequence's (T,) logprobs of its own tokens (0 at t = 0), or with full_vocabulary its (T, V) logprobs
        of every entry (position t: the distribution of token t given tokens < t; row 0 is 0); CPU fp32."""
        out: list[torch.Tensor] = []
        for start in range(0, len(sequences), self.max_batch_rows):
            batch = sequences[start : start + self.max_batch_rows]
            lengths = [len(ids) for ids in batch]
            ids = torch.zeros(len(batch), max(lengths), dtype=torch.long)
            for row, seq in enumerate(batch):
                ids[row, : len(seq)] = torch.tensor(list(seq), dtype=torch.long)
            with torch.no_grad():
                scored = self._forward(ids, temperature).float().cpu()
            out += [scored[row, :length] for row, length in enumerate(lengths)]
        return out

    def _forward(self, ids: torch.Tensor, temperature: float) -> torch.Tensor:
        """(B, T) logprobs of ``ids``, or (B, T, V) full distributions aligned the same way."""
        vocab = self.spec.vocab_size
        if not self.full_vocabulary:
            return token_logprobs(self.model, ids, temperature=temperature, vocab_size=vocab)
        logits = logits_of(self.model, ids, vocab_size=vocab) / temperature  # (B, T, V): logits[t] predicts t + 1
        return F.pad(torch.log_softmax(logits, -1)[:, :-1], (0, 0, 1, 0))  # shift: position t predicts token t

    async def score(self, sequences: Sequence[Sequence[int]], *, temperature: float) -> list[torch.Tensor]:
        """:meth:`logprobs` in a worker thread (the caller's event loop goes on)."""
        return await asyncio.to_thread(self.logprobs, sequences, temperature)

    async def shutdown(self) -> None:
        """Nothing to release beyond the model, which goes with this object."""
