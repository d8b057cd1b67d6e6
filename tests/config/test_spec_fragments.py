"""Every YAML fragment printed in the spec, merged onto the tiny config, validates and means what the spec says."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from sc_lightning.cli.load import LIGHTNING_KEYS
from sc_lightning.config import config_to_dict, load_config
from tests.config.helpers import PPO_COMPANION, errors_of
from tests.helpers.configs import REPO, variant

FRAGMENTS_FILE = REPO / "tests" / "data" / "spec_fragments.yaml"
SPEC = REPO.parent / "shared" / "spec" / "single-controller.md"
DOCUMENTS = list(yaml.safe_load_all(FRAGMENTS_FILE.read_text()))
MAPPINGS = [d for d in DOCUMENTS if "equations" not in d]


def leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a nested mapping, by dotpath."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(leaves(value, f"{prefix}.{key}" if prefix else key))
        return out
    return {prefix: data}


@pytest.mark.parametrize("fragment", MAPPINGS, ids=[",".join(m) for m in MAPPINGS])
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_fragment_validates_and_keeps_its_meaning(fragment: dict, algorithm: str) -> None:
    layers = [PPO_COMPANION] if algorithm == "ppo" else []
    raw = variant(*layers, fragment)
    assert errors_of(raw) == []
    resolved = leaves(config_to_dict(load_config(raw, extra_top_level=LIGHTNING_KEYS)))
    for path, value in leaves(fragment).items():
        expected = [] if value == [] else value
        assert resolved[path] == expected, f"{path}: spec says {value!r}, config holds {resolved[path]!r}"


def test_transcription_matches_the_spec_when_it_is_at_hand() -> None:
    """The fragments file is a transcription; where the spec sits beside the repo, every fenced block is in it."""
    if not SPEC.exists():  # a clean clone in CI has only the transcription
        assert len(DOCUMENTS) == 8
        return
    text = SPEC.read_text()
    fenced = [block for i, block in enumerate(text.split("```\n")) if i % 2 == 1]
    parsed = [yaml.safe_load(block) for block in fenced]
    for block in parsed:
        if isinstance(block, dict):
            assert block in MAPPINGS


def test_batch_equations() -> None:
    """``N * G == policy.train_global_batch_size`` and, on PPO, ``== value.train_global_batch_size``."""
    (equations,) = [d["equations"] for d in DOCUMENTS if "equations" in d]
    assert "policy.train_global_batch_size" in equations and "value.train_global_batch_size" in equations
    ppo = variant(PPO_COMPANION, {"ppo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 8}})
    ppo["async_rl"].update(max_buffered_rollouts=2, min_groups_for_streaming_train=2, max_inflight_prompts=2)
    assert errors_of(ppo) == []  # 2 x 8 = 16 = both batch sizes
    for model in ("policy", "value"):
        broken = variant({model: {"train_global_batch_size": 12}}, base=ppo)
        assert any(e.startswith(f"{model}.train_global_batch_size: is 12") for e in errors_of(broken))


BEHAVIOR_MAP = [
    # (mode, sampler knobs, min_groups, required max_buffered_rollouts for N = 4) — the spec's Config → behavior map
    ("sync", {"name": "in_order", "max_lookahead_versions": 0}, 4, 4),
    ("async exact batch", {"name": "in_order", "max_lookahead_versions": 1}, 2, 8),
    ("streaming gated", {"name": "weight_fifo", "max_staleness_versions": 1}, 2, 8),
    ("streaming ready-first", {"name": "ready_first", "max_staleness_versions": 1}, 2, 8),
    ("streaming over-sampled", {"name": "windowed", "max_staleness_versions": 1}, 2, None),
]


@pytest.mark.parametrize(("mode", "knobs", "min_groups", "capacity"), BEHAVIOR_MAP, ids=[r[0] for r in BEHAVIOR_MAP])
def test_behavior_map_rows(mode: str, knobs: dict, min_groups: int, capacity: int | None) -> None:
    def row(buffered: int) -> dict[str, Any]:
        return variant(
            {"policy": {"generation": {"colocated": {"enabled": False}}}},
            {
                "async_rl": {
                    "sampler": knobs,
                    "min_groups_for_streaming_train": min_groups,
                    "max_buffered_rollouts": buffered,
                    "max_inflight_prompts": buffered,
                }
            },
        )

    if capacity is None:  # windowed: "larger than the gated capacity", dispatch is ungated
        assert errors_of(row(16)) == []
        return
    assert errors_of(row(capacity)) == []
    assert any(e.startswith("async_rl.max_buffered_rollouts") for e in errors_of(row(capacity - 1)))
