"""Loading raw YAML into typed sections: unknown keys, types, bounds, sampler modes, layering, round trips."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sc_lightning.cli.load import LIGHTNING_KEYS
from sc_lightning.config import ConfigError, config_to_dict, load_config
from sc_lightning.config.algorithm import GAEAdvantage, GRPOAdvantage
from sc_lightning.config.samplers import WindowedSamplerConfig
from sc_lightning.config.yaml_io import apply_override, load_yaml_layers, merge_into
from tests.config.helpers import PPO_COMPANION, errors_of
from tests.helpers.configs import TEST_BASE, tiny_raw, variant


@pytest.mark.parametrize(
    ("layer", "expected"),
    [
        (
            {"grpo": {"num_prompts_per_stp": 4}},
            "grpo.num_prompts_per_stp: unknown key; did you mean grpo.num_prompts_per_step?",
        ),
        ({"grpo": {"max_bufered_rollouts": 4}}, "did you mean async_rl.max_buffered_rollouts?"),
        (
            {"policy": {"max_num_steps": 3}},
            "policy.max_num_steps: unknown key; it belongs at grpo.max_num_steps or ppo.max_num_steps",
        ),
        ({"polcy": {}}, "polcy: unknown key; did you mean policy?"),
        ({"async_rl": {"generation_timeout_s": 5}}, "has moved; set async_rl.rollout_failure.generation_timeout_s"),
        ({"async_rl": {"watchdog": {}}}, "has been renamed; use async_rl.stall_watchdog"),
        (
            {"async_rl": {"rollout_failure": {"max_attempts_per_prompt": 3}}},
            "renamed; use async_rl.rollout_failure.max_infra_attempts_per_prompt",
        ),
    ],
)
def test_unknown_keys_point_to_the_right_key(layer: dict, expected: str) -> None:
    errors = errors_of(variant(layer))
    assert any(expected in e for e in errors), errors


def test_a_knob_of_another_sampler_mode_is_an_error() -> None:
    raw = variant({"async_rl": {"sampler": {"name": "windowed", "max_lookahead_versions": 1}}}, base={"grpo": {}})
    (error,) = errors_of(raw)
    assert error.startswith("async_rl.sampler.max_lookahead_versions: is a knob of the 'in_order' sampler")
    assert "not of 'windowed'" in error


@pytest.mark.parametrize(
    ("layer", "expected"),
    [
        ({"grpo": {"num_prompts_per_step": "four"}}, "grpo.num_prompts_per_step: expected int, got str 'four'"),
        ({"grpo": {"num_prompts_per_step": True}}, "grpo.num_prompts_per_step: expected int, got bool True"),
        ({"grpo": {"num_prompts_per_step": 0}}, "grpo.num_prompts_per_step: must be >= 1, got 0"),
        ({"policy": {"generation": {"top_p": 1.5}}}, "policy.generation.top_p: must be <= 1, got 1.5"),
        ({"policy": {"generation": {"temperature": 0}}}, "policy.generation.temperature: must be > 0, got 0.0"),
        (
            {"policy": {"generation": {"backend": "vlm"}}},
            "must be one of 'megatron', 'vllm', got 'vlm'; did you mean 'vllm'?",
        ),
        ({"async_rl": {"sampler": {"name": "windowd"}}}, "async_rl.sampler.name: must be one of"),
        ({"checkpointing": {"enabled": "yes"}}, "checkpointing.enabled: expected bool, got str 'yes'"),
        ({"policy": []}, "policy: expected a mapping of PolicyConfig settings"),
        (
            {"rollout_recovery": {"agent_granularity_overrides": {"coder": "everything"}}},
            "rollout_recovery.agent_granularity_overrides.coder: must be one of 'sibling', 'prompt_group'",
        ),
        ({"async_rl": {"sampler": {"name": "custom"}}}, "async_rl.sampler.target: is required"),
        ({"grpo": {"num_prompts_per_step": 8.5}}, "grpo.num_prompts_per_step: expected int, got float 8.5"),
        ({"grpo": {"num_prompts_per_step": None}}, "grpo.num_prompts_per_step: expected int, got NoneType None"),
        ({"grpo": {"num_prompts_per_step": {"n": 8}}}, "grpo.num_prompts_per_step: expected int, got dict {'n': 8}"),
        ({"policy": {"generation": [1, 2]}}, "policy.generation: expected a mapping of GenerationConfig settings"),
        ({"async_rl": {"sampler": "in_order"}}, "async_rl.sampler: expected dict, got str 'in_order'"),
        ({"data": {"dataset_name": ["a.jsonl"]}}, "data.dataset_name: expected str, got list ['a.jsonl']"),
        ({"data": {"max_skipped_rows": -1}}, "data.max_skipped_rows: must be >= 0, got -1"),
        ({"data": {"max_skipped_rows": "ten"}}, "data.max_skipped_rows: expected int, got str 'ten'"),
        ({"loss_fn": {"max_token_staleness": -1}}, "loss_fn.max_token_staleness: must be >= 0, got -1"),
        ({"loss_fn": {"max_token_staleness": 1.5}}, "loss_fn.max_token_staleness: expected int, got float 1.5"),
        # NaN passes every bound and inf most: neither is a knob's value
        ({"policy": {"optimizer": {"lr": float("inf")}}}, "policy.optimizer.lr: must be a finite number, got inf"),
        ({"policy": {"optimizer": {"lr": "1e309"}}}, "policy.optimizer.lr: must be a finite number, got '1e309'"),
        (
            {"grpo": {"reward_scaling": {"enabled": True, "source_min": float("nan")}}},
            "grpo.reward_scaling.source_min: must be a finite number, got nan",
        ),
    ],
)
def test_types_and_bounds(layer: dict, expected: str) -> None:
    errors = errors_of(variant(layer))
    assert any(expected in e for e in errors), errors


def test_a_yaml_file_with_wrong_types_reports_every_dotpath_at_once(tmp_path) -> None:
    """Wrong types as users write them in YAML (a word for a number, a bare ``no``, a list for a section) all come
    back in one ConfigError, each with its dotpath and what was expected."""
    path = tmp_path / "wrong.yaml"
    path.write_text(
        "grpo:\n  num_prompts_per_step: eight\n"
        "policy:\n  generation:\n    - backend: megatron\n"
        "data:\n  dataset_name: no\n  max_skipped_rows: 1.5\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_config(load_yaml_layers([*TEST_BASE, path]), extra_top_level=LIGHTNING_KEYS)
    assert [str(issue) for issue in raised.value.issues] == [
        "grpo.num_prompts_per_step: expected int, got str 'eight'",
        "policy.generation: expected a mapping of GenerationConfig settings, got list [{'backend': 'megatron'}]",
        "data.dataset_name: expected str, got bool False",
        "data.max_skipped_rows: expected int, got float 1.5",
    ]


def test_floats_accept_ints_and_exponent_strings() -> None:
    config = load_config(
        variant({"policy": {"optimizer": {"lr": "1e-5", "weight_decay": 0}}}), extra_top_level=LIGHTNING_KEYS
    )
    assert config.policy.optimizer.lr == pytest.approx(1e-5)
    assert config.policy.optimizer.weight_decay == 0.0


def test_a_named_section_without_a_name_changes_the_fields_default() -> None:
    grpo = load_config(
        variant({"grpo": {"adv_estimator": {"normalize_rewards": False}}}), extra_top_level=LIGHTNING_KEYS
    )
    assert grpo.grpo.adv_estimator == GRPOAdvantage(normalize_rewards=False)
    ppo = variant(copy.deepcopy(PPO_COMPANION))
    ppo["ppo"]["adv_estimator"] = {"gae_lambda": 0.9}
    assert load_config(ppo, extra_top_level=LIGHTNING_KEYS).ppo.adv_estimator == GAEAdvantage(gae_lambda=0.9)
    assert errors_of(variant({"grpo": {"adv_estimator": {"name": "grop"}}})) == [
        "grpo.adv_estimator.name: must be one of 'grpo', 'opd', 'gae', got 'grop'; did you mean 'grpo'?"
    ]


def test_resolved_config_round_trips() -> None:
    config = load_config(tiny_raw(), extra_top_level=LIGHTNING_KEYS)
    again = load_config(config_to_dict(config))
    assert again == config


def test_sampler_mode_switch_in_a_later_layer_replaces_the_old_mode(tmp_path) -> None:
    overlay = tmp_path / "windowed.yaml"
    overlay.write_text("async_rl:\n  sampler:\n    name: windowed\n    max_staleness_versions: 2\n")
    raw = load_yaml_layers([*TEST_BASE, overlay])
    assert raw["async_rl"]["sampler"] == {"name": "windowed", "max_staleness_versions": 2}
    config = load_config(raw, extra_top_level=LIGHTNING_KEYS)
    assert isinstance(config.async_rl.sampler, WindowedSamplerConfig)


def test_layers_merge_key_by_key_within_a_mode() -> None:
    base = {"async_rl": {"sampler": {"name": "in_order", "max_lookahead_versions": 0}, "max_inflight_prompts": 4}}
    merge_into(base, {"async_rl": {"sampler": {"max_lookahead_versions": 2}}})
    assert base == {
        "async_rl": {"sampler": {"name": "in_order", "max_lookahead_versions": 2}, "max_inflight_prompts": 4}
    }


def test_overrides_are_yaml_typed_and_a_new_name_resets_the_mode() -> None:
    raw = tiny_raw()
    apply_override(raw, "grpo.max_num_steps=5")
    apply_override(raw, "async_rl.sampler.name=weight_fifo")
    apply_override(raw, "loss_fn.ratio_clip_c=3.0")
    assert raw["grpo"]["max_num_steps"] == 5
    assert raw["async_rl"]["sampler"] == {"name": "weight_fifo"}
    assert raw["loss_fn"]["ratio_clip_c"] == 3.0


def test_interpolation_resolves_after_overrides(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "grpo:\n  num_prompts_per_step: 8\nasync_rl:\n  min_groups_for_streaming_train: ${grpo.num_prompts_per_step}\n"
    )
    raw = load_yaml_layers([path], ["grpo.num_prompts_per_step=6"])
    assert raw["async_rl"]["min_groups_for_streaming_train"] == 6


def test_broken_interpolation_and_missing_files_are_config_errors(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("async_rl:\n  min_groups_for_streaming_train: ${grpo.nope}\n")
    with pytest.raises(ConfigError, match="nope"):
        load_yaml_layers([path])
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml_layers([tmp_path / "missing.yaml"])
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping at top level"):
        load_yaml_layers([tmp_path / "list.yaml"])


def test_a_key_twice_and_an_unreadable_file_are_config_errors_and_merge_keys_still_override(tmp_path) -> None:
    """Plain YAML keeps a repeated key's last value silently (a second grpo: block would replace the first); here it
    is an error naming both lines. A file that is not UTF-8, or a directory, is an error too."""
    twice = tmp_path / "twice.yaml"
    twice.write_text("grpo:\n  seed: 7\n  seed: 8\n")
    with pytest.raises(ConfigError, match=r"found the key 'seed' twice \(first on line 2\)[\s\S]*line 3"):
        load_yaml_layers([twice])
    merged = tmp_path / "merged.yaml"  # a key merged in with << may be overridden: that is no repeat
    merged.write_text("base: &base\n  seed: 7\ngrpo:\n  <<: *base\n  seed: 8\n")
    assert load_yaml_layers([merged])["grpo"] == {"seed": 8}
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"# caf\xe9\ngrpo: {}\n")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_yaml_layers([latin])
    with pytest.raises(ConfigError, match="cannot be read: Is a directory"):
        load_yaml_layers([tmp_path])


@given(
    n=st.integers(1, 64),
    window=st.integers(0, 4),
    mode=st.sampled_from(["in_order", "weight_fifo", "ready_first"]),
    slack=st.integers(-64, 64),
)
def test_gated_capacity_is_rejected_exactly_below_n_times_window_plus_one(n, window, mode, slack) -> None:
    knob = "max_lookahead_versions" if mode == "in_order" else "max_staleness_versions"
    required = n * (window + 1)
    buffered = max(1, required + slack)
    raw = variant(
        {
            "grpo": {"num_prompts_per_step": n},
            "policy": {"train_global_batch_size": n * 4},
            "async_rl": {
                "sampler": {"name": mode, knob: window},
                "max_buffered_rollouts": buffered,
                "min_groups_for_streaming_train": n,
            },
        }
    )
    capacity_errors = [e for e in errors_of(raw) if e.startswith("async_rl.max_buffered_rollouts")]
    assert bool(capacity_errors) == (buffered < required)


def test_custom_sampler_extra_keys_become_constructor_kwargs() -> None:
    raw = variant({"async_rl": {"sampler": {"name": "custom", "target": "m:C", "window": 3, "init_args": {"x": 1}}}})
    sampler = load_config(raw, extra_top_level=LIGHTNING_KEYS).async_rl.sampler
    assert sampler.init_args == {"x": 1, "window": 3}
