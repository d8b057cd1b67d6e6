"""The Megatron engine on a vision-language model: greedy answers equal the full forward's argmax with the images in
the prompt, before, through and after refits that change only the vision tower; its logprobs equal the trainer's."""

from __future__ import annotations

import asyncio

import pytest
import torch

from sc_lightning.engines.base import EngineError
from sc_lightning.engines.megatron.engine import MegatronEngine
from sc_lightning.models.spec import builtin_spec
from sc_lightning.types import SamplingParams
from tests.helpers.vlm import image_prompt, random_images

pytestmark = [
    pytest.mark.usefixtures("model_parallel"),
    pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning"),
]
SPEC = builtin_spec("builtin:tiny-vlm")
TEXT = [4, 13, 5, 16]  # "1+2="
PROMPTS = [  # (token ids, how many images)
    (image_prompt(SPEC, [2], 0, TEXT), 1),
    (image_prompt(SPEC, [2, 7, 8], 0, [9], 1, TEXT), 2),
    (image_prompt(SPEC, [2], 0, TEXT[:2]), 1),
    (image_prompt(SPEC, [2, 3], 0, TEXT, TEXT), 1),
]
GREEDY = SamplingParams(12, temperature=0.0)


def prompt_images(seed: int) -> list[torch.Tensor]:
    """One tensor of images per prompt of PROMPTS, seeded."""
    images = random_images(SPEC, sum(n for _, n in PROMPTS), seed=seed)
    return list(images.split([n for _, n in PROMPTS]))


def new_vlm(seed: int = 0):
    from sc_lightning.models.vlm import build_vlm

    return build_vlm(SPEC, seed=seed).eval()


def follows_argmax(model, prompt: list[int], tokens: tuple[int, ...], images: torch.Tensor) -> list[bool]:
    """For each completion token: whether it is the argmax of the full forward over prompt + completion + images."""
    from sc_lightning.models.vlm import vlm_logits

    with torch.no_grad():
        logits = vlm_logits(model, torch.tensor([prompt + list(tokens)]), [images])[0, :, : SPEC.vocab_size]
    return [a == t for a, t in zip(logits[len(prompt) - 1 : -1].argmax(-1).tolist(), tokens, strict=True)]


def with_vision_of(model, donor) -> dict[str, torch.Tensor]:
    """``model``'s weights (megatron names) with the vision tower (``vision_model.*``) of ``donor``."""
    from sc_lightning.models.megatron import megatron_weights

    ours, theirs = dict(megatron_weights(model)), dict(megatron_weights(donor))
    return {n: (theirs[n] if n.startswith("vision_model.") else t).clone() for n, t in ours.items()}


def engine_on(model, **kwargs: object) -> MegatronEngine:
    """An engine on ``model`` that ignores eos (fixed-length answers), prefilling 8 positions a chunk: an image's 16
    tokens span chunks, and rows prefill beside others that decode."""
    return MegatronEngine(model, SPEC, eos_token_id=None, stop_on_eos=False, prefill_chunk_tokens=8, **kwargs)


@pytest.mark.slow
def test_greedy_answers_follow_the_full_forward_through_vision_refits() -> None:
    from sc_lightning.models.convert import export_hf_units
    from sc_lightning.models.megatron import copy_megatron_weights

    images = prompt_images(seed=0)
    reference, old = new_vlm(), new_vlm()
    first_refit = with_vision_of(reference, new_vlm(seed=1))
    second = new_vlm()
    copy_megatron_weights(second, with_vision_of(second, new_vlm(seed=2)))

    async def answers(engine: MegatronEngine, sampling: SamplingParams = GREEDY) -> list:
        return await asyncio.gather(
            *(engine.generate(p, sampling, images=i) for (p, _), i in zip(PROMPTS, images, strict=True))
        )

    async def scenario() -> tuple[list, list, list, list]:
        engine = engine_on(new_vlm(), max_batch_size=3)  # four requests: one waits for a slot
        try:
            before = await answers(engine)
            through = asyncio.ensure_future(answers(engine, SamplingParams(60, temperature=0.0)))
            await asyncio.sleep(0.05)
            await engine.update_weights(first_refit.items(), version=1)  # megatron names, as a colocated refit
            spanning = await through
            after = await answers(engine)
            units = list(export_hf_units(second, SPEC))  # HF names + the vision side's, in buckets, as over Ray
            for unit in units[:-1]:
                await engine.stage_weights(unit, version=2)
            await engine.update_weights(units[-1], version=2)
            return before, spanning, after, await answers(engine)
        finally:
            await engine.shutdown()

    before, spanning, after, last = asyncio.run(scenario())
    copy_megatron_weights(reference, first_refit)
    for (prompt, _), pixels, b, s, a, z in zip(PROMPTS, images, before, spanning, after, last, strict=True):
        assert len(b.token_ids) == 12 and all(follows_argmax(old, prompt, b.token_ids, pixels))
        assert all(follows_argmax(reference, prompt, a.token_ids, pixels)) and a.weight_version == 1
        assert all(follows_argmax(second, prompt, z.token_ids, pixels)) and z.weight_version == 2
        by_old, by_new = (
            follows_argmax(old, prompt, s.token_ids, pixels),
            follows_argmax(reference, prompt, s.token_ids, pixels),
        )
        for version, o, n in zip(s.token_versions, by_old, by_new, strict=True):
            assert o if version == 0 else n, (version, s.token_versions)  # each token by the weights that sampled it
    assert [b.token_ids for b in before] != [a.token_ids for a in after]  # the vision tower alone changed the answers
    assert [a.token_ids for a in after] != [z.token_ids for z in last]


def test_engine_logprobs_equal_the_trainers_with_images() -> None:
    from sc_lightning.trainer.chunks import TrainChunk
    from sc_lightning.trainer.policy_update import frozen_logprobs

    images = prompt_images(seed=3)
    settings = [SamplingParams(10, temperature=1.0, seed=s) for s in range(len(PROMPTS))]

    async def scenario() -> list:
        engine = engine_on(new_vlm())
        try:
            return await asyncio.gather(
                *(engine.generate(p, s, images=i) for (p, _), s, i in zip(PROMPTS, settings, images, strict=True))
            )
        finally:
            await engine.shutdown()

    generations = asyncio.run(scenario())
    width = max(len(p) + len(g.token_ids) for (p, _), g in zip(PROMPTS, generations, strict=True))
    ids, mask = torch.zeros(len(PROMPTS), width, dtype=torch.long), torch.zeros(len(PROMPTS), width)
    for row, ((prompt, _), g) in enumerate(zip(PROMPTS, generations, strict=True)):
        ids[row, : len(prompt) + len(g.token_ids)] = torch.tensor(prompt + list(g.token_ids))
        mask[row, len(prompt) : len(prompt) + len(g.token_ids)] = 1
    zeros = torch.zeros(ids.shape)
    chunk = TrainChunk(ids, mask, zeros, torch.ones(len(PROMPTS)), zeros, zeros[:, 0], pixel_values=images)
    trainer = frozen_logprobs(new_vlm(), chunk, micro_batch_size=2, vocab_size=None, temperature=1.0)
    for row, ((prompt, _), g) in enumerate(zip(PROMPTS, generations, strict=True)):
        got = trainer[row, len(prompt) : len(prompt) + len(g.token_ids)]
        assert torch.allclose(got, torch.tensor(g.logprobs), atol=1e-4), (got, g.logprobs)


def test_image_requests_that_do_not_fit_are_refused() -> None:
    images = prompt_images(seed=0)

    async def scenario() -> None:
        engine = engine_on(new_vlm())
        try:
            prompt = PROMPTS[0][0]
            with pytest.raises(EngineError, match="holds 16 <image> ids but 0 image"):
                await engine.generate(prompt, GREEDY)
            with pytest.raises(EngineError, match="holds 16 <image> ids but 2 image"):
                await engine.generate(prompt, GREEDY, images=images[1])
            with pytest.raises(EngineError, match="ends with an <image> token"):
                await engine.generate(image_prompt(SPEC, [2], 0), GREEDY, images=images[0])
            with pytest.raises(EngineError, match=r"uint8 \(N, 32, 32, 3\)"):
                await engine.generate(prompt, GREEDY, images=torch.zeros(1, 8, 8, 3, dtype=torch.uint8))
        finally:
            await engine.shutdown()

    asyncio.run(scenario())
