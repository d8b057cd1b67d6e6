"""Rows of one prompt prefill it once: the others copy its K/V (the engine's batch, and the plan it follows)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sc_lightning.engines.megatron.decode_sampling import noise_stream
from sc_lightning.engines.megatron.prompt_copies import prompt_copies
from sc_lightning.models import load_policy, token_logprobs
from sc_lightning.types import SamplingParams
from tests.engines.helpers import batch_on, follows_argmax, request

pytestmark = [
    pytest.mark.usefixtures("model_parallel"),
    pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning"),
]


def test_a_waiting_row_copies_a_written_prompt_and_a_fresh_sibling_of_a_prefilling_row_waits() -> None:
    a, b, c = ("a", 9), ("b", 4), ("c", 0)  # (key, positions to share); c: a one-token prompt, nothing to share
    prompts = [a, a, b, b, a, None, c, b]
    cached = [9, 0, 2, 0, 0, 0, 0, 0]  # row 0 wrote a; row 2 is prefilling b; row 5's prompt has images
    copies, prefill = prompt_copies(prompts, cached, [1, 2, 3, 4, 5, 6, 7])
    assert copies == [(0, 1, 9), (0, 4, 9)]  # a's waiting rows copy it from row 0
    assert prefill == [1, 2, 4, 5, 6]  # b's fresh rows 3 and 7 wait for row 2's prefill; the rest go on


rows_st = st.lists(
    st.tuples(st.one_of(st.none(), st.sampled_from([("p", 3), ("q", 5), ("r", 0)])), st.integers(0, 7)),
    min_size=1,
    max_size=20,
)


@given(rows_st, st.data())
def test_every_copy_comes_from_a_row_holding_the_positions_and_each_prompt_prefills_once(rows, data) -> None:
    prompts, cached = [p for p, _ in rows], [c for _, c in rows]
    waiting = sorted(data.draw(st.sets(st.integers(0, len(rows) - 1))))
    copies, prefill = prompt_copies(prompts, cached, waiting)
    for source, target, positions in copies:
        assert prompts[source] == prompts[target] and positions == prompts[target][1] > 0
        assert cached[source] >= positions and cached[target] == 0 and target in waiting and target in prefill
    assert prefill == [row for row in waiting if row in set(prefill)]  # waiting's order
    copied = {target for _, target, _ in copies}
    fresh = [p[0] for row in prefill if (p := prompts[row]) and p[1] > 0 and cached[row] == 0 and row not in copied]
    started = {p[0] for row in waiting if (p := prompts[row]) is not None and 0 < cached[row] < p[1]}
    # a fresh row never computes a prompt another row computes: one prefills it, the others copy it or wait
    assert len(fresh) == len(set(fresh)) and not set(fresh) & started
    left_out = [row for row in waiting if row not in prefill]
    assert all(prompts[row] is not None and cached[row] == 0 for row in left_out)


def test_a_prompt_groups_rows_prefill_it_once_and_sample_as_the_trainer_scores() -> None:
    """Four completions of a 30-token prompt beside another prompt: one row prefills it, three copy it right after and
    decode in the same step, and every token of every row is the model's (greedy: its argmax; sampled: the trainer's
    logprob)."""
    model, cpu = load_policy("builtin:tiny")[0].eval(), torch.device("cpu")
    batch = batch_on(model, prefill_tokens=64, buckets=False)
    prompt, other = tuple(3 + i % 13 for i in range(30)), (5, 6, 7)
    group = [request(prompt, SamplingParams(12, temperature=0.0))]
    for seed in range(3):
        sampling = SamplingParams(12, temperature=0.9, seed=seed)
        group.append(dataclasses.replace(request(prompt, sampling), noise=noise_stream(sampling, None, cpu, 18)))
    for row in [*group, request(other)]:
        batch.add(row)
    with torch.inference_mode():
        batch.step(0)
        # one of the group prefilled (29 positions), three copied them, and all four decoded (the 30th), the other
        # prompt too: one prefill forward, every row's first token
        assert [row.cached for row in batch.rows] == [30, 30, 30, 30, 3]
        assert batch.copied_positions == 3 * 29 and batch.prefill_calls == 1  # copied, not prefilled
        assert [len(row.tokens) for row in group] == [1, 1, 1, 1]
        while batch.rows:
            batch.step(0)
    assert all(follows_argmax(model, prompt, tuple(group[0].tokens))) and len(group[0].tokens) == 12
    for sampled in group[1:]:
        with torch.no_grad():
            trainer = token_logprobs(model, torch.tensor([prompt + tuple(sampled.tokens)]), temperature=0.9)
        assert torch.allclose(trainer[0, len(prompt) :], torch.tensor(sampled.logprobs), atol=1e-5)
