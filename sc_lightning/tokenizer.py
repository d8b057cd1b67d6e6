"""Tokenizers: the small contract the rollout side needs, a built-in character tokenizer and a Hugging Face adapter.

``load_tokenizer("builtin:char")`` (or a built-in model's name, ``"builtin:tiny"``) gives the deterministic
:class:`CharTokenizer` (the vision-language ``"builtin:tiny-vlm"``: :class:`CharImageTokenizer`, which adds an
``<image>`` id); any other name is loaded with ``transformers.AutoTokenizer`` from local files or the
Hugging Face cache only (never the network).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import groupby
from typing import Any, Protocol, runtime_checkable

BUILTIN_TOKENIZER_NAMES = (  # every built-in model uses it
    "builtin:char",
    "builtin:tiny",
    "builtin:small",
    "builtin:medium",
    "builtin:bench-1.26b",
    "builtin:bench-llama1b",
    "builtin:tiny-vlm",
)
MAX_LISTED_CHARACTERS = 12
"""How many unrepresentable characters (or pieces) an UnrepresentableTextError lists (with the total count)."""
IMAGE_PLACEHOLDER = "<image>"
"""What marks an image's place in a prompt's text (its token ids hold a run of ``<image>`` ids there)."""


@runtime_checkable
class Tokenizer(Protocol):
    """Turns text into token ids and back; exposes the special ids and the vocabulary size."""

    @property
    def eos_token_id(self) -> int:
        """Id that ends a completion."""

    @property
    def pad_token_id(self) -> int:
        """Id used to pad batches (may equal ``eos_token_id``)."""

    @property
    def bos_token_id(self) -> int | None:
        """Id that starts a sequence, or None when the tokenizer has none."""

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (every id is in ``range(vocab_size)``)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without any special tokens; UnrepresentableTextError when it cannot represent it."""

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, with special tokens left out."""


def decode_with_images(
    tokenizer: Tokenizer, ids: Sequence[int], *, image_token_id: int | None = None, tokens_per_image: int = 1
) -> str:
    """Text of ``ids`` with each image's ``tokens_per_image`` ``image_token_id`` ids shown as one ``<image>``
    placeholder: the inverse of :func:`~sc_lightning.rollout.images.image_prompt_ids` (up to the special ids
    ``decode`` leaves out). Plain ``tokenizer.decode`` when ``image_token_id`` is None."""
    if image_token_id is None:
        return tokenizer.decode(ids)
    parts = []
    for is_image, run in groupby((int(i) for i in ids), key=lambda i: i == image_token_id):
        ids_of_run = list(run)
        images = -(-len(ids_of_run) // tokens_per_image)  # a short run still stands for an image
        parts.append(IMAGE_PLACEHOLDER * images if is_image else tokenizer.decode(ids_of_run))
    return "".join(parts)


class TokenizerLoadError(OSError):
    """A tokenizer could not be loaded; the message names the model or path that was asked for."""


class UnrepresentableTextError(ValueError):
    """A text holds characters a tokenizer cannot represent: encoding would drop them or turn them into unknowns."""

    def __init__(self, tokenizer: str, text: str, characters: Sequence[str], why: str) -> None:
        shown = ", ".join(repr(c) for c in characters[:MAX_LISTED_CHARACTERS])
        more = f" and {len(characters) - MAX_LISTED_CHARACTERS} more" if len(characters) > MAX_LISTED_CHARACTERS else ""
        super().__init__(f"{tokenizer} cannot represent {shown}{more} of {text!r} ({why})")
        self.characters = tuple(characters)


def _distinct(items: Iterable[str]) -> list[str]:
    """``items`` without repeats, in order of first appearance."""
    return list(dict.fromkeys(items))


class TokenizerMismatchError(ValueError):
    """A tokenizer can produce token ids the model has no embedding row for; the message names both and the fix."""


class CharTokenizer:
    """A tiny deterministic character tokenizer for the built-in arithmetic tasks.

    Ids: 0 = pad, 1 = eos, 2 = bos, then one id per character of ``"0123456789+-*= "`` (ids 3..17);
    ``vocab_size`` is 18. ``decode`` skips the special ids and renders any id outside the vocabulary as
    U+FFFD (a model whose embedding table is padded past 18 rows can sample such ids).
    """

    PAD = 0
    EOS = 1
    BOS = 2
    CHARS = "0123456789+-*= "
    UNKNOWN = "\ufffd"

    def __init__(self) -> None:
        self._first = 3
        self._to_id = {ch: self._first + i for i, ch in enumerate(self.CHARS)}

    @property
    def eos_token_id(self) -> int:
        """Id that ends a completion (1)."""
        return self.EOS

    @property
    def pad_token_id(self) -> int:
        """Padding id (0)."""
        return self.PAD

    @property
    def bos_token_id(self) -> int:
        """Start-of-sequence id (2)."""
        return self.BOS

    @property
    def vocab_size(self) -> int:
        """Number of ids: three special ids plus one per character (18)."""
        return self._first + len(self.CHARS)

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of ``text``; UnrepresentableTextError naming every character outside the alphabet."""
        unknown = _distinct(ch for ch in text if ch not in self._to_id)
        if unknown:
            raise UnrepresentableTextError("CharTokenizer", text, unknown, f"its alphabet is {self.CHARS!r}")
        return [self._to_id[ch] for ch in text]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``: special ids are skipped, ids outside the vocabulary become U+FFFD."""
        out = []
        for raw in ids:
            i = int(raw)
            if i in (self.PAD, self.EOS, self.BOS):
                continue
            j = i - self._first
            out.append(self.CHARS[j] if 0 <= j < len(self.CHARS) else self.UNKNOWN)
        return "".join(out)

    def __repr__(self) -> str:
        return "CharTokenizer()"


class CharImageTokenizer(CharTokenizer):
    """:class:`CharTokenizer` plus a special ``<image>`` token (id 18, ``vocab_size`` 19): the tokenizer of the
    vision-language ``builtin:tiny-vlm``.

    ``encode`` turns each ``"<image>"`` in the text into the one id (the caller expands it to an image's
    ``tokens_per_image`` ids); ``decode`` skips it like the other special ids.
    """

    IMAGE = 18
    IMAGE_TOKEN = IMAGE_PLACEHOLDER

    @property
    def image_token_id(self) -> int:
        """Id of the ``<image>`` token (18)."""
        return self.IMAGE

    @property
    def vocab_size(self) -> int:
        """Number of ids: the CharTokenizer's 18 plus ``<image>``."""
        return super().vocab_size + 1

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``: ``"<image>"`` is one id, every other character as :meth:`CharTokenizer.encode`."""
        ids: list[int] = []
        for i, piece in enumerate(text.split(self.IMAGE_TOKEN)):
            ids += ([self.IMAGE] if i else []) + super().encode(piece)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` without the special ids (``<image>`` included)."""
        return super().decode([i for i in ids if int(i) != self.IMAGE])

    def __repr__(self) -> str:
        return "CharImageTokenizer()"


class HuggingFaceTokenizer:
    """Adapter from a ``transformers`` tokenizer to :class:`Tokenizer`.

    ``encode`` adds no special tokens (datasets add the bos themselves) and refuses a text the tokenizer cannot
    represent (a character it would drop or encode as its unknown token); ``decode`` skips special tokens. When the
    tokenizer has no pad token, the eos id is used for padding.
    """

    def __init__(self, hf_tokenizer: Any, name: str = "") -> None:
        self._tok = hf_tokenizer
        self.name = name or str(getattr(hf_tokenizer, "name_or_path", ""))
        eos = hf_tokenizer.eos_token_id
        if eos is None:
            raise TokenizerLoadError(f"tokenizer of {self.name!r} has no eos token; a completion could never end")
        self._eos = int(eos)
        pad = hf_tokenizer.pad_token_id
        self._pad = int(pad) if pad is not None else self._eos
        bos = hf_tokenizer.bos_token_id
        self._bos = int(bos) if bos is not None else None
        unk = getattr(hf_tokenizer, "unk_token_id", None)
        self._unk = int(unk) if unk is not None else None
        self._lost_alone: dict[str, bool] = {}  # character -> whether encoding it alone loses it

    @classmethod
    def from_pretrained(cls, name: str) -> HuggingFaceTokenizer:
        """Load ``name`` (a Hugging Face id or a local path) from local files or the HF cache, never the network."""
        try:
            from transformers import AutoTokenizer
        except ImportError as err:  # pragma: no cover - transformers is a dependency
            raise TokenizerLoadError(f"loading tokenizer {name!r} needs transformers: {err}") from err
        try:
            tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
        except Exception as err:
            raise TokenizerLoadError(
                f"could not load the tokenizer of model {name!r} from local files or the Hugging Face cache "
                f"(no network is used at runtime; download it beforehand or give a local path): "
                f"{type(err).__name__}: {err}"
            ) from err
        return cls(tok, name)

    @property
    def transformers_tokenizer(self) -> Any:
        """The wrapped ``transformers`` tokenizer (for its chat template)."""
        return self._tok

    @property
    def eos_token_id(self) -> int:
        """The tokenizer's eos id."""
        return self._eos

    @property
    def pad_token_id(self) -> int:
        """The tokenizer's pad id, or its eos id when it has none."""
        return self._pad

    @property
    def bos_token_id(self) -> int | None:
        """The tokenizer's bos id, or None."""
        return self._bos

    @property
    def vocab_size(self) -> int:
        """Number of ids including added tokens (``len(tokenizer)``)."""
        return len(self._tok)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens; UnrepresentableTextError when it cannot represent it."""
        ids, lost = self._encode(text)
        if lost:
            raise UnrepresentableTextError(
                f"the tokenizer {self.name!r}", text, lost, "it would drop them or encode them as its unknown token"
            )
        return ids

    def _encode(self, text: str) -> tuple[list[int], list[str]]:
        """``text``'s ids and what they lose: pieces encoded as the unknown token, and characters no token covers
        that the tokenizer's normalizer and pre-tokenizer keep (so its model drops them, as a byte-level BPE does
        with a byte outside its vocabulary). Whitespace a pre-tokenizer splits on is not lost."""
        if not getattr(self._tok, "is_fast", False):  # a slow tokenizer has no offsets: only unknown ids are seen
            ids = [int(i) for i in self._tok.encode(text, add_special_tokens=False)]
            return ids, [text] if self._unk is not None and self._unk in ids else []
        encoded = self._tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = [int(i) for i in encoded["input_ids"]], encoded["offset_mapping"]
        covered = [False] * len(text)
        lost = []
        for i, (start, end) in zip(ids, offsets, strict=True):
            if i == self._unk:
                lost.append(text[start:end])
            covered[start:end] = [True] * (end - start)
        lost += [ch for ch, seen in zip(text, covered, strict=True) if not seen and self._loses(ch)]
        return ids, _distinct(lost)

    def _loses(self, ch: str) -> bool:
        """Whether encoding ``ch`` alone gives nothing (though the pipeline keeps it) or only the unknown token."""
        if ch not in self._lost_alone:
            ids = [int(i) for i in self._tok.encode(ch, add_special_tokens=False)]
            self._lost_alone[ch] = all(i == self._unk for i in ids) if ids else self._pipeline_keeps(ch)
        return self._lost_alone[ch]

    def _pipeline_keeps(self, ch: str) -> bool:
        """Whether the tokenizer's normalizer and pre-tokenizer leave anything of ``ch`` for its model to encode."""
        backend = self._tok.backend_tokenizer
        text = backend.normalizer.normalize_str(ch) if backend.normalizer is not None else ch
        if backend.pre_tokenizer is None:
            return bool(text)
        return bool(text) and any(piece for piece, _ in backend.pre_tokenizer.pre_tokenize_str(text))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens skipped."""
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=True))

    def __repr__(self) -> str:
        return f"HuggingFaceTokenizer({self.name!r})"


def load_tokenizer(name: str) -> Tokenizer:
    """The tokenizer called ``name``: ``builtin:char``/``builtin:tiny`` give CharTokenizer (``builtin:tiny-vlm``
    CharImageTokenizer), others load from HF."""
    if name == "builtin:tiny-vlm":
        return CharImageTokenizer()
    if name in BUILTIN_TOKENIZER_NAMES:
        return CharTokenizer()
    if name.startswith("builtin:"):
        raise TokenizerLoadError(f"unknown built-in tokenizer {name!r}; known: {', '.join(BUILTIN_TOKENIZER_NAMES)}")
    return HuggingFaceTokenizer.from_pretrained(name)


def prompt_token_ids(tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    """Token ids of a prompt: the tokenizer's bos (when it has one) followed by the encoded text."""
    ids = tokenizer.encode(text)
    bos = tokenizer.bos_token_id
    return tuple([bos, *ids] if bos is not None else ids)


def check_tokenizer_fits_model(
    tokenizer: Tokenizer,
    model_vocab_size: int,
    *,
    model_name: str,
    tokenizer_name: str | None = None,
    model_knob: str = "policy.model_name",
) -> None:
    """TokenizerMismatchError when ``tokenizer`` can produce an id outside the model's ``range(model_vocab_size)``.

    Checks the tokenizer's whole vocabulary (any id below its ``vocab_size`` may come out of ``encode``) and its
    eos, pad and bos ids (written into every sequence). A model may have more rows than the tokenizer has ids (a
    padded embedding table), never fewer. ``model_knob`` names the config key of the model (the PPO critic's is
    ``value.model_name``).
    """
    vocab = tokenizer.vocab_size
    specials = {"eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id, "bos": tokenizer.bos_token_id}
    problems = [f"it can produce ids {model_vocab_size}..{vocab - 1}"] if vocab > model_vocab_size else []
    out_of_range = {role: i for role, i in specials.items() if i is not None and not 0 <= i < model_vocab_size}
    problems += [f"its {role} id is {i}" for role, i in out_of_range.items()]
    if not problems:
        return
    needed = max([vocab, *(i + 1 for i in out_of_range.values())])
    source = (
        f"policy.tokenizer_name={tokenizer_name!r}"
        if tokenizer_name
        else "the tokenizer of policy.model_name (policy.tokenizer_name is unset)"
    )
    raise TokenizerMismatchError(
        f"tokenizer mismatch: {source} has a vocabulary of {vocab} ids but {model_knob}={model_name!r} has "
        f"{model_vocab_size} embedding rows; {' and '.join(problems)}, which the model cannot embed. Fix: use the "
        f"tokenizer made for this model (set policy.tokenizer_name to it, or leave it unset to use policy.model_name's "
        f"own), or a model with at least {needed} vocabulary rows"
    )
