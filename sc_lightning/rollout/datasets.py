"""Prompt datasets: the synthetic built-in tasks, and ``build_dataset`` / ``build_validation_set`` that pick one of
them or a dataset file (:mod:`~sc_lightning.rollout.prompt_files`; docs/datasets.md)."""

from __future__ import annotations

import random

from sc_lightning.config.runtime import DATASET_FILES, DataConfig
from sc_lightning.rollout.clevr_prompts import clevr_prompts
from sc_lightning.rollout.dataset_base import (
    AnswerCheck,
    DatasetError,
    ListDataset,
    PromptDataset,
    check_prompt_length,
)
from sc_lightning.rollout.images import ImageFormat
from sc_lightning.rollout.prompt_files import FilePromptDataset
from sc_lightning.tasks.worked_arithmetic import draw_problems
from sc_lightning.tokenizer import Tokenizer, UnrepresentableTextError, prompt_token_ids
from sc_lightning.types import Prompt

ARITHMETIC_DATASET_SIZE = 512
WORKED_DATASET_SIZE = 4096  # configs/grpo_1gpu_long.yaml's 80 steps take 2,560 of them: none twice
CLEVR_DATASET_SIZE = 1024


def unspellable_task(task: str, err: UnrepresentableTextError) -> DatasetError:
    """The DatasetError of a built-in ``task`` whose prompts the run's tokenizer cannot represent."""
    return DatasetError(
        f"the built-in {task} dataset (data.dataset_name) needs a tokenizer that can spell its prompts: {err}; set "
        "policy.tokenizer_name (or policy.model_name) to one that can, or use a dataset file"
    )


class ArithmeticDataset(ListDataset):
    """Deterministic single-digit addition prompts ``"a+b="`` (a, b in 0..9, answer 0..18) drawn from ``seed``.

    Prompt ``i`` has id ``arithmetic-{i:06d}``, text ``"a+b="``, answer ``str(a + b)`` and task ``"arithmetic"``;
    its token ids are the tokenizer's bos (if any) followed by the encoded text (5 tokens with CharTokenizer).
    """

    def __init__(self, size: int, seed: int, tokenizer: Tokenizer, *, max_prompt_length: int | None = None) -> None:
        if size < 1:
            raise DatasetError(f"the arithmetic dataset needs size >= 1, got {size}")
        self.size = size
        self.seed = seed
        rng = random.Random(f"arithmetic:{seed}")
        self._prompts = []
        for i in range(size):
            a, b = rng.randrange(10), rng.randrange(10)
            prompt = arithmetic_prompt(tokenizer, a, b, prompt_id=f"arithmetic-{i:06d}", index=i)
            check_prompt_length(prompt, max_prompt_length, "the arithmetic dataset")
            self._prompts.append(prompt)


def arithmetic_prompt(tokenizer: Tokenizer, a: int, b: int, *, prompt_id: str, index: int) -> Prompt:
    """The arithmetic task's prompt ``"a+b="`` (answer ``a + b``); DatasetError when the tokenizer cannot spell it."""
    text = f"{a}+{b}="
    try:
        token_ids = prompt_token_ids(tokenizer, text)
    except UnrepresentableTextError as err:
        raise unspellable_task("arithmetic", err) from None
    return Prompt(
        prompt_id=prompt_id,
        token_ids=token_ids,
        text=text,
        answer=str(a + b),
        task="arithmetic",
        index=index,
    )


class CalculatorDataset(ListDataset):
    """Two-digit products ``"a*b"`` for the multi-turn calculator environment, rendered by the tokenizer's chat
    template (see :func:`sc_lightning.rollout.multiturn.calculator.calculator_prompts`)."""

    def __init__(self, size: int, seed: int, tokenizer: Tokenizer, *, max_prompt_length: int | None = None) -> None:
        from sc_lightning.rollout.multiturn.calculator import calculator_prompts  # the multi-turn package is heavier

        try:
            self._prompts = calculator_prompts(size, seed, tokenizer)
        except UnrepresentableTextError as err:
            raise unspellable_task("calculator", err) from None
        for prompt in self._prompts:
            check_prompt_length(prompt, max_prompt_length, "the calculator dataset")


class WorkedArithmeticDataset(ListDataset):
    """Worked-arithmetic problems ``"0023-7="`` drawn from ``seed`` (:mod:`sc_lightning.tasks.worked_arithmetic`):
    answers worked in 65 to 2,045 tokens with a long tail, the last line ``a mod b``.

    Prompt ``i`` has id ``worked_arithmetic-{i:06d}``, text ``"0023-7="``, answer ``"2"`` and task
    ``"worked_arithmetic"``; its token ids are the tokenizer's bos (if any) and the text (8 tokens with CharTokenizer).
    """

    def __init__(self, size: int, seed: int, tokenizer: Tokenizer, *, max_prompt_length: int | None = None) -> None:
        self._prompts = []
        for i, problem in enumerate(draw_problems(size, seed)):
            try:
                token_ids = prompt_token_ids(tokenizer, problem.prompt)
            except UnrepresentableTextError as err:
                raise unspellable_task("worked_arithmetic", err) from None
            prompt = Prompt(
                f"worked_arithmetic-{i:06d}",
                token_ids,
                text=problem.prompt,
                answer=problem.answer,
                task="worked_arithmetic",
                index=i,
            )
            check_prompt_length(prompt, max_prompt_length, "the worked_arithmetic dataset")
            self._prompts.append(prompt)


class ClevrDataset(ListDataset):
    """Questions of ``kinds`` about rendered scenes of coloured shapes drawn from ``seed``, for a vision-language
    policy whose image format is ``images`` (:func:`~sc_lightning.rollout.clevr_prompts.clevr_prompts`); DatasetError
    naming ``policy.is_vlm`` when ``images`` is None (a text policy cannot see the scenes)."""

    def __init__(
        self,
        size: int,
        seed: int,
        tokenizer: Tokenizer,
        images: ImageFormat | None,
        *,
        max_prompt_length: int | None,
        kinds: tuple[str, ...],
    ) -> None:
        if images is None:
            raise DatasetError(
                "the built-in clevr dataset (data.dataset_name) asks about images, which a text policy cannot see; "
                "set policy.is_vlm: true with a vision-language policy (policy.model_name)"
            )
        try:
            self._prompts = clevr_prompts(size, seed, tokenizer, images, kinds)
        except UnrepresentableTextError as err:
            raise unspellable_task("clevr", err) from None
        for prompt in self._prompts:
            check_prompt_length(prompt, max_prompt_length, "the clevr dataset")


def build_dataset(
    cfg: DataConfig,
    tokenizer: Tokenizer,
    *,
    seed: int,
    check_answer: AnswerCheck | None = None,
    images: ImageFormat | None = None,
) -> PromptDataset:
    """The dataset named by ``cfg.dataset_name``: ``"arithmetic"`` or ``"calculator"`` (512 prompts from ``seed``),
    ``"worked_arithmetic"`` (4,096), ``"clevr"`` (1,024 questions of ``cfg.clevr_kinds``, for a vision-language
    policy whose image format is ``images``) or the path of a dataset file (:class:`FilePromptDataset`, its images
    in ``images``' format).

    Every prompt is checked against ``cfg.max_prompt_length`` and the tokenizer here, and every file's answer against
    ``check_answer``, so a bad prompt fails at load time; a file may have up to ``cfg.max_skipped_rows`` bad rows,
    which are skipped (and logged).
    """
    name = cfg.dataset_name
    if name == "arithmetic":
        return ArithmeticDataset(ARITHMETIC_DATASET_SIZE, seed, tokenizer, max_prompt_length=cfg.max_prompt_length)
    if name == "calculator":
        return CalculatorDataset(ARITHMETIC_DATASET_SIZE, seed, tokenizer, max_prompt_length=cfg.max_prompt_length)
    if name == "worked_arithmetic":
        return WorkedArithmeticDataset(WORKED_DATASET_SIZE, seed, tokenizer, max_prompt_length=cfg.max_prompt_length)
    if name == "clevr":
        return ClevrDataset(
            CLEVR_DATASET_SIZE, seed, tokenizer, images, max_prompt_length=cfg.max_prompt_length, kinds=cfg.clevr_kinds
        )
    return FilePromptDataset(name, tokenizer, cfg, check_answer=check_answer, images=images)


class ArithmeticValidationSet(ListDataset):
    """Every distinct ``"a+b="`` problem of the arithmetic task (a, b in 0..9) once: 100 prompts, in a fixed order.

    The training set draws its 512 prompts from the same 100 problems, so held-out *problems* cannot exist; what
    is held out is the prompts themselves (ids ``arithmetic-val-{a}{b}``, never in the training stream), and each
    problem counts once, so ``val/accuracy`` is the share of the whole task solved. The order is a fixed shuffle,
    so ``max_val_samples: N`` keeps a spread of N problems.
    """

    def __init__(self, tokenizer: Tokenizer, *, max_prompt_length: int | None = None) -> None:
        pairs = [(a, b) for a in range(10) for b in range(10)]
        random.Random("arithmetic-val").shuffle(pairs)
        self._prompts = []
        for i, (a, b) in enumerate(pairs):
            prompt = arithmetic_prompt(tokenizer, a, b, prompt_id=f"arithmetic-val-{a}{b}", index=i)
            check_prompt_length(prompt, max_prompt_length, "the arithmetic validation set")
            self._prompts.append(prompt)


def validation_set_name(cfg: DataConfig) -> str | None:
    """The validation set ``cfg`` names: ``data.val_dataset_name``, else the arithmetic task's own
    ``arithmetic-val``; None when it has none."""
    return cfg.val_dataset_name or ("arithmetic-val" if cfg.dataset_name == "arithmetic" else None)


def build_validation_set(
    cfg: DataConfig,
    tokenizer: Tokenizer,
    *,
    max_samples: int | None,
    check_answer: AnswerCheck | None = None,
    images: ImageFormat | None = None,
) -> list[Prompt]:
    """The validation prompts: ``cfg.val_dataset_name`` (``arithmetic-val`` or a dataset file's path, its answers
    checked by ``check_answer``, its images in ``images``' format; None = the arithmetic task's own set), the first
    ``max_samples`` of them (None = all)."""
    name = validation_set_name(cfg)
    if name == "arithmetic-val":
        dataset: PromptDataset = ArithmeticValidationSet(tokenizer, max_prompt_length=cfg.max_prompt_length)
    elif name is not None:
        dataset = FilePromptDataset(
            name, tokenizer, cfg, check_answer=check_answer, knob="data.val_dataset_name", images=images
        )
    else:
        raise DatasetError(
            "data.val_dataset_name is null and data.dataset_name is no built-in task with a validation set; "
            f"give the path of {DATASET_FILES}"
        )
    count = len(dataset) if max_samples is None else min(max_samples, len(dataset))
    return [dataset[i] for i in range(count)]
