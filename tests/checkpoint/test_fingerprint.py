"""The bootstrap fingerprint: fail-closed, exclusions by pattern, exact changed dotpaths, no credentials."""

from __future__ import annotations

import fnmatch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sc_lightning.checkpoint.fingerprint import (
    BUILTIN_EXCLUDED_PATHS,
    FingerprintMismatch,
    changed_paths,
    check_compatible,
    compatibility_identity,
    fingerprint,
)
from sc_lightning.config import config_to_dict, load_config
from sc_lightning.config.dotpath_patterns import ROLLOUT_KNOBS, path_matches, rollout_knobs_covered
from sc_lightning.config.knobs import walk_fields
from sc_lightning.config.schema import SCConfig
from tests.helpers.configs import tiny_raw


def tiny(**changes) -> dict:
    """The tests' base config, resolved to plain data, with dotpath ``changes`` applied."""
    plain = config_to_dict(load_config(tiny_raw(), extra_top_level=("trainer", "seed_everything")))
    plain["trainer"] = tiny_raw()["trainer"]
    for dotpath, value in changes.items():
        *parents, leaf = dotpath.split("__")
        node = plain
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return plain


def test_operational_changes_keep_the_fingerprint() -> None:
    base = compatibility_identity(tiny())
    operational = compatibility_identity(
        tiny(
            checkpointing__checkpoint_dir="/elsewhere",
            trainer__default_root_dir="/logs",
            policy__generation__refit_timeout_s=5.0,
            async_rl__drain_timeout_s=30.0,
            async_rl__stall_watchdog__stall_timeout_s=10.0,
            policy__optimizer__lr=1.0,
            grpo__val_period=10,  # validation never touches a training rollout
            grpo__val_batch_size=2,
            grpo__max_val_samples=5,
            data__val_dataset_name="v.jsonl",
        )
    )
    assert fingerprint(base) == fingerprint(operational)


@pytest.mark.parametrize(
    "change",
    [
        {"grpo__num_generations_per_prompt": 16},
        {"policy__generation__temperature": 0.5},
        {"env__name": "math"},
        {"data__max_prompt_length": 99},
        {"custom_algo__beta": 0.1},  # a key nobody declared: fail-closed, it counts
    ],
    ids=lambda c: next(iter(c)),
)
def test_semantic_changes_change_the_fingerprint_and_are_named(change: dict) -> None:
    saved, current = compatibility_identity(tiny()), compatibility_identity(tiny(**change))
    assert fingerprint(saved) != fingerprint(current)
    path = next(iter(change)).replace("__", ".")
    with pytest.raises(FingerprintMismatch, match=rf"(?s)in bundle/x \(1 changed dotpaths\).*{path}: .* -> "):
        check_compatible(saved, current, where="bundle/x")


def test_user_exclusions_with_wildcards_remove_values_and_children() -> None:
    workers = [{"log_dir": "/a", "count": 2}, {"log_dir": "/b", "count": 3}]
    config = tiny(env__agent={"runtime_endpoint": "http://x", "workers": workers})
    moved = tiny(env__agent={"runtime_endpoint": "http://y", "workers": [{**w, "log_dir": "/z"} for w in workers]})
    excluded = ["env.agent.runtime_endpoint", "env.agent.workers.*.log_dir"]
    assert fingerprint(compatibility_identity(config, excluded), excluded) == fingerprint(
        compatibility_identity(moved, excluded), excluded
    )
    assert compatibility_identity(config, excluded)["env"]["agent"] == {"workers": [{"count": 2}, {"count": 3}]}
    # the exclusions themselves are part of the fingerprint: both runs must declare them
    assert fingerprint(compatibility_identity(config, excluded), excluded) != fingerprint(
        compatibility_identity(config, excluded)
    )


def test_credentials_never_reach_an_identity() -> None:
    config = tiny(env__agent={"api_key": "sk-1", "nested": {"auth_token": "t", "db_password": "p"}, "keep": 1})
    identity = compatibility_identity(config)
    assert identity["env"]["agent"] == {"nested": {}, "keep": 1}
    assert "sk-1" not in str(identity)


def test_changes_are_capped_and_long_values_truncated() -> None:
    saved = {f"k{i:02d}": i for i in range(25)} | {"long": "x" * 500}
    current = {f"k{i:02d}": i + 1 for i in range(25)} | {"long": "y" * 500}
    changes = changed_paths(saved, current)
    assert len(changes) == 26 and all(len(line) < 2 * 160 + 20 for line in changes)
    with pytest.raises(FingerprintMismatch, match=r"and 6 more"):
        check_compatible(saved, current, where="snapshot_000001")


segment = st.sampled_from(["a", "b", "c", "0", "1"])
paths = st.lists(segment, max_size=5)


@given(path=paths)
def test_a_literal_pattern_matches_exactly_its_own_path(path: list[str]) -> None:
    assert path_matches(tuple(path), tuple(path))
    assert not path_matches((*path, "a"), tuple(path)) and not path_matches(tuple(path), (*path, "a"))


@given(path=paths.filter(bool), data=st.data())
def test_star_stands_for_exactly_one_segment(path: list[str], data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(path) - 1))
    starred = (*path[:i], "*", *path[i + 1 :])
    assert path_matches(tuple(path), starred)
    assert not path_matches(tuple(path[:i] + path[i + 1 :]), starred)  # one segment fewer: no match


@given(path=paths, data=st.data())
def test_double_star_stands_for_any_number_of_segments(path: list[str], data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(path)))
    j = data.draw(st.integers(i, len(path)))
    pattern = (*path[:i], "**", *path[j:])  # '**' replaces path[i:j], possibly nothing
    assert path_matches(tuple(path), pattern)
    assert path_matches(tuple(path), ("**",))


@given(path=paths, pattern=st.lists(st.sampled_from(["a", "b", "*", "[ab]"]), max_size=5))
def test_without_double_star_a_match_needs_equal_lengths(path: list[str], pattern: list[str]) -> None:
    if path_matches(tuple(path), tuple(pattern)):
        assert len(path) == len(pattern)
        assert all(fnmatch.fnmatchcase(s, p) for s, p in zip(path, pattern, strict=True))


def test_the_knobs_no_exclusion_may_cover_are_knobs_and_the_builtin_exclusions_leave_them_in() -> None:
    """ROLLOUT_KNOBS names real dotpaths and none of the built-in exclusions covers one (the rules refuse a user's
    pattern that covers one: tests/config/rule_cases_runtime.py); a section covers every knob under it."""
    schema = {field.path for field in walk_fields(SCConfig)}
    assert set(ROLLOUT_KNOBS) <= schema
    assert [pattern for pattern in BUILTIN_EXCLUDED_PATHS if rollout_knobs_covered(pattern)] == []
    generation = [knob for knob in ROLLOUT_KNOBS if knob.startswith("policy.generation.")]
    assert rollout_knobs_covered("policy.generation") == generation
