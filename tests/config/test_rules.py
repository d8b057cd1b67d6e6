"""Every validation rule, each with a config that passes it and one that fails it, and the error text.

The cases live in rule_cases_algo.py, rule_cases_runtime.py, rule_cases_multiturn.py, rule_cases_distillation.py and
rule_cases_vlm.py, one file per rule module.
"""

from __future__ import annotations

import pytest

from tests.config.helpers import errors_of, warnings_of
from tests.config.rule_builders import CUSTOM, ckpt, ppo, sampler
from tests.config.rule_cases_algo import ALGORITHM_CASES
from tests.config.rule_cases_distillation import DISTILLATION_CASES
from tests.config.rule_cases_multiturn import MULTITURN_CASES
from tests.config.rule_cases_runtime import RUNTIME_CASES
from tests.config.rule_cases_vlm import VLM_CASES
from tests.helpers.configs import variant

CASES = ALGORITHM_CASES + RUNTIME_CASES + MULTITURN_CASES + DISTILLATION_CASES + VLM_CASES


@pytest.mark.parametrize(("rule", "passing", "failing", "path", "text"), CASES, ids=[c[0] for c in CASES])
def test_rule_passes_and_fails(rule: str, passing: dict, failing: dict, path: str, text: str) -> None:
    assert errors_of(passing) == [], f"{rule}: the passing config was rejected"
    errors = errors_of(failing)
    matching = [e for e in errors if path in e.split(": ", 1)[0].split(", ") and text in e]
    assert matching, f"{rule}: expected an error at {path!r} containing {text!r}, got {errors}"


def test_every_rule_function_has_a_failing_case() -> None:
    """Each rule, run alone, rejects at least one failing config above: a new rule needs a case here."""
    from sc_lightning.cli.load import LIGHTNING_KEYS
    from sc_lightning.config import ConfigError, load_config
    from sc_lightning.config.report import Report
    from sc_lightning.config.rules import RULES

    configs = []
    for case in CASES:
        try:
            configs.append(load_config(case[2], extra_top_level=LIGHTNING_KEYS))
        except ConfigError:
            continue  # a loader-level rule (type or bound), covered by the case itself
    for rule in RULES:
        reports = [Report() for _ in configs]
        for config, report in zip(configs, reports, strict=True):
            rule(config, report)
        assert any(report.errors for report in reports), f"no failing case exercises {rule.__name__}"


@pytest.mark.parametrize(
    "data",
    [
        {"dataset_name": "clevr"},
        {"dataset_name": "clevr", "clevr_kinds": ["relation", "count", "colour"]},
        {"dataset_name": "p.parquet", "prompt_key": "q", "images_key": "images"},
    ],
)
def test_the_image_rules_pass_a_vision_language_run_with_images(data: dict) -> None:
    from sc_lightning.cli.load import LIGHTNING_KEYS
    from sc_lightning.config import load_config
    from sc_lightning.config.report import Report
    from sc_lightning.config.rules.vlm import VLM_RULES

    config = load_config(variant({"policy": {"is_vlm": True}, "data": data}), extra_top_level=LIGHTNING_KEYS)
    report = Report()
    for rule in VLM_RULES:
        rule(config, report)
    assert report.errors == []


def test_all_errors_are_reported_at_once() -> None:
    failing = variant(
        {"grpo": {"max_num_epochs": 0, "reward_scaling": {"enabled": True, "source_max": 0.0}}},
        {"policy": {"train_global_batch_size": 3}},
        {"data_plane": {"enabled": False}},
    )
    errors = errors_of(failing)
    assert [e.split(":")[0] for e in errors] == [
        "grpo.max_num_epochs",
        "grpo.reward_scaling.source_max",
        "policy.train_global_batch_size",
        "data_plane.enabled",
    ]


def test_both_algorithm_blocks_are_one_error_not_ppo_rules_on_a_grpo_config() -> None:
    """The tiny GRPO config with a PPO block beside it: the only error says to keep one block (PPO's own rules, e.g.
    its offloaded optimizer, would name knobs the user never meant for PPO)."""
    assert [e.split(":")[0] for e in errors_of(variant({"ppo": ppo()["ppo"]}))] == ["grpo, ppo"]


WARNING_CASES = [
    (
        "floor leaves no room to shrink",
        {"async_rl": {"rollout_failure": {"max_skipped_prompts": 1}}},
        "async_rl.rollout_failure.min_step_batch_fraction",
        "ceil(4 x 0.9) = 4",
    ),
    (
        "replace without stamps",
        variant(
            sampler(name="windowed"),
            {"async_rl": {"rollout_failure": {"on_dropped_prompt": "replace", "replacement_reserve_prompts": 1}}},
        ),
        "async_rl.rollout_failure.on_dropped_prompt",
        "does nothing with the windowed sampler",
    ),
    (
        "reserve larger than a step",
        {"async_rl": {"rollout_failure": {"on_dropped_prompt": "replace", "replacement_reserve_prompts": 9}}},
        "async_rl.rollout_failure.replacement_reserve_prompts",
        "exceeds a step's 4 prompts",
    ),
    (
        "custom sampler without buffer checkpoints",
        variant(sampler(name="custom", target=f"{CUSTOM}:NoCheckpointSampler"), ckpt(enabled=True)),
        "async_rl.sampler.target",
        "not restored on resume: they are generated again",
    ),
    (
        "custom sampler without buffer checkpoints, shadow mode",
        variant(
            sampler(name="custom", target=f"{CUSTOM}:NoCheckpointSampler"),
            ckpt(enabled=True, save_data_plane=True),
        ),
        "async_rl.sampler.target",
        "in shadow mode",
    ),
    (
        "the critic warm-up outlasts the run",
        ppo({"ppo": {"policy_training_start_step": 6, "max_num_steps": 6}}),
        "ppo.policy_training_start_step",
        "is 6 but ppo.max_num_steps is 6: every step of this run is critic warm-up and the policy does not train",
    ),
]


@pytest.mark.parametrize(("case", "layer", "path", "text"), WARNING_CASES, ids=[c[0] for c in WARNING_CASES])
def test_warnings(case: str, layer: dict, path: str, text: str) -> None:
    raw = variant(layer)
    assert errors_of(raw) == []
    assert any(w.startswith(f"{path}:") and text in w for w in warnings_of(raw)), warnings_of(raw)
    assert not any(w.startswith(f"{path}:") for w in warnings_of(variant()))
