"""The throughput benchmark's environment: every answer is as long as a seeded long-tailed draw says.

``env.name: fixed_length`` (``benchmarks/e2e.py``). Each training rollout's length is drawn from a lognormal
distribution (sigma :data:`SIGMA`) whose mean is a quarter of ``policy.generation.max_new_tokens``, clipped to
[max / 64, max]: with 4096 new tokens, a mean of about 1K, lengths 64..4096 and about 2% at the cap, the long tail
of reasoning answers. The draw is seeded by the request's sampling seed (fixed by run seed, prompt, visit and
generation index), so a run's lengths repeat. The request samples past eos (``SamplingParams.ignore_eos``) and
stops at its length: a random model cannot end it early, and the step's work is the same in every mode.

The reward is the answer's length over 4,096 characters: cheap, and it differs within a group, so the step's
advantages (and gradients) are not all zero, as in a real run.
"""

from __future__ import annotations

import dataclasses
import math
import random

from sc_lightning.types import Prompt, SamplingParams

SIGMA = 0.8
"""The lognormal's shape: the answer lengths' spread (their standard deviation is about 0.95 x their mean)."""


def answer_length(seed: int | None, max_tokens: int) -> int:
    """A long-tailed answer length for the request seeded ``seed``: lognormal, mean ``max_tokens / 4``, clipped to
    [``max_tokens // 64``, ``max_tokens``] (at least 1)."""
    mu = math.log(max_tokens / 4) - SIGMA**2 / 2  # a lognormal's mean is exp(mu + sigma^2 / 2)
    drawn = random.Random(seed).lognormvariate(mu, SIGMA)
    return max(1, max_tokens // 64, min(max_tokens, round(drawn)))


class FixedLengthEnvironment:
    """Fixes each rollout's answer length (:func:`answer_length`, eos ignored); rewards the length over the cap."""

    name: str = "fixed_length"

    def request_sampling(self, prompt: Prompt, sampling: SamplingParams) -> SamplingParams:
        """``sampling`` with ``max_new_tokens`` set to the request's drawn length and eos ignored."""
        length = answer_length(sampling.seed, sampling.max_new_tokens)
        return dataclasses.replace(sampling, max_new_tokens=length, ignore_eos=True)

    def score(self, prompt: Prompt, completion_text: str) -> float:
        """The completion's length in characters over 4096 (any text scores; nothing is verified)."""
        return len(completion_text) / 4096

    def __repr__(self) -> str:
        return "FixedLengthEnvironment()"
