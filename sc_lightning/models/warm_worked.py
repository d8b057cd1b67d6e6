"""The warm start of the worked-arithmetic task: supervised steps on worked solutions, its compute counted in tokens.

A model must write hundreds of lines without a slip before the worked-arithmetic reward (:mod:`sc_lightning.tasks.
worked_arithmetic`) is ever 1, so RL from random weights would see no reward. The warm start trains the model with
cross-entropy on the worked solutions of freshly drawn problems (the task's own long-tailed lengths), in batches of
similar lengths (at most :attr:`WorkedBudget.batch_tokens` padded tokens each), and stops as soon as the reward it
would earn sampling at temperature 1 reaches :attr:`WorkedBudget.target_reward` (deliberately partial: RL must do the
rest), or when it has trained on :attr:`WorkedBudget.max_tokens` padded tokens, whichever comes first. On a GPU the
model computes in bf16 and AdamW steps fp32 master weights (:class:`MasterAdamW`), as the RL trainer does.

The rate follows a cosine from its peak down to a tenth over the budget (:func:`warm_lr_factor`), and gradients are
clipped: the expected reward climbs mostly as the rate comes down (the slips that remain at a high rate are what
keeps it near zero), and a loss spike late in a constant-rate run once undid a warm start. On the CPU (a 3M-parameter
model, problems of 8 to 40 lines, 2.4M tokens at a peak of 1e-3, 2026-12-05) the reward reached 0.82 so, against 0.45
at the constant rate.

That reward needs no sampling (:func:`expected_reward`, one forward pass over held-out problems): a completion earns
at least the share of the solution's lines it writes token for token, each with the separator after it (the space,
or the eos after the last line), before its first deviation (the verifier's credit, :func:`~sc_lightning.tasks.
worked_arithmetic.credit`, only reads the lines between whitespace). The chance that sampling at temperature 1 writes
the first ``j`` lines so is ``exp`` of the summed log-probabilities of their tokens, so the expected share is the mean
of those chances over the ``n`` lines: the expected reward, give or take two differences of opposite sign (the
verifier also counts a right line followed by other whitespace, or by an early end, which adds; and it shares a
completion that runs on past the solution's ``n`` lines over its own lines, which takes away).
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from sc_lightning.models.spec import ModelSpec
from sc_lightning.tasks.worked_arithmetic import WIDTH, WorkedProblem, draw_problems
from sc_lightning.tokenizer import CharTokenizer

log = logging.getLogger(__name__)
LINE_TOKENS = WIDTH + 1
"""Tokens of an answer line with the character tokenizer: its digits and the separator after it (space or eos)."""


@dataclass(frozen=True)
class WorkedBudget:
    """How much a worked-arithmetic warm start may train, and when it has trained enough."""

    max_tokens: int = 24_000_000  # padded tokens trained on, at most: about three minutes of a 300M model on an H100
    batch_tokens: int = 16_384  # padded tokens (rows x the longest row) of one optimizer step
    warmup_steps: int = 10  # steps of a linear learning-rate warm-up from zero
    min_lr_ratio: float = 0.1  # then a cosine decay to this share of the peak rate, over the budget's tokens
    clip_grad: float = 1.0  # the global gradient norm is clipped to this (a loss spike cannot undo the warm start)
    held_out: int = 256  # problems the expected reward is measured on
    target_reward: float = 0.3  # stop once the expected reward at temperature 1 reaches it
    pool: int = 8192  # problems drawn at a time, cut into length batches and shuffled


@dataclass(frozen=True)
class Rows:
    """Token rows of worked problems (``bos``, prompt, solution, ``eos``) and each row's first answer position."""

    ids: list[list[int]]
    answer_start: list[int]


def worked_rows(problems: Sequence[WorkedProblem], tokenizer: CharTokenizer) -> Rows:
    """The rows a warm start trains on: ``<bos>0023-7=6100 9000 2000<eos>``; the answer (solution and eos) is what
    the model learns to write."""
    ids, starts = [], []
    for problem in problems:
        prompt = [tokenizer.bos_token_id, *tokenizer.encode(problem.prompt)]
        ids.append([*prompt, *tokenizer.encode(problem.solution), tokenizer.eos_token_id])
        starts.append(len(prompt))
    return Rows(ids, starts)


def length_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Row indices cut into batches of similar lengths: sorted by length, each batch's rows x its longest row at
    most ``max_tokens`` (a longer row alone)."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        batch = batches[-1] if batches else []
        if not batch or (len(batch) + 1) * lengths[i] > max_tokens:
            batches.append([i])
        else:
            batch.append(i)  # sorted ascending: row i is the batch's longest
    return batches


def padded(rows: Rows, picked: Sequence[int], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``picked`` rows right-padded to the longest, ``(B, T)`` ids, and the ``(B, T)`` mask of answer tokens."""
    width = max(len(rows.ids[i]) for i in picked)
    ids = torch.full((len(picked), width), pad, dtype=torch.long)
    mask = torch.zeros((len(picked), width), dtype=torch.bool)
    for row, i in enumerate(picked):
        ids[row, : len(rows.ids[i])] = torch.tensor(rows.ids[i])
        mask[row, rows.answer_start[i] : len(rows.ids[i])] = True
    return ids.to(device), mask.to(device)


def line_ends(mask: torch.Tensor, rows: Rows, picked: Sequence[int]) -> torch.Tensor:
    """``(B, T)``: the answer positions (``mask``) that end a line, its separator: every :data:`LINE_TOKENS`-th."""
    starts = torch.tensor([rows.answer_start[i] for i in picked], device=mask.device)[:, None]
    offset = torch.arange(mask.size(1), device=mask.device)[None, :] - starts
    return mask & (offset % LINE_TOKENS == LINE_TOKENS - 1)


def expected_reward(model: torch.nn.Module, rows: Rows, pad: int, batch_tokens: int) -> float:
    """Mean over ``rows`` of the share of its lines sampling at temperature 1 would write before its first deviation:
    per row, the mean over its line ends of the probability of every answer token up to there (module docstring)."""
    from sc_lightning.models.logprobs import device_of, token_logprobs

    device, total = device_of(model), 0.0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for picked in length_batches([len(r) for r in rows.ids], batch_tokens):
            ids, mask = padded(rows, picked, pad, device)
            written = torch.exp((token_logprobs(model, ids) * mask).cumsum(-1))  # P(the answer up to each token)
            ends = line_ends(mask, rows, picked)
            total += float(((written * ends).sum(-1) / ends.sum(-1)).sum())  # (B,) -> one number
    model.train(was_training)
    return total / len(rows.ids)


def _shuffled_batches(seed: int, budget: WorkedBudget, tokenizer: CharTokenizer) -> Iterator[tuple[Rows, list[int]]]:
    """Endless training batches: pools of fresh problems, each cut into length batches visited in random order."""
    order = random.Random(f"warm-order:{seed}")
    for pool in itertools.count():
        rows = worked_rows(draw_problems(budget.pool, f"warm-{seed}-{pool}"), tokenizer)
        batches = length_batches([len(r) for r in rows.ids], budget.batch_tokens)
        order.shuffle(batches)
        for picked in batches:
            yield rows, picked


def warm_lr_factor(step: int, budget: WorkedBudget) -> float:
    """The share of the peak rate at optimizer step ``step``: a linear warm-up over ``warmup_steps``, then a cosine
    decay to ``min_lr_ratio`` over the steps the token budget allows at most (``max_tokens / batch_tokens``)."""
    if step < budget.warmup_steps:
        return (step + 1) / budget.warmup_steps
    decay_steps = max(1, budget.max_tokens // budget.batch_tokens - budget.warmup_steps)
    progress = min(1.0, (step - budget.warmup_steps) / decay_steps)
    return budget.min_lr_ratio + (1.0 - budget.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class MasterAdamW:
    """AdamW on fp32 master copies of a model's parameters (bf16 ones on a GPU), written back after every step."""

    def __init__(self, model: torch.nn.Module, lr: float, budget: WorkedBudget) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.masters = [p.detach().float().clone() for p in self.params]
        self.clip_grad = budget.clip_grad
        self.optimizer = torch.optim.AdamW(self.masters, lr=lr)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: warm_lr_factor(step, budget))

    def step(self) -> None:
        """One AdamW step on the masters from the parameters' gradients (then cleared, their global norm clipped),
        copied into the parameters."""
        for master, param in zip(self.masters, self.params, strict=True):
            master.grad = None if param.grad is None else param.grad.float()  # AdamW skips a master without one
            param.grad = None
        torch.nn.utils.clip_grad_norm_(self.masters, self.clip_grad)
        self.optimizer.step()
        self.schedule.step()
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.masters)


def train_worked(
    model: torch.nn.Module, spec: ModelSpec, *, lr: float, seed: int, check_every: int, budget: WorkedBudget
) -> float:
    """Train ``model`` on worked solutions until its expected reward reaches the target or the token budget is
    spent; returns the last expected reward measured (logged with the tokens and time so far at every check)."""
    from sc_lightning.models.logprobs import device_of, token_logprobs

    tokenizer, device, pad = CharTokenizer(), device_of(model), CharTokenizer.PAD
    held_out = worked_rows(draw_problems(budget.held_out, f"held-out-{seed}"), tokenizer)
    optimizer = MasterAdamW(model, lr, budget)
    tokens, reward, start = 0, 0.0, time.perf_counter()
    model.train()
    for step, (rows, picked) in enumerate(_shuffled_batches(seed, budget, tokenizer)):
        ids, mask = padded(rows, picked, pad, device)
        loss = -(token_logprobs(model, ids, vocab_size=spec.vocab_size) * mask).sum() / mask.sum()
        loss.backward()
        optimizer.step()
        tokens += ids.numel()
        spent = tokens >= budget.max_tokens
        if (step + 1) % check_every == 0 or spent:
            reward = expected_reward(model, held_out, pad, budget.batch_tokens)
            log.info(
                "worked warm start: step %d, %.2fM tokens, loss %.4f, expected reward %.3f, %.0f s",
                step + 1,
                tokens / 1e6,
                loss.item(),
                reward,
                time.perf_counter() - start,
            )
            if reward >= budget.target_reward or spent:
                break
    if reward < budget.target_reward:
        log.warning(
            "worked warm start: the token budget (%d) ran out at expected reward %.3f, below the target %.2f",
            budget.max_tokens,
            reward,
            budget.target_reward,
        )
    return reward


def warm_start_worked(
    path: Path,
    spec: ModelSpec,
    *,
    lr: float,
    seed: int,
    check_every: int,
    device: str | torch.device = "cpu",
    budget: WorkedBudget = WorkedBudget(),
) -> float:
    """Build ``spec``'s model on ``device``, train it (:func:`train_worked`) and save it as an HF directory at
    ``path``; returns its expected reward."""
    from sc_lightning.models import build_gpt_model  # megatron-core, only when a model is built
    from sc_lightning.models.convert import export_hf_weights
    from sc_lightning.models.hf_dir import save_hf_directory

    precision = "bf16" if torch.device(device).type == "cuda" else "fp32"  # bf16 compute, fp32 masters on a GPU
    model = build_gpt_model(spec, precision=precision, seed=seed, device=device)
    reward = train_worked(model, spec, lr=lr, seed=seed, check_every=check_every, budget=budget)
    save_hf_directory(spec, export_hf_weights(model, spec), path)
    return reward
