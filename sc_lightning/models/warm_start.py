"""A short supervised warm start for the arithmetic examples, so RL has a reward signal from step one.

A random policy almost never answers "a+b=" correctly, so GRPO would see all-zero rewards. The warm start trains a
built-in model with cross-entropy on a few hundred worked examples until its greedy accuracy reaches
``target_accuracy`` (deliberately partial: RL must do the rest), then writes a Hugging Face directory that
``policy.model_name`` can point at. :data:`WARM_STARTS` names them: ``builtin:tiny-arith`` (the 85k-parameter CPU
example) and ``builtin:small-arith`` (142M parameters, the one-GPU example); :func:`resolve_model_name` builds one on
first use (seconds on a CPU, or on a GPU for the small one) and caches it.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from sc_lightning.models import build_gpt_model, builtin_spec, export_hf_weights, token_logprobs
from sc_lightning.models.hf_dir import save_hf_directory
from sc_lightning.tokenizer import CharTokenizer


@dataclass(frozen=True)
class WarmRecipe:
    """How one warm-started model is made: the built-in architecture it trains and its optimizer settings."""

    base: str  # a BUILTIN_SPECS name
    lr: float  # AdamW learning rate: the 142M model needs ten times less than the 85k one
    check_every: int  # steps between greedy-accuracy checks: a large model passes the target in a few steps, so
    # it is checked every step (a coarser check overshoots the target by a varying amount, and the RL start with it)


WARM_STARTS: dict[str, WarmRecipe] = {
    "builtin:tiny-arith": WarmRecipe("builtin:tiny", lr=3e-3, check_every=25),
    "builtin:small-arith": WarmRecipe("builtin:small", lr=3e-4, check_every=1),
}
DEFAULT_CACHE = Path("results") / ".cache"
log = logging.getLogger(__name__)


def resolve_model_name(
    model_name: str, *, seed: int, cache_dir: Path = DEFAULT_CACHE, device: str | torch.device = "cpu"
) -> str:
    """A :data:`WARM_STARTS` name (``builtin:tiny-arith``) → its cached warm-start directory (built on ``device`` when
    missing); other names unchanged."""
    recipe = WARM_STARTS.get(model_name)
    if recipe is None:
        return model_name
    path = cache_dir / f"{model_name.removeprefix('builtin:')}-seed{seed}-{_recipe_digest(recipe)}"
    if not (path / "config.json").exists():
        log.info("building the warm-started %s policy in %s (once)", recipe.base, path)
        warm_start(path, seed=seed, device=device, recipe=recipe)
    return str(path)


def _recipe_digest(recipe: WarmRecipe) -> str:
    """A short digest of the recipe, its architecture and the warm-start code, so a changed recipe never reuses a
    stale cache."""
    text = repr(recipe) + repr(builtin_spec(recipe.base)) + Path(__file__).read_text()
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def _examples(tokenizer: CharTokenizer, count: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for a, b in torch.randint(0, 10, (count, 2), generator=g, device="cpu").tolist():
        text = [tokenizer.bos_token_id, *tokenizer.encode(f"{a}+{b}={a + b}"), tokenizer.eos_token_id]
        rows.append(text + [tokenizer.pad_token_id] * (8 - len(text)))
    return torch.tensor(rows, device="cpu")  # (count, 8): bos a + b = answer eos, right-padded


def greedy_accuracy(model: torch.nn.Module, batch: torch.Tensor, vocab_size: int) -> float:
    """Fraction of rows whose answer tokens (after '=') are all the model's greedy choices."""
    with torch.no_grad():
        logits = model(batch, None, None)[..., :vocab_size]  # (B, T, V): logits[t] predicts token t+1
    predicted = logits.argmax(-1)[:, 4:-1]  # predictions for positions 5..T-1 (the answer and eos)
    target = batch[:, 5:]
    answer = target != 0
    return float(((predicted == target) | ~answer).all(-1).float().mean())


def warm_start(
    path: Path,
    *,
    seed: int,
    target_accuracy: float = 0.4,
    max_steps: int = 2000,
    device: str | torch.device = "cpu",
    recipe: WarmRecipe = WARM_STARTS["builtin:tiny-arith"],
) -> float:
    """Train ``recipe``'s model on ``device`` until greedy accuracy reaches ``target_accuracy``; save it as an HF dir
    at ``path``. A GPU run warms up on its GPU: building a model on the CPU would patch megatron for the CPU in a
    process whose models live on CUDA."""
    tokenizer, spec = CharTokenizer(), builtin_spec(recipe.base)
    model = build_gpt_model(spec, precision="fp32", seed=seed, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr)
    data, held_out = _examples(tokenizer, 512, seed).to(device), _examples(tokenizer, 256, seed + 1).to(device)
    accuracy = 0.0
    for step in range(max_steps):
        pick = torch.randint(0, len(data), (64,), generator=torch.Generator().manual_seed(step), device="cpu")
        batch = data[pick.to(data.device)]
        logprobs = token_logprobs(model, batch, vocab_size=spec.vocab_size)  # (B, T)
        answer_mask = (batch != tokenizer.pad_token_id) & (torch.arange(batch.shape[1], device=batch.device) >= 5)
        loss = -(logprobs * answer_mask).sum() / answer_mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % recipe.check_every == 0:
            accuracy = greedy_accuracy(model.eval(), held_out, spec.vocab_size)
            model.train()
            if accuracy >= target_accuracy:
                break
    save_hf_directory(spec, export_hf_weights(model, spec), path)
    return accuracy
