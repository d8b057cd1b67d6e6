"""The environment contract: a synchronous, pure reward function of a prompt and one completion's text."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sc_lightning.types import Prompt, SamplingParams


class RewardError(ValueError):
    """An environment cannot score: an unknown environment name, or a prompt it cannot verify against.

    Raised for problems of the configuration or the data (e.g. a prompt without an answer), never for a badly
    formed completion: model output that cannot be parsed scores 0.0.
    """


@dataclass(frozen=True)
class Score:
    """An environment's verdict on one completion: its reward, and whether to keep the completion out of the loss.

    ``mask_sample=True`` excludes the completion from the policy loss (its ``sample_mask`` is 0) while its reward
    still counts towards its group's baseline — for completions the environment cannot judge fairly (a tool that
    timed out, an episode cut short by the environment), which should neither be rewarded nor punished.
    """

    reward: float
    mask_sample: bool = False


def as_score(verdict: float | Score) -> Score:
    """A plain number as an unmasked :class:`Score`; a Score unchanged; RewardError for anything else."""
    reward = verdict.reward if isinstance(verdict, Score) else verdict
    if not isinstance(reward, numbers.Real):
        raise RewardError(f"the environment returned {reward!r} ({type(reward).__name__}), not a number or a Score")
    return verdict if isinstance(verdict, Score) else Score(float(reward))


@runtime_checkable
class Environment(Protocol):
    """Scores completions of prompts; the rollout manager calls ``score`` in a worker thread under a deadline."""

    name: str

    def score(self, prompt: Prompt, completion_text: str) -> float | Score:
        """Reward of ``completion_text`` as an answer to ``prompt`` (a :class:`Score` to also flag it for masking).

        Raises RewardError only for a bad prompt.
        """


def answer_check(environment: object) -> Callable[[str | None], object] | None:
    """The environment's optional ``check_answer(answer)``, or None when it has none.

    An environment (single- or multi-turn) that can tell from an answer alone that it could never score a prompt
    (the arithmetic verifier given ``"7.5"``) defines ``check_answer``, raising RewardError saying why; the datasets
    call it on every row as they load, so such a row is a bad row there instead of a failure mid-run.
    """
    check = getattr(environment, "check_answer", None)
    return check if callable(check) else None


def answer_extractor(environment: object) -> Callable[[str], str | None] | None:
    """The environment's optional ``extract_answer(completion_text)``, or None when it has none.

    An environment that can say which answer it read in a completion (the arithmetic verifier's leading integer, the
    math verifier's last boxed answer) defines ``extract_answer``, returning that answer as text, or None when the
    completion states none; ``generate`` writes it beside each answer's reward.
    """
    extract = getattr(environment, "extract_answer", None)
    return extract if callable(extract) else None


def request_sampling(environment: object) -> Callable[[Prompt, SamplingParams], SamplingParams] | None:
    """The environment's optional ``request_sampling(prompt, sampling)``, or None when it has none.

    An environment that decides how each training rollout is sampled (the ``fixed_length`` benchmark's answer
    lengths) defines it: given the prompt and the request's sampling (the run's, with the request's seed), it returns
    the sampling to use instead.
    """
    shape = getattr(environment, "request_sampling", None)
    return shape if callable(shape) else None
