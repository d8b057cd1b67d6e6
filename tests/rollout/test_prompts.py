"""PromptStream: fixed-size batches, drop-last, epochs, deterministic shuffling and exact resume; the dataset checked
against the run's steps."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sc_lightning.config import SCConfig, load_config
from sc_lightning.config.resume_rules import ResumeMismatch
from sc_lightning.rollout.dataset_base import DatasetError
from sc_lightning.rollout.datasets import ArithmeticDataset
from sc_lightning.rollout.prompts import PromptStream, check_dataset_fits_steps
from sc_lightning.tokenizer import CharTokenizer
from tests.helpers.configs import variant

DATASET = ArithmeticDataset(10, seed=1, tokenizer=CharTokenizer())


def ids(batches: list[list]) -> list[list[str]]:
    return [[p.prompt_id for p in batch] for batch in batches]


def test_batches_are_full_and_drop_the_partial_one() -> None:
    stream = PromptStream(DATASET, 3, shuffle=False, seed=0, max_epochs=2)
    assert len(stream) == 3
    batches = ids(list(stream))
    assert len(batches) == 6
    assert all(len(b) == 3 for b in batches)
    first_epoch = [f"arithmetic-{i:06d}" for i in range(9)]
    assert sum(batches[:3], []) == first_epoch == sum(batches[3:], [])
    assert stream.exhausted and stream.epoch == 2 and stream.position == 0
    assert list(stream) == []


def test_epoch_and_position_name_the_next_batch() -> None:
    stream = PromptStream(DATASET, 4, shuffle=True, seed=0, max_epochs=3)
    seen = []
    for _ in stream:
        seen.append((stream.epoch, stream.position, stream.batches_yielded))
    assert seen == [(0, 1, 1), (1, 0, 2), (1, 1, 3), (2, 0, 4), (2, 1, 5), (3, 0, 6)]


def test_shuffle_is_deterministic_per_seed_and_differs_per_epoch() -> None:
    def run(seed: int) -> list[list[str]]:
        return ids(list(PromptStream(DATASET, 5, shuffle=True, seed=seed, max_epochs=4)))

    a, b, c = run(11), run(11), run(12)
    assert a == b
    assert a != c
    epochs = [a[i] + a[i + 1] for i in range(0, 8, 2)]
    assert all(sorted(e) == sorted(p.prompt_id for p in DATASET) for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1


def test_invalid_settings() -> None:
    with pytest.raises(ValueError, match="fewer than one batch"):
        PromptStream(DATASET, 11, shuffle=False, seed=0, max_epochs=1)
    with pytest.raises(ValueError, match="batch_size"):
        PromptStream(DATASET, 0, shuffle=False, seed=0, max_epochs=1)
    with pytest.raises(ValueError, match="max_epochs"):
        PromptStream(DATASET, 1, shuffle=False, seed=0, max_epochs=0)


@settings(max_examples=50, deadline=None)
@given(
    batch_size=st.integers(1, 10),
    max_epochs=st.integers(1, 4),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_resume_from_state_dict_equals_an_uninterrupted_run(
    batch_size: int, max_epochs: int, shuffle: bool, seed: int, data: st.DataObject
) -> None:
    def make() -> PromptStream:
        return PromptStream(DATASET, batch_size, shuffle=shuffle, seed=seed, max_epochs=max_epochs)

    full = ids(list(make()))
    cut = data.draw(st.integers(0, len(full)), label="interrupt after batch")
    first = make()
    head = ids([next(first) for _ in range(cut)])
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint file
    resumed = make()
    resumed.load_state_dict(state)
    assert head + ids(list(resumed)) == full


def test_load_state_dict_rejects_other_settings() -> None:
    state = PromptStream(DATASET, 2, shuffle=True, seed=5, max_epochs=1).state_dict()
    other = PromptStream(DATASET, 3, shuffle=True, seed=6, max_epochs=1)
    with pytest.raises(ResumeMismatch, match=r"\{algo\}.seed is 6 but the checkpoint's prompt stream has 5; "):
        other.load_state_dict(state)
    with pytest.raises(ResumeMismatch, match=r"\{algo\}.num_prompts_per_step is 3 but the checkpoint's .* has 2"):
        other.load_state_dict(state)
    with pytest.raises(ResumeMismatch, match="format version None"):
        other.load_state_dict({})


def run_config(num_prompts_per_step: int, max_num_steps: int = 100) -> SCConfig:
    """The tests' tiny config with ``num_prompts_per_step`` prompt groups a step."""
    raw = variant({"grpo": {"num_prompts_per_step": num_prompts_per_step, "max_num_steps": max_num_steps}})
    return load_config(raw, extra_top_level=("trainer",))


def test_a_dataset_smaller_than_one_step_is_a_dataset_error_naming_the_knob_and_the_fix() -> None:
    with pytest.raises(DatasetError) as raised:
        check_dataset_fits_steps(run_config(8), 5)
    assert str(raised.value) == (
        "the dataset 'arithmetic' (data.dataset_name) holds 5 prompts, fewer than one RL step takes "
        "(grpo.num_prompts_per_step=8); set grpo.num_prompts_per_step to at most 5, or use 8 or more prompts"
    )


def test_the_prompts_an_epoch_leaves_out_are_announced(caplog) -> None:
    """10 prompts at 4 a step: each epoch trains 8 and leaves 2 out, said once before the run starts; said nothing
    when the dataset divides evenly or the run ends before an epoch does."""
    with caplog.at_level("WARNING", logger="sc_lightning.rollout.prompts"):
        check_dataset_fits_steps(run_config(4), 10)
        check_dataset_fits_steps(run_config(5), 10)
        check_dataset_fits_steps(run_config(4, max_num_steps=1), 10)
    assert [r.getMessage() for r in caplog.records] == [
        "each epoch of the dataset 'arithmetic' trains 8 of its 10 prompts: 2 steps of grpo.num_prompts_per_step=4, "
        "and the last 2 prompts of the epoch's order are not trained in that epoch (a different 2 each epoch with "
        "data.shuffle); make the dataset size a multiple of grpo.num_prompts_per_step to train every prompt every epoch"
    ]
