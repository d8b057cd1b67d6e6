"""The ``on_policy_distillation:`` block: the teachers of multi-teacher on-policy distillation (MOPD) and how each
prompt is routed to one (``grpo.adv_estimator.name: opd``; docs/distillation.md)."""

from __future__ import annotations

from typing import Literal

from sc_lightning.config.knobs import knob, section


@section
class TeacherConfig:
    """One inference-only teacher: its weights, precision and where it runs."""

    model_name: str = knob(
        doc="The teacher's weights: a builtin: model (a warm start), a Hugging Face directory or an exported bundle's "
        "hf/ directory; its tokenizer must be the policy's."
    )
    precision: Literal["fp32", "bf16", "fp16"] = knob("fp32", "Precision the teacher computes its logprobs in.")
    colocated: bool = knob(
        True, "Run the teacher in the rollout side's process (true) or in a Ray actor of its own (false)."
    )
    num_cpus: float = knob(1.0, "CPUs of the teacher's Ray actor (colocated: false).", ge=0)
    num_gpus: float = knob(0.0, "GPUs of the teacher's Ray actor (colocated: false); 0 runs it on CPU.", ge=0)
    max_batch_rows: int = knob(
        64, "Rows the teacher scores in one forward pass (a group's rows go in batches of at most this).", ge=1
    )


@section
class DistillationConfig:
    """Multi-teacher on-policy distillation: named teachers, and the dataset field that routes a prompt to one."""

    teachers: dict[str, TeacherConfig] = knob(
        doc="The teachers by alias; each prompt is scored by the teacher its route_key field names.", factory=dict
    )
    route_key: str | None = knob(
        "teacher",
        "The dataset column (a prompt's extra field) that names its teacher's alias; null routes every prompt to "
        "default_teacher.",
    )
    default_teacher: str | None = knob(
        None, "The alias of prompts without a route_key field (null: such a prompt is an error naming its row)."
    )
    full_vocabulary: bool = knob(
        False,
        "Compare the teacher's whole next-token distribution (exact reverse KL as a loss term) instead of the "
        "sampled token's logprob; stores T x V x 4 bytes per row in the data plane.",
    )
    full_vocabulary_coef: float = knob(1.0, "Weight of the full-vocabulary reverse-KL loss term.", ge=0)
    max_full_vocabulary_size: int = knob(
        1024,
        "Largest vocabulary full_vocabulary accepts: its data-plane bytes grow with it (T x V x 4 per row).",
        ge=1,
    )
    teacher_timeout_s: float | None = knob(
        120.0, "Deadline of one group's teacher scoring; a miss is an infra failure, retried like the engine's.", gt=0
    )

    def aliases(self) -> tuple[str, ...]:
        """The teachers' aliases in the order a row's ``teacher_id`` field indexes them (sorted)."""
        return tuple(sorted(self.teachers))
