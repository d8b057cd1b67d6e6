"""GenerateOnce: ``generate``'s callback — once the engine holds the policy, answer a split's prompts and keep the
JSONL rows.

Like :class:`~sc_lightning.callbacks.validation.ValidateOnce` it acts at ``on_fit_start``: the strategy has started
the rollout side (the policy built, or restored from a bundle, and loaded into the engine) and the fit stops before
any training step. It reads the split's prompts with the module's tokenizer
(:func:`~sc_lightning.rollout.answer_sheet.split_prompts`), answers them through the rollout side
(:meth:`~sc_lightning.rollout_side.side.RolloutSide.answer`: sampled as a validation samples, or greedy) with a
progress bar over the prompts on stderr (Lightning's tqdm, shown when ``trainer.enable_progress_bar`` is), and keeps
one row per answer with the config's environment's reward and, where it can tell, the answer it read.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

from lightning.pytorch import Callback, LightningModule, Trainer
from tqdm import tqdm

from sc_lightning.config import SCConfig
from sc_lightning.controller.build import answer_settings
from sc_lightning.rollout.answer_sheet import PromptSplit, Row, answer_row, split_prompts
from sc_lightning.rollout.answers import AnswerSettings
from sc_lightning.rollout.envs import Environment, answer_check, answer_extractor, build_environment


class GenerationTimeout(RuntimeError):
    """The whole pass outlived ``{algo}.val_timeout_s``."""


@dataclass(frozen=True)
class GenerateRequest:
    """What to answer: the split (None = the validation set when the config has one, else the training set), how
    many of its prompts (None = all), and whether to decode greedily instead of sampling as the config says."""

    split: str | None = None
    count: int | None = None
    greedy: bool = False


class GenerateOnce(Callback):
    """Answers the request's prompts with the policy the engine holds at the start of the fit; the rows in
    :attr:`rows`, the prompts' split in :attr:`split`."""

    def __init__(self, config: SCConfig, request: GenerateRequest) -> None:
        self.config, self.request = config, request
        self.split: PromptSplit | None = None
        self.rows: list[Row] = []

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Read the split's prompts, answer and score them, keep the rows."""
        if not trainer.is_global_zero:
            return
        config, request = self.config, self.request
        environment = build_environment(config.env)
        assert isinstance(environment, Environment), "generate refuses multi-turn environments before it starts"
        self.split = split_prompts(
            config.data,
            pl_module.tokenizer,
            split=request.split,
            seed=config.algo.seed,
            count=request.count,
            check_answer=answer_check(environment),
            images=pl_module.spec.vision,
        )
        bar = tqdm(
            total=len(self.split.prompts),
            desc=f"generate ({self.split.name})",
            unit="prompt",
            file=sys.stderr,
            disable=trainer.progress_bar_callback is None,
        )
        with bar:
            try:
                answers = trainer.strategy.rollout_side.answer(
                    self.split.prompts,
                    environment,
                    self.settings(),
                    timeout_s=config.algo.val_timeout_s,
                    on_answer=lambda _: bar.update(),
                )
            except TimeoutError:
                raise GenerationTimeout(
                    f"answering {len(self.split.prompts)} prompts took longer than {config.algo_name}.val_timeout_s="
                    f"{config.algo.val_timeout_s}; raise it, or answer fewer prompts (--num_prompts)"
                ) from None
        extract = answer_extractor(environment)
        self.rows = [answer_row(answer, extract) for answer in answers]

    def settings(self) -> AnswerSettings:
        """The run's validation sampling (:func:`~sc_lightning.controller.build.answer_settings`), at temperature 0
        when the request is greedy."""
        settings = answer_settings(self.config)
        if not self.request.greedy:
            return settings
        return dataclasses.replace(settings, sampling=dataclasses.replace(settings.sampling, temperature=0.0))
