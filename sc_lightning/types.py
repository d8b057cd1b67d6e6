"""Records shared across the package: prompts, sampling settings, generations and scored groups.

Plain frozen dataclasses (stdlib only at run time: a teacher's logprobs are torch tensors, typed only), so they pickle
cheaply across Ray and never pull in a framework.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class PromptImage:
    """One image of a prompt, decoded and resized once where the prompt is loaded: RGB uint8 pixels, row-major
    ``height x width x 3`` (:mod:`sc_lightning.rollout.images` makes them and views them as tensors)."""

    height: int
    width: int
    pixels: bytes

    def __post_init__(self) -> None:
        if len(self.pixels) != self.height * self.width * 3:
            raise ValueError(
                f"an RGB image of {self.height}x{self.width} needs {self.height * self.width * 3} bytes, "
                f"got {len(self.pixels)}"
            )


@dataclass(frozen=True)
class Prompt:
    """One dataset prompt: its token ids and what the environment needs to score a completion of it.

    ``images`` are the prompt's images in order; the i-th run of ``<image>`` ids in ``token_ids`` is ``images[i]``'s
    place (docs/vlm.md).
    """

    prompt_id: str
    token_ids: tuple[int, ...]
    text: str = ""
    answer: str | None = None
    task: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    index: int | None = None  # position in its dataset (None for prompts from elsewhere)
    images: tuple[PromptImage, ...] = ()


def prompt_to_dict(prompt: Prompt) -> dict[str, Any]:
    """A prompt as plain data (``extra`` must be JSON-able, as dataset records are): JSON-able but for its images'
    pixels, which stay bytes (the recovery ledger is ``torch.save``'d, and ``torch.load(weights_only=True)`` reads
    bytes back); a text prompt's dict has no ``images`` key."""
    images = [{"height": i.height, "width": i.width, "pixels": i.pixels} for i in prompt.images]
    return {
        "prompt_id": prompt.prompt_id,
        "token_ids": list(prompt.token_ids),
        "text": prompt.text,
        "answer": prompt.answer,
        "task": prompt.task,
        "extra": dict(prompt.extra),
        "index": prompt.index,
        **({"images": images} if images else {}),
    }


def prompt_from_dict(data: Mapping[str, Any]) -> Prompt:
    """The prompt :func:`prompt_to_dict` wrote."""
    images = tuple(PromptImage(int(i["height"]), int(i["width"]), bytes(i["pixels"])) for i in data.get("images", ()))
    return Prompt(**{**data, "token_ids": tuple(int(t) for t in data["token_ids"]), "images": images})


@dataclass(frozen=True)
class SamplingParams:
    """How an engine samples one completion."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    ignore_eos: bool = False  # sample past the eos token: only max_new_tokens (and other stop tokens) end it


@dataclass(frozen=True)
class Generation:
    """One completion from an engine: its tokens, their log-probabilities under the engine, and why it ended.

    ``weight_version`` is the version that sampled the first token (the completion's admission version);
    ``token_versions`` the version that sampled each token — two or more distinct values when a refit landed
    mid-request. Left empty, it is filled with ``weight_version`` for every token (an engine that cannot tell, or
    a record from before per-token versions).

    ``trainable`` marks the tokens the loss may see: a multi-turn rollout's completion holds the model's turns and
    the environment's observations between them, and only the model's tokens are trained (the others carry logprob
    0.0 and the version of the turn they follow). Left empty, every token is trainable (a single-turn completion).
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    weight_version: int
    token_versions: tuple[int, ...] = ()
    trainable: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"a generation needs one logprob per token, got {len(self.token_ids)} tokens "
                f"and {len(self.logprobs)} logprobs"
            )
        if not self.token_versions:
            object.__setattr__(self, "token_versions", (self.weight_version,) * len(self.token_ids))
        elif len(self.token_versions) != len(self.token_ids):
            raise ValueError(
                f"a generation needs one weight version per token, got {len(self.token_ids)} tokens "
                f"and {len(self.token_versions)} token versions"
            )
        if not self.trainable:
            object.__setattr__(self, "trainable", (True,) * len(self.token_ids))
        elif len(self.trainable) != len(self.token_ids):
            raise ValueError(
                f"a generation needs one trainable flag per token, got {len(self.token_ids)} tokens "
                f"and {len(self.trainable)} flags"
            )

    @property
    def model_token_count(self) -> int:
        """How many of the tokens the model sampled (the trainable ones)."""
        return sum(self.trainable)


def generation_to_dict(generation: Generation) -> dict[str, Any]:
    """A generation as JSON-able plain data (a recovery ledger's sealed generations and turns)."""
    return {
        "token_ids": list(generation.token_ids),
        "logprobs": list(generation.logprobs),
        "finish_reason": generation.finish_reason,
        "weight_version": generation.weight_version,
        "token_versions": list(generation.token_versions),
        "trainable": list(generation.trainable),
    }


def generation_from_dict(data: Mapping[str, Any]) -> Generation:
    """The generation :func:`generation_to_dict` wrote; a record from before per-token versions or multi-turn
    rollouts (no ``token_versions`` or ``trainable``) gets the start version and all tokens trainable."""
    return Generation(
        tuple(int(t) for t in data["token_ids"]),
        tuple(float(x) for x in data["logprobs"]),
        data["finish_reason"],
        int(data["weight_version"]),
        tuple(int(v) for v in data.get("token_versions", ())),
        tuple(bool(t) for t in data.get("trainable", ())),
    )


@dataclass(frozen=True)
class TeacherScores:
    """A distillation teacher's judgement of a group's generations (docs/distillation.md).

    ``alias`` names the teacher the prompt was routed to, ``index`` its place in the run's sorted aliases (the rows'
    ``teacher_id``); ``logprobs[i]`` is generation ``i``'s row aligned with its
    ``input_ids`` (prompt + completion): the teacher's logprob of each model token, 0 on prompt and environment
    tokens, shape (T,); with full-vocabulary distillation the teacher's logprobs of every vocabulary entry there,
    (T, V).
    """

    alias: str
    index: int
    logprobs: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class ScoredGroup:
    """The finished rollout of one prompt: N generations of it and the environment's reward for each.

    ``masked`` holds the indices of generations the environment flagged to keep out of the loss; ``teacher``, in an
    on-policy distillation run, the routed teacher's logprobs of the generations (set before the group commits).
    """

    prompt: Prompt
    generations: tuple[Generation, ...]
    rewards: tuple[float, ...]
    masked: frozenset[int] = frozenset()
    teacher: TeacherScores | None = None

    def __post_init__(self) -> None:
        if len(self.generations) != len(self.rewards):
            raise ValueError(
                f"prompt {self.prompt.prompt_id}: {len(self.generations)} generations but {len(self.rewards)} rewards"
            )
        if any(not 0 <= index < len(self.generations) for index in self.masked):
            raise ValueError(f"prompt {self.prompt.prompt_id}: masked indices {sorted(self.masked)} out of range")
