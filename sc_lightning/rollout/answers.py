"""One answer per prompt from an engine, scored by the environment: the pass a validation and ``generate`` share.

:func:`answer_prompts` asks the engine for one completion per prompt with the weights it holds, at most
``AnswerSettings.concurrency`` requests at once, each under ``generation_timeout_s``, then decodes the completion and
scores it with the environment in a worker thread. Each request samples with a seed fixed by (run seed, prompt)
(:func:`answer_seed`), so two passes over the same weights sample alike whatever the timing (temperature 0 is greedy).
The first failure cancels the other requests and is raised as an AnswerError naming the prompt and the engine.
Nothing here touches the replay buffer, the data plane or the training stream.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sc_lightning.engines.base import GenerationEngine
from sc_lightning.rollout.envs.base import Environment, Score, as_score
from sc_lightning.rollout.envs.daemon_call import daemon_call
from sc_lightning.rollout.images import engine_images
from sc_lightning.tokenizer import Tokenizer
from sc_lightning.types import Generation, Prompt, SamplingParams


class AnswerError(RuntimeError):
    """Answering one prompt failed (the engine, its deadline or the environment); names the prompt and the engine."""


@dataclass(frozen=True)
class AnswerSettings:
    """How a pass answers its prompts: the sampling, how many requests at once, the run seed and each request's
    deadline (seconds; None = none)."""

    sampling: SamplingParams
    concurrency: int
    seed: int = 0
    generation_timeout_s: float | None = None

    def sampling_for(self, prompt: Prompt) -> SamplingParams:
        """The sampling of ``prompt``'s request: :attr:`sampling` with the prompt's seed."""
        return dataclasses.replace(self.sampling, seed=answer_seed(self.seed, prompt))


@dataclass(frozen=True)
class Answer:
    """One prompt's completion: the engine's generation, its decoded text and the environment's score."""

    prompt: Prompt
    generation: Generation
    text: str
    score: Score


def answer_seed(seed: int, prompt: Prompt) -> int:
    """A sampling seed fixed by (run ``seed``, prompt id): each pass samples a prompt the same way."""
    key = f"val/{seed}/{prompt.prompt_id}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


async def answer_prompts(
    prompts: Sequence[Prompt],
    engine: GenerationEngine,
    environment: Environment,
    tokenizer: Tokenizer,
    settings: AnswerSettings,
    on_answer: Callable[[Answer], None] | None = None,
) -> list[Answer]:
    """One scored answer per prompt, in the prompts' order; ``on_answer`` is called as each one is scored."""
    slots = asyncio.Semaphore(settings.concurrency)

    async def one(prompt: Prompt) -> Answer:
        async with slots:
            try:
                generation = await asyncio.wait_for(
                    engine.generate(prompt.token_ids, settings.sampling_for(prompt), **engine_images(prompt)),
                    settings.generation_timeout_s,
                )
            except TimeoutError:
                raise AnswerError(
                    f"prompt {prompt.prompt_id} on engine {engine.name!r} exceeded "
                    f"generation_timeout_s={settings.generation_timeout_s}"
                ) from None
        text = tokenizer.decode(generation.token_ids)
        score = await daemon_call(lambda: as_score(environment.score(prompt, text)))
        answer = Answer(prompt, generation, text, score)
        if on_answer is not None:
            on_answer(answer)
        return answer

    async def named(prompt: Prompt) -> Answer:
        try:
            return await one(prompt)
        except AnswerError:
            raise
        except Exception as failure:  # the engine's or the environment's
            raise AnswerError(
                f"answering prompt {prompt.prompt_id} on engine {engine.name!r} failed: "
                f"{type(failure).__name__}: {failure}"
            ) from failure

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(named(prompt)) for prompt in prompts]
    except ExceptionGroup as failures:  # the first failure cancelled the rest; report that one
        raise failures.exceptions[0] from None
    return [task.result() for task in tasks]
