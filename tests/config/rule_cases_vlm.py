"""Rule cases for the rules of prompts with images (config/rules/vlm.py).

Every passing config here has ``policy.is_vlm: false``; the rules' silence on a vision-language run with images is
checked by calling them directly (test_rules.py), so these cases hold whatever the model rules say of is_vlm.
"""

from __future__ import annotations

from typing import Any

from tests.helpers.configs import variant

VLM = {"policy": {"is_vlm": True}}
FILE = {"data": {"dataset_name": "p.parquet", "prompt_key": "q"}}
IMAGES = {"data": {"images_key": "images"}}
CLEVR = {"data": {"dataset_name": "clevr"}, "env": {"name": "clevr"}}
TEACHER = {"t": {"model_name": "builtin:tiny"}}
OPD = {"grpo": {"adv_estimator": {"name": "opd"}}, "on_policy_distillation": {"teachers": TEACHER}}

VLM_CASES: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    (
        "a vlm needs images (built-in text task)",
        variant(),
        variant(VLM),
        "policy.is_vlm",
        "the prompts of data.dataset_name (arithmetic) hold no images",
    ),
    (
        "a vlm needs images (file without data.images_key)",
        variant(FILE),
        variant(FILE, VLM),
        "policy.is_vlm",
        "data.dataset_name: clevr, or a dataset file with data.images_key",
    ),
    (
        "images need a vlm (clevr)",
        variant({"data": {"dataset_name": "arithmetic"}}),
        variant({"data": {"dataset_name": "clevr"}, "env": {"name": "clevr"}}),
        "policy.is_vlm",
        "the prompts hold images (data.dataset_name: clevr)",
    ),
    (
        "images need a vlm (file)",
        variant(FILE),
        variant(FILE, IMAGES),
        "policy.is_vlm",
        "the prompts hold images (data.images_key: images)",
    ),
    (
        "images come from files",
        variant(),
        variant(IMAGES),
        "data.images_key",
        "set data.images_key: null (it applies to dataset files)",
    ),
    (
        "images come from text prompts",
        variant(FILE, {"data": {"apply_chat_template": True}}),
        variant(FILE, IMAGES, {"data": {"apply_chat_template": True}}),
        "data.images_key",
        "is set together with data.apply_chat_template",
    ),
    (
        "clevr kinds only for clevr",
        variant({"data": {"clevr_kinds": ["count", "colour"]}}),
        variant({"data": {"clevr_kinds": ["relation"]}}),
        "data.clevr_kinds",
        "data.dataset_name (arithmetic) is not the built-in clevr, the one dataset that draws kinds of question; "
        "remove data.clevr_kinds (the default: [count, colour])",
    ),
    (
        "clevr kinds not empty",
        variant(),
        variant(CLEVR, {"data": {"clevr_kinds": []}}),
        "data.clevr_kinds",
        "is empty, but every clevr question is of some kind; list one or more of count, colour, relation",
    ),
    (
        "clevr kinds each once",
        variant(),
        variant(CLEVR, {"data": {"clevr_kinds": ["relation", "count", "relation"]}}),
        "data.clevr_kinds",
        "lists relation more than once; list each once",
    ),
    (
        "clevr kinds are known (loader)",
        variant(),
        variant(CLEVR, {"data": {"clevr_kinds": ["count", "colours"]}}),
        "data.clevr_kinds[1]",
        "must be one of 'count', 'colour', 'relation', got 'colours'; did you mean 'colour'?",
    ),
    (
        "a vlm has no hf export",
        variant({"checkpointing": {"enabled": True, "save_data_plane": True, "export_hf_at_end": True}}),
        variant(
            {"data": {"dataset_name": "clevr"}, "env": {"name": "clevr"}},
            VLM,
            {"checkpointing": {"enabled": True, "save_data_plane": True, "export_hf_at_end": True}},
        ),
        "checkpointing.export_hf_at_end",
        "no Hugging Face form that transformers loads",
    ),
    (
        "a vlm is not distilled",
        variant(OPD),
        variant(CLEVR, VLM, OPD),
        "on_policy_distillation",
        "on-policy distillation of a vision-language policy is not supported",
    ),
]
