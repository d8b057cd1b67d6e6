"""Validation rules for prompts with images: a vision-language policy (``policy.is_vlm``) and a dataset whose prompts
hold images (the built-in ``clevr``, or a file with ``data.images_key``) come together or not at all, and the kinds of
question the built-in ``clevr`` draws (docs/vlm.md)."""

from __future__ import annotations

from typing import get_args

from sc_lightning.config.report import Report, ties
from sc_lightning.config.runtime import DEFAULT_CLEVR_KINDS, IMAGE_DATASETS, ClevrKind
from sc_lightning.config.schema import SCConfig

IMAGE_SOURCES = f"data.dataset_name: {' or '.join(IMAGE_DATASETS)}, or a dataset file with data.images_key"
"""Where a vision-language run's images may come from, as the errors name them."""


@ties("policy.is_vlm", "data.dataset_name", "data.images_key")
def vlm_needs_images(config: SCConfig, report: Report) -> None:
    """A vision-language policy trains on prompts with images: a text-only dataset is refused."""
    data = config.data
    if config.policy.is_vlm and not data.has_images():
        report.error(
            "policy.is_vlm",
            f"is true, but the prompts of data.dataset_name ({data.dataset_name}) hold no images; give images "
            f"({IMAGE_SOURCES}), or set policy.is_vlm: false",
        )


@ties("policy.is_vlm", "data.dataset_name", "data.images_key")
def images_need_a_vlm(config: SCConfig, report: Report) -> None:
    """Prompts with images need a policy that sees them: a text policy would train on image tokens it cannot read."""
    data = config.data
    if data.has_images() and not config.policy.is_vlm:
        source = f"data.images_key: {data.images_key}" if data.images_key else f"data.dataset_name: {data.dataset_name}"
        report.error(
            "policy.is_vlm",
            f"is false, but the prompts hold images ({source}); set policy.is_vlm: true with a vision-language "
            "policy, or use a text dataset",
        )


@ties("data.images_key", "data.dataset_name", "data.messages_key", "data.apply_chat_template")
def images_come_from_text_prompt_files(config: SCConfig, report: Report) -> None:
    """data.images_key reads a dataset file's column; its prompts are text, placed around the images (chat rendering
    with images is not supported yet)."""
    data = config.data
    if data.images_key is None:
        return
    if data.builtin_dataset():
        report.error(
            "data.images_key",
            f"is {data.images_key!r}, but data.dataset_name ({data.dataset_name}) is a built-in dataset, which has no "
            "such column; set data.images_key: null (it applies to dataset files)",
        )
    elif data.messages_key is not None or data.apply_chat_template:
        chat = "data.messages_key" if data.messages_key is not None else "data.apply_chat_template"
        report.error(
            "data.images_key",
            f"is set together with {chat}, but prompts with images are not rendered by a chat template yet; give "
            "text prompts (data.prompt_key, with <image> placeholders where the images go) and unset " + chat,
        )


@ties("data.clevr_kinds", "data.dataset_name")
def clevr_kinds(config: SCConfig, report: Report) -> None:
    """data.clevr_kinds lists the kinds the built-in clevr dataset draws in turn, at least one and each once; no other
    dataset draws question kinds."""
    data = config.data
    kinds = list(data.clevr_kinds)
    default = ", ".join(DEFAULT_CLEVR_KINDS)
    twice = sorted({kind for kind in kinds if kinds.count(kind) > 1})
    if not kinds:
        report.error(
            "data.clevr_kinds",
            f"is empty, but every clevr question is of some kind; list one or more of {', '.join(get_args(ClevrKind))} "
            f"(the default: [{default}])",
        )
    elif twice:
        report.error("data.clevr_kinds", f"is {kinds}, which lists {', '.join(twice)} more than once; list each once")
    if data.clevr_kinds != DEFAULT_CLEVR_KINDS and data.dataset_name != "clevr":
        report.error(
            "data.clevr_kinds",
            f"is {kinds}, but data.dataset_name ({data.dataset_name}) is not the built-in clevr, the one dataset that "
            f"draws kinds of question; remove data.clevr_kinds (the default: [{default}]), or set "
            "data.dataset_name: clevr",
        )


@ties("policy.is_vlm", "checkpointing.export_hf_at_end")
def vlm_has_no_hf_export(config: SCConfig, report: Report) -> None:
    """A vision-language policy's bundles are not exported: its vision side has no Hugging Face form."""
    if config.policy.is_vlm and config.checkpointing.export_hf_at_end:
        report.error(
            "checkpointing.export_hf_at_end",
            "is true with policy.is_vlm: true; a vision-language policy's vision tower and projector have no Hugging "
            "Face form that transformers loads (docs/vlm.md), so there is nothing to export: set it to false and "
            "resume from the bundles",
        )


@ties("policy.is_vlm", "on_policy_distillation")
def vlm_is_not_distilled(config: SCConfig, report: Report) -> None:
    """On-policy distillation of a vision-language policy is not supported: its teachers score the prompt's text, so
    none would see the images the student answered about."""
    if config.policy.is_vlm and config.on_policy_distillation is not None:
        report.error(
            "on_policy_distillation",
            "is set with policy.is_vlm: true, but on-policy distillation of a vision-language policy is not supported "
            "(its teachers score the prompts' text without their images, docs/distillation.md); remove "
            "on_policy_distillation and set the grpo estimator, or distill a text policy",
        )


VLM_RULES = (
    vlm_needs_images,
    images_need_a_vlm,
    images_come_from_text_prompt_files,
    clevr_kinds,
    vlm_has_no_hf_export,
    vlm_is_not_distilled,
)
