"""The warm start of the tiny vision-language policy on the built-in CLEVR: supervised steps on its answers.

A seeded random ``builtin:tiny-vlm`` almost never answers a CLEVR question (:mod:`sc_lightning.tasks.clevr`) with
the right digit, so GRPO would see nearly all-zero rewards. The warm start trains the whole model (vision tower,
projector, language model) with cross-entropy on the answers of freshly drawn questions, each prompt laid out as the
``clevr`` dataset lays it out (bos, the scene's ``tokens_per_image`` ``<image>`` ids, the coded question) and followed
by the answer digit and eos, and stops once the reward it would earn sampling held-out questions reaches the
recipe's target (deliberately partial: RL must do the rest). Its logprobs are the trainer's:
``logprobs_from_logits(vlm_logits(model, ids, images), ids)``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from sc_lightning.models.spec import ModelSpec
from sc_lightning.tasks import clevr
from sc_lightning.tokenizer import CharImageTokenizer


def clevr_examples(
    spec: ModelSpec, count: int, seed: int | str, kinds: tuple[str, ...] = clevr.DEFAULT_KINDS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``count`` CLEVR questions of ``kinds`` drawn from ``seed`` with their answers: right-padded token ids
    ``(B, T)``, the mask of the model's tokens (the answer digit and eos), and the scenes ``(B, H, W, 3)`` uint8."""
    vision = spec.vision
    if vision is None or vision.image_size != clevr.IMAGE_SIZE:
        raise ValueError(f"the CLEVR warm start needs a vision-language spec of {clevr.IMAGE_SIZE}-pixel images")
    tokenizer = CharImageTokenizer()
    prompt_start = [tokenizer.bos_token_id, *[vision.image_token_id] * vision.tokens_per_image]
    rows, masks, scenes = [], [], []
    for question in clevr.draw_questions(count, seed, kinds):
        prompt = prompt_start + tokenizer.encode(question.text)
        answer = [*tokenizer.encode(question.answer), tokenizer.eos_token_id]
        rows.append(prompt + answer)
        masks.append([False] * len(prompt) + [True] * len(answer))
        scenes.append(torch.from_numpy(clevr.render(question.objects)))
    width = max(len(row) for row in rows)
    ids = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows])
    mask = torch.tensor([m + [False] * (width - len(m)) for m in masks])
    return ids, mask, torch.stack(scenes)


def expected_clevr_reward(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, scenes: torch.Tensor) -> float:
    """The reward sampling at temperature 1 would earn on these questions, at least: the mean probability that the
    model writes the answer digit and then eos (``mask``'s tokens); one forward pass, no sampling."""
    from sc_lightning.models.logprobs import logprobs_from_logits
    from sc_lightning.models.vlm import vlm_logits

    with torch.no_grad():
        logprobs = logprobs_from_logits(vlm_logits(model, ids, list(scenes[:, None])), ids).cpu()  # (B, T)
    return float((logprobs * mask).sum(-1).exp().mean())


def clevr_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    examples: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    step: int,
    batch_size: int,
) -> float:
    """One supervised step: cross-entropy on the answer tokens of ``batch_size`` of ``examples`` (ids, mask, scenes
    as :func:`clevr_examples` gives them) picked with seed ``step``; returns the loss."""
    from sc_lightning.models.logprobs import device_of, logprobs_from_logits
    from sc_lightning.models.vlm import vlm_logits

    ids, mask, scenes = examples
    pick = torch.randint(0, len(ids), (batch_size,), generator=torch.Generator().manual_seed(step))
    batch, answer = ids[pick].to(device_of(model)), mask[pick].to(device_of(model))
    logprobs = logprobs_from_logits(vlm_logits(model, batch, list(scenes[pick, None])), batch)  # (B, T)
    loss = -(logprobs * answer).sum() / answer.sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def warm_start_clevr(
    path: Path,
    spec: ModelSpec,
    *,
    lr: float,
    seed: int,
    check_every: int,
    target_reward: float,
    max_steps: int = 2000,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
) -> float:
    """Train the ``spec`` VLM on CLEVR answers until the reward it would earn sampling held-out questions
    (:func:`expected_clevr_reward`) reaches ``target_reward`` (or ``max_steps``), save it as a model directory at
    ``path`` (:func:`~sc_lightning.models.hf_dir.save_hf_directory`) and return that reward."""
    from sc_lightning.models.convert import export_hf_weights
    from sc_lightning.models.hf_dir import save_hf_directory
    from sc_lightning.models.vlm import build_vlm

    model = build_vlm(spec, precision="fp32", seed=seed, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    examples = clevr_examples(spec, 1024, f"warm-{seed}")
    held_out = clevr_examples(spec, 256, f"warm-held-out-{seed}")
    reward = 0.0
    for step in range(max_steps):
        clevr_step(model, optimizer, examples, step, batch_size)
        if step % check_every == 0:
            reward = expected_clevr_reward(model.eval(), *held_out)
            model.train()
            if reward >= target_reward:
                break
    save_hf_directory(spec, export_hf_weights(model, spec), path)
    return reward
