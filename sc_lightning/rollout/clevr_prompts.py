"""The built-in clevr dataset's prompts: questions about rendered scenes, each with its scene as the one image."""

from __future__ import annotations

from sc_lightning.rollout.images import ImageFormat, array_image, image_prompt_ids
from sc_lightning.tasks import clevr
from sc_lightning.tokenizer import Tokenizer
from sc_lightning.types import Prompt


def clevr_prompts(
    size: int, seed: int, tokenizer: Tokenizer, images: ImageFormat, kinds: tuple[str, ...]
) -> list[Prompt]:
    """``size`` questions of ``kinds`` drawn from ``seed`` (:mod:`sc_lightning.tasks.clevr`), each scene resized to
    ``images.image_size``.

    Prompt ``i`` has id ``clevr-{i:06d}``, text the coded question (``"+1="``: how many green objects?), answer one
    digit and task ``"clevr"``; ``extra`` holds the English ``question`` and its ``kind`` (count, colour, relation).
    Its token ids are bos, the image's ``tokens_per_image`` ids, then the text. UnrepresentableTextError when the
    tokenizer cannot spell the questions.
    """
    prompts = []
    for i, question in enumerate(clevr.draw_questions(size, seed, kinds)):
        prompts.append(
            Prompt(
                f"clevr-{i:06d}",
                image_prompt_ids(tokenizer, question.text, 1, images),
                text=question.text,
                answer=question.answer,
                task="clevr",
                extra={"question": question.english, "kind": question.kind},
                index=i,
                images=(array_image(clevr.render(question.objects), images.image_size),),
            )
        )
    return prompts
