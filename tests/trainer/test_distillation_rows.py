"""A distillation group's teacher fields go through the real row writer, the in-process data plane (and its
snapshot, which is how they survive a restart) and load_chunk into the opd advantages, and one policy step logs each
teacher's KL, reward and routed rows; the full-vocabulary rows train with the reverse-KL term."""

from __future__ import annotations

import pytest
import torch

from sc_lightning.controller.api import GroupMeta
from sc_lightning.controller.rows import group_to_columns
from sc_lightning.data_plane.memory import MemoryDataPlane
from sc_lightning.tokenizer import CharTokenizer
from sc_lightning.trainer.chunks import Distillation, load_chunk
from sc_lightning.types import Generation, Prompt, ScoredGroup, TeacherScores
from tests.helpers.train_rows import fresh, run_step

TOK = CharTokenizer()
VOCAB = 18


def scored(index: int, alias: str, teacher_index: int, *, full_vocabulary: bool = False) -> ScoredGroup:
    """A group of two completions of ``"a+b="`` with made-up engine logprobs, scored by teacher ``alias``: its
    logprob of each completion token is the engine's minus ``0.1 x (t + 1)`` (or, with ``full_vocabulary``, a
    seeded distribution over the whole vocabulary), 0 on the prompt."""
    prompt = Prompt(f"p{index}", (TOK.BOS, *TOK.encode(f"{index}+1=")), f"{index}+1=", answer=str(index + 1))
    generations = (
        Generation((*TOK.encode(str(index + 1)), TOK.EOS), (-0.4, -0.3), "stop", 0),
        Generation((*TOK.encode("77"), TOK.EOS), (-2.0, -1.0, -0.5), "stop", 0),
    )
    rows = []
    for g in generations:
        before = len(prompt.token_ids)
        if full_vocabulary:
            logits = torch.randn(before + len(g.token_ids), VOCAB, generator=torch.Generator().manual_seed(index))
            row = torch.log_softmax(logits, -1)
            row[:before] = 0.0
        else:
            row = torch.tensor([0.0] * before + [lp - 0.1 * (t + 1) for t, lp in enumerate(g.logprobs)])
        rows.append(row)
    return ScoredGroup(prompt, generations, (1.0, 0.0), teacher=TeacherScores(alias, teacher_index, tuple(rows)))


def stored(groups: list[ScoredGroup], tmp_path) -> tuple[MemoryDataPlane, list[GroupMeta]]:
    """``groups`` written by the row writer, saved as a snapshot and loaded into a fresh data plane."""
    plane, metas = MemoryDataPlane(), []
    for index, group in enumerate(groups):
        keys, columns, tags = group_to_columns(f"g{index}", group, start_weight=0, end_weight=0)
        plane.put(keys, columns, tags)
        lengths = tuple(len(group.prompt.token_ids) + len(g.token_ids) for g in group.generations)
        metas.append(GroupMeta(f"g{index}", group.prompt.prompt_id, tuple(keys), lengths, 0, 0, None))
    plane.save(tmp_path / "snapshot")
    restored = MemoryDataPlane()
    restored.load(tmp_path / "snapshot")
    return restored, metas


def chunk_of(plane: MemoryDataPlane, metas: list[GroupMeta], distillation: Distillation):
    """The rows of ``metas`` as the trainer loads them."""
    return load_chunk(
        plane,
        metas,
        pad_token_id=TOK.pad_token_id,
        overlong_filtering=False,
        leave_one_out=False,
        normalize_rewards=False,
        distillation=distillation,
    )


def test_teacher_logprobs_survive_a_snapshot_and_become_the_advantages(tmp_path) -> None:
    plane, metas = stored([scored(1, "add", 0), scored(2, "mul", 1)], tmp_path)
    assert [tag["teacher"] for tag in plane.tags([key for meta in metas for key in meta.keys])] == [
        "add",
        "add",
        "mul",
        "mul",
    ]
    chunk = chunk_of(plane, metas, Distillation(reward_weight=0.0, full_vocabulary=False))
    assert chunk.teacher_ids.tolist() == [0, 0, 1, 1]
    mask = chunk.token_mask.bool()
    # by construction teacher - gen = -0.1 x (t + 1) on the t-th completion token, 0 on the prompt and padding
    expected = torch.zeros_like(chunk.advantages)
    for row in range(4):
        positions = mask[row].nonzero().flatten()
        expected[row, positions] = -0.1 * torch.arange(1, len(positions) + 1, dtype=torch.float32)
    torch.testing.assert_close(chunk.advantages, expected)

    mixed = chunk_of(plane, metas, Distillation(reward_weight=0.5, full_vocabulary=False))
    # GRPO without normalisation: rewards (1, 0) around their mean 0.5 -> +-0.5, times the weight 0.5
    reward_part = torch.tensor([0.25, -0.25, 0.25, -0.25]).unsqueeze(-1) * mask
    torch.testing.assert_close(mixed.advantages, expected + reward_part)


def test_a_step_logs_each_teachers_kl_reward_and_rows(tmp_path) -> None:
    plane, metas = stored([scored(1, "add", 0), scored(2, "mul", 1), scored(3, "mul", 1)], tmp_path)
    chunk = chunk_of(plane, metas, Distillation(reward_weight=0.0, full_vocabulary=False))
    metrics = run_step(fresh(), [chunk], micro_batch_size=4, teachers=("add", "mul"))
    # log pi_gen - log pi_teacher = 0.1 x (t + 1): tokens (0.1, 0.2) and (0.1, 0.2, 0.3) per group, mean 0.18
    assert metrics["teacher_kl/add"] == pytest.approx(0.18)
    assert metrics["teacher_kl/mul"] == pytest.approx(0.18)
    assert (metrics["teacher_rows/add"], metrics["teacher_rows/mul"]) == (2.0, 4.0)
    assert metrics["teacher_reward/add"] == metrics["teacher_reward/mul"] == pytest.approx(0.5)
    assert not any(name.startswith("teacher_tokens/") for name in metrics)


def test_full_vocabulary_rows_train_with_the_exact_reverse_kl(tmp_path) -> None:
    plane, metas = stored([scored(1, "add", 0, full_vocabulary=True)], tmp_path)
    chunk = chunk_of(plane, metas, Distillation(reward_weight=0.0, full_vocabulary=True))
    assert chunk.teacher_vocab_logprobs.shape == (*chunk.input_ids.shape, VOCAB)
    assert (chunk.advantages == 0).all()  # reward_weight 0: the teacher's part is the loss term
    sampled = chunk.teacher_vocab_logprobs.gather(-1, chunk.input_ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(chunk.teacher_logprobs, sampled * chunk.token_mask)

    model = fresh()
    metrics = run_step(model, [chunk], micro_batch_size=2, teachers=("add",))
    # the logged term is the exact KL of the policy before the step, recomputed here by hand from its logits
    with torch.no_grad():
        logits = fresh()(chunk.input_ids, None, None)[..., :VOCAB]
    student = torch.nn.functional.pad(torch.log_softmax(logits, -1)[:, :-1], (0, 0, 1, 0))
    mask = chunk.token_mask.bool()
    kl = (student.exp() * (student - chunk.teacher_vocab_logprobs)).sum(-1)[mask]
    assert metrics["full_vocabulary_kl"] == pytest.approx(float(kl.mean()), rel=1e-4)
    assert metrics["grad_norm"] > 0  # with advantages all 0, only the KL term moved the policy
