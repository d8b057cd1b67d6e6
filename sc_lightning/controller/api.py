"""The one port between the pumps: everything the train side needs from the controller, and nothing else.

- :class:`GroupMeta` — a committed prompt group as the trainer sees it (data-plane keys and weight versions);
- :class:`ControllerClient` — the blocking train-side calls of a running controller (in a thread or a Ray actor);
- :class:`ControllerStats` (with :class:`StepDrops`, :class:`StepSurvivorship` and the engine's goodput,
  :class:`EngineTime`) — the counters the trainer logs, and :class:`RefitReport`, what
  one refit returns;
- the errors a train-side call raises: :class:`RolloutPumpError`, :class:`SelectTimeout`,
  :class:`ControllerUnresponsive`, :class:`ControllerDied`;
- the trained row's schema, :data:`TRAINED_ROW`: the fields the rollout pump writes for each generation, their
  dtypes in the data plane and as the trainer reads them, and :data:`ROW_TAGS` (:data:`OPTIONAL_ROW_TAGS` besides).

Metadata crosses this port, never tensors: the trainer reads a group's rows from the data plane by key. Everything
here is plain Python and torch, so the trainer imports it without importing the controller's machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from sc_lightning.rollout.goodput import EngineTime

# ------------------------------------------------------------------------------------------------ group metadata


@dataclass(frozen=True)
class GroupMeta:
    """A committed group as the trainer sees it: the data-plane keys of its rows and its weight versions, and the
    mean reward and completion length of its generations (for survivorship metrics; 0 in a replay index written
    before them)."""

    group_id: str
    prompt_id: str
    keys: tuple[str, ...]
    sequence_lengths: tuple[int, ...]
    start_weight: int
    end_weight: int
    target_step: int | None
    reward_mean: float = 0.0
    completion_length_mean: float = 0.0


# ------------------------------------------------------------------------------------------------ the trained row


@dataclass(frozen=True)
class RowField:
    """One field of a trained row: per token, per row or per image of the row's prompt, its dtype in the data plane
    and as the trainer reads it."""

    name: str
    per: Literal["token", "row", "image"]
    stored: torch.dtype  # as the rollout pump writes it to the data plane
    trained: torch.dtype | None  # as the trainer reads it (after padding); None: the trainer does not read it
    meaning: str


TRAINED_ROW: tuple[RowField, ...] = (
    RowField("input_ids", "token", torch.int32, torch.int64, "prompt + completion tokens"),
    RowField("token_mask", "token", torch.int8, torch.float32, "1 on completion tokens"),
    RowField(
        "generation_logprobs",
        "token",
        torch.float32,
        torch.float32,
        "the engine's logprob of each completion token (0 on the prompt)",
    ),
    RowField(
        "token_versions",
        "token",
        torch.int32,
        torch.int64,
        "the weight version that sampled each completion token (-1 on the prompt)",
    ),
    RowField("input_lengths", "row", torch.int32, None, "prompt + completion length"),
    RowField("prompt_lengths", "row", torch.int32, None, "prompt length"),
    RowField("total_reward", "row", torch.float32, torch.float32, "the environment's reward"),
    RowField(
        "sample_mask",
        "row",
        torch.float32,
        torch.float32,
        "0.0 when the environment flagged the completion (`Score(reward, mask_sample=True)`), else 1.0",
    ),
    RowField("truncated", "row", torch.bool, torch.bool, "the completion hit `max_new_tokens`"),
    RowField(
        "pixel_values",
        "image",
        torch.uint8,
        torch.uint8,
        "the prompt's images, (num_images, H, W, 3) RGB at the model's image size; only on rows whose prompt has "
        "images (a vision-language run's)",
    ),
    RowField(
        "teacher_logprobs",
        "token",
        torch.float32,
        torch.float32,
        "the distillation teacher's logprob of each model token (0 on prompt and environment tokens); only on an "
        "on-policy distillation run's rows",
    ),
    RowField(
        "teacher_id",
        "row",
        torch.int64,
        torch.int64,
        "the row's teacher: its alias's index in the sorted `on_policy_distillation.teachers`; only on a distillation "
        "run's rows",
    ),
    RowField(
        "teacher_vocab_logprobs",
        "token",
        torch.float32,
        torch.float32,
        "the teacher's logprobs of every vocabulary entry at each model token, (T, V) (0 elsewhere); only with "
        "`on_policy_distillation.full_vocabulary`",
    ),
)
"""The fields written at commit, one entry per field (per-token fields are jagged and aligned with input_ids;
per-image fields are jagged along the prompt's images)."""

IMAGE_FIELDS: tuple[str, ...] = tuple(field.name for field in TRAINED_ROW if field.per == "image")
"""The fields written only on rows whose prompt has images; the trainer reads them for a vision-language policy."""

TEACHER_FIELDS: tuple[str, ...] = ("teacher_logprobs", "teacher_id")
"""The fields written only on an on-policy distillation run's rows (``teacher_vocab_logprobs`` besides, with
``full_vocabulary``): the trainer reads them for the opd advantages."""

TEACHER_VOCAB_FIELDS: tuple[str, ...] = ("teacher_vocab_logprobs",)
"""The field written only with full-vocabulary distillation: T x V x 4 bytes per row."""

ROW_FIELDS: tuple[str, ...] = tuple(
    field.name for field in TRAINED_ROW if field.name not in (*IMAGE_FIELDS, *TEACHER_FIELDS, *TEACHER_VOCAB_FIELDS)
)
"""The names of the fields every trained row has, in schema order."""

READ_FIELDS: tuple[str, ...] = tuple(f.name for f in TRAINED_ROW if f.trained is not None and f.name in ROW_FIELDS)
"""The fields the trainer reads from the data plane for every row (``IMAGE_FIELDS`` besides, for a VLM)."""

ROW_DTYPES: dict[str, torch.dtype] = {field.name: field.stored for field in TRAINED_ROW}
"""Field name -> its dtype in the data plane."""

TRAIN_DTYPES: dict[str, torch.dtype] = {field.name: field.trained for field in TRAINED_ROW if field.trained is not None}
"""Field name -> its dtype as the trainer reads it."""

ROW_TAGS: tuple[str, ...] = (
    "prompt_index",
    "prompt_id",
    "group_id",
    "generation_index",
    "weight_version",
    "end_weight",
    "target_step",
)
"""The tags of a trained row: the prompt's position in its dataset and id, its group and generation index, its
start weight (``weight_version``), end weight and the step it was stamped for."""

OPTIONAL_ROW_TAGS: tuple[str, ...] = ("teacher",)
"""Tags only some runs' rows have: ``teacher``, the alias of an on-policy distillation run's row's teacher."""


# ------------------------------------------------------------------------------------------------ stats


@dataclass(frozen=True)
class StepDrops:
    """What drops (and dynamic sampling) did to one closed step (logged as ``train/*_prompt_groups`` and
    ``dynamic_sampling/*``)."""

    dropped: int = 0
    replaced: int = 0
    promoted: int = 0
    filtered: tuple[dict[str, Any], ...] = ()  # dynamic sampling's filtered groups (dynamic_sampling.py's records)
    extra_generations: int = 0  # fresh prompts generated in their place


@dataclass(frozen=True)
class Cohort:
    """Some prompt groups of one step: how many, and the mean over them of each group's mean reward and mean
    completion length (0 for none)."""

    groups: int = 0
    reward_mean: float = 0.0
    len_mean: float = 0.0


@dataclass(frozen=True)
class StepSurvivorship:
    """Which groups survived to training in one step (logged as ``survivorship/*``): those the sampler took for the
    step (trained), those whose rollouts finished and were committed (committed), and those it evicted (evicted),
    each counted between two refits. A sampler that starves hard prompts shows as trained groups with a higher
    reward or shorter completions than committed ones, or evicted ones with lower rewards."""

    trained: Cohort = Cohort()
    committed: Cohort = Cohort()
    evicted: Cohort = Cohort()


@dataclass
class ControllerCounts:
    """Run totals of prompt groups by what became of them (the :class:`ControllerStats` fields of the same names)."""

    dispatched: int = 0
    committed: int = 0
    selected: int = 0
    evicted: int = 0
    aborted: int = 0  # in flight when a refit found them doomed


@dataclass(frozen=True)
class ControllerStats:
    """Counters and gauges of the controller, for logging and tests."""

    trainer_version: int
    dispatch_index: int
    dispatched: int
    committed: int
    selected: int
    evicted: int
    aborted: int
    inflight: int
    buffered: int
    ready: int
    buffer_permits_held: int
    exhausted: bool
    idle_s: float  # since the last commit or completed step
    infra_failures: int = 0  # failed rollout attempts by kind, and the retries they led to
    data_failures: int = 0
    redispatched: int = 0
    dropped: int = 0  # groups dropped within the drop budgets, run total
    replaced: int = 0  # spares committed in place of dropped groups, run total
    promoted: int = 0  # later steps' groups lent to steps that lost one, run total
    filtered: int = 0  # groups filtered by dynamic sampling, run total
    extra_generations: int = 0  # prompts generated in filtered groups' places, run total
    last_step: StepDrops = StepDrops()  # what drops did to the step closed by the last begin_refit
    survivorship: StepSurvivorship = StepSurvivorship()  # the groups of the step closed by the last begin_refit
    engine_time: EngineTime = EngineTime()  # the engine fleet's goodput accounts (rollout/goodput.py)


@dataclass(frozen=True)
class RefitReport:
    """What one refit did: the in-flight rollouts it aborted, and the controller's counters once dispatch reopened."""

    aborted: int
    stats: ControllerStats


# ------------------------------------------------------------------------------------------------ errors


class RolloutPumpError(RuntimeError):
    """The rollout pump stopped on a failure; the message names the prompt and group that failed."""


class SelectTimeout(TimeoutError):
    """The trainer waited longer than its deadline for enough ready groups."""


class WaitInterrupted(RuntimeError):
    """A stop signal ended the trainer's wait for rollouts; nothing was selected (the step is not trained)."""


class DrainTimeout(TimeoutError):
    """The drain gate waited past ``async_rl.drain_timeout_s`` for in-flight rollouts; names the step, the prompts
    and groups still generating, and the engine."""


class ControllerUnresponsive(TimeoutError):
    """The controller did not answer a call within its deadline."""

    def __init__(self, call: str, timeout_s: float | None) -> None:
        super().__init__(
            f"the SingleController did not answer {call} within {timeout_s} s: its event loop is blocked (a "
            "long synchronous call in an environment, a custom sampler or an engine client?) or its process is gone"
        )


class ControllerDied(RuntimeError):
    """The controller's Ray actor died; the Ray error is the cause."""


# ------------------------------------------------------------------------------------------------ the client


class ControllerClient(Protocol):
    """The blocking train-side API of a running controller."""

    def evict(self, trainer_version: int) -> list[GroupMeta]:
        """Drop groups that can never be trained at ``trainer_version``."""

    def select(
        self, trainer_version: int, min_groups: int, max_groups: int, *, timeout_s: float | None = None
    ) -> list[GroupMeta] | None:
        """Wait for and take trainable groups; None once rollouts are exhausted."""

    def refit(
        self, version: int, named_tensors: list[tuple[str, torch.Tensor]] | None, *, wake: bool = False
    ) -> RefitReport:
        """One whole refit: begin, push the weights (None: the policy is unchanged), wake a colocated engine,
        finish."""

    def begin_refit(self, next_version: int) -> int:
        """Close dispatch and abort doomed rollouts."""

    def push_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int, *, last: bool = True) -> None:
        """Load new weights into the generation engine (``last=False``: one bucket of them, more follow; the engine
        adopts ``version`` with the last)."""

    def stand_down_engine(self) -> None:
        """Release a colocated engine's accelerator for the train step."""

    def wake_engine(self) -> None:
        """Take the accelerator back for a colocated engine."""

    def finish_refit(self, version: int) -> None:
        """Stamp the new version and reopen dispatch."""

    def stats(self) -> ControllerStats:
        """Counters of the controller."""

    def snapshot(self, directory: str | None) -> dict[str, Any]:
        """Between steps: the data plane's rows into ``directory``; returns the controller's checkpoint state."""

    def shutdown(self) -> None:
        """Stop the controller and release its home (thread or actor)."""


@dataclass(frozen=True)
class TeacherAgreement:
    """How close the student's validation completions routed to one distillation teacher are to that teacher: the
    prompts, their summed reward, and ``log pi_student - log pi_teacher`` summed over their model tokens."""

    alias: str
    samples: int
    reward_sum: float
    kl_sum: float
    tokens: int

    def metrics(self) -> dict[str, float]:
        """``val/teacher_kl/<alias>`` (per model token), ``val/teacher_reward/<alias>`` (per prompt) and
        ``val/teacher_samples/<alias>``; a teacher without prompts logs only its 0 samples."""
        out = {f"val/teacher_samples/{self.alias}": float(self.samples)}
        if self.samples:
            out[f"val/teacher_reward/{self.alias}"] = self.reward_sum / self.samples
        if self.tokens:
            out[f"val/teacher_kl/{self.alias}"] = self.kl_sum / self.tokens
        return out


@dataclass(frozen=True)
class ValidationResult:
    """One finished validation: its step, the weight version every completion was generated at, and its scores."""

    step: int
    weight_version: int
    rewards: tuple[float, ...]
    completion_lengths: tuple[int, ...]
    generation_versions: tuple[int, ...]
    seconds: float
    teachers: tuple[TeacherAgreement, ...] = ()  # a distillation run's: one per teacher

    def metrics(self) -> dict[str, float]:
        """The ``val/*`` metrics: mean reward, accuracy (the share of completions with reward > 0: the exact-match
        rate of a 0/1 verifier), mean completion length in tokens, the weight version, the prompt count, and in a
        distillation run each teacher's agreement with the student (:meth:`TeacherAgreement.metrics`)."""
        count = len(self.rewards)
        teachers = {name: value for teacher in self.teachers for name, value in teacher.metrics().items()}
        return teachers | {
            "val/reward": sum(self.rewards) / count,
            "val/accuracy": sum(reward > 0 for reward in self.rewards) / count,
            "val/completion_len_mean": sum(self.completion_lengths) / count,
            "val/weight_version": float(self.weight_version),
            "val/samples": float(count),
            "val/duration_s": self.seconds,
        }
