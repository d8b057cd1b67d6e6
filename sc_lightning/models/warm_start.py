"""A short supervised warm start for the arithmetic examples, so RL has a reward signal from step one.

A random policy almost never answers "a+b=" correctly, so GRPO would see all-zero rewards. The warm start trains a
built-in model with cross-entropy on a few hundred worked examples until its greedy accuracy reaches
``target_accuracy`` (deliberately partial: RL must do the rest), then writes a Hugging Face directory that
``policy.model_name`` can point at. :data:`WARM_STARTS` names them: ``builtin:tiny-arith`` (the 85k-parameter CPU
example), ``builtin:small-arith`` (142M parameters, the one-GPU example), ``builtin:tiny-calc`` (the tiny model on
the multi-turn calculator conversations of docs/multiturn.md), the distillation example's teachers and student
(``builtin:tiny-add-teacher``, ``builtin:tiny-mul-teacher``, ``builtin:tiny-mixed``: docs/distillation.md), the
vision-language ``builtin:tiny-vlm-clevr`` (``builtin:tiny-vlm`` on the built-in CLEVR, :mod:`~sc_lightning.models.
warm_vlm`: docs/vlm.md) and ``builtin:medium-worked`` (312M parameters on the
long worked-arithmetic answers, :mod:`~sc_lightning.models.warm_worked`); :func:`resolve_model_name` builds one on
first use (seconds on a CPU, or on a GPU for the larger ones; about three minutes for the 312M one) and caches it.

Every builder writes into a staging directory of its own and renames it into place, the first rename winning: runs,
processes and the ranks of a parallel group may build the same warm start at once, without a lock, and none ever
reads a half-written one. A warm start trains the whole model on one device (megatron's parallel state at TP = PP =
1), and that state is process-global and set once: a process whose state is set otherwise (split, tensor or pipeline
parallel), or not yet set but one rank of several (a rank of a run resolves its model before its layout is set up;
setting the state is a collective of every rank, which ranks that find the warm start built do not join), builds it
in a fresh interpreter (``python -m sc_lightning.models.warm_start``), under a deadline. A process of its own with no
state yet builds it in place and then tears the state down, so its models may take any layout after.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from sc_lightning.models.convert import export_hf_weights
from sc_lightning.models.hf_dir import save_hf_directory
from sc_lightning.models.spec import builtin_spec
from sc_lightning.models.warm_vlm import warm_start_clevr
from sc_lightning.models.warm_worked import WorkedBudget, warm_start_worked
from sc_lightning.tasks import clevr, worked_arithmetic
from sc_lightning.tokenizer import CharTokenizer


@dataclass(frozen=True)
class WarmRecipe:
    """How one warm-started model is made: the built-in architecture it trains and its optimizer settings."""

    base: str  # a BUILTIN_SPECS name
    lr: float  # AdamW learning rate: the 142M model needs ten times less than the 85k one
    check_every: int  # steps between greedy-accuracy checks: a large model passes the target in a few steps, so
    # it is checked every step (a coarser check overshoots the target by a varying amount, and the RL start with it)
    task: Literal["addition", "multiplication", "mixed", "calculator", "worked_arithmetic", "clevr"] = "addition"  #
    # which worked examples it trains on (mixed: addition and multiplication, half each; clevr: scenes' questions)
    budget: WorkedBudget | None = None  # worked_arithmetic: its token budget and target (None: the default budget)
    target_accuracy: float = 0.4  # greedy accuracy it trains to (deliberately partial for a policy; high for a teacher;
    # clevr: the reward sampling would earn)


WARM_STARTS: dict[str, WarmRecipe] = {
    "builtin:tiny-arith": WarmRecipe("builtin:tiny", lr=3e-3, check_every=25),
    "builtin:small-arith": WarmRecipe("builtin:small", lr=3e-4, check_every=1),
    "builtin:tiny-calc": WarmRecipe("builtin:tiny", lr=1e-2, check_every=2, task="calculator"),
    # on-policy distillation's tiny example (configs/distill_tiny.yaml): two teachers that know their task well, and
    # a student that has seen both only briefly
    "builtin:tiny-add-teacher": WarmRecipe("builtin:tiny", lr=3e-3, check_every=25, target_accuracy=0.95),
    "builtin:tiny-mul-teacher": WarmRecipe(
        "builtin:tiny", lr=3e-3, check_every=25, task="multiplication", target_accuracy=0.95
    ),
    "builtin:tiny-mixed": WarmRecipe("builtin:tiny", lr=3e-3, check_every=5, task="mixed", target_accuracy=0.1),
    # the tiny VLM until sampling would earn reward 0.1: it answers with a digit, rarely the right one (docs/vlm.md);
    # at lr 3e-3 its vision tower settles on telling red from the rest, and green and blue stay one colour
    "builtin:tiny-vlm-clevr": WarmRecipe("builtin:tiny-vlm", lr=1e-3, check_every=2, task="clevr", target_accuracy=0.1),
    # trains until sampling would earn reward 0.3, within a token budget (models/warm_worked.py)
    "builtin:medium-worked": WarmRecipe(
        "builtin:medium", lr=3e-4, check_every=20, task="worked_arithmetic", budget=WorkedBudget()
    ),
}
DEFAULT_CACHE = Path("results") / ".cache"
log = logging.getLogger(__name__)


def resolve_model_name(
    model_name: str, *, seed: int, cache_dir: Path = DEFAULT_CACHE, device: str | torch.device = "cpu"
) -> str:
    """A :data:`WARM_STARTS` name (``builtin:tiny-arith``) → its cached warm-start directory (built on ``device`` when
    missing); a local directory → its absolute path; other names unchanged.

    Paths come back absolute because the engines may run in processes that do not share the driver's working
    directory (Ray actors on a cluster started elsewhere).
    """
    recipe = WARM_STARTS.get(model_name)
    if recipe is None:
        return str(Path(model_name).resolve()) if Path(model_name).is_dir() else model_name
    path = cache_dir / f"{model_name.removeprefix('builtin:')}-seed{seed}-{_recipe_digest(recipe)}"
    if not path.exists():
        log.info("building the warm-started %s policy in %s (once)", recipe.base, path)
        path.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f"{path.name}.building-", dir=path.parent))
        try:
            _build(model_name, recipe, building, seed=seed, device=device)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
        _publish(building, path)
    return str(path.resolve())


BUILD_APART_TIMEOUT_S = 3600.0
"""Deadline of a warm start built in a fresh interpreter (the 312M one takes about three minutes on a GPU)."""


def _build(model_name: str, recipe: WarmRecipe, building: Path, *, seed: int, device: str | torch.device) -> None:
    """Build ``model_name``'s warm start into ``building``: here when this process's megatron parallel state is at
    (TP, PP) = (1, 1), or is not set and this process is one of its own (then the state is torn down after, so the
    run's models may set their layout); else in a fresh interpreter (see the module's docstring)."""
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        split = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
        )
        if split == (1, 1):
            warm_start(building, seed=seed, device=device, recipe=recipe)
            return
    elif not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        try:
            warm_start(building, seed=seed, device=device, recipe=recipe)
        finally:
            if parallel_state.model_parallel_is_initialized():
                parallel_state.destroy_model_parallel()
        return
    _build_apart(model_name, building, seed=seed, device=device)


def _build_apart(model_name: str, building: Path, *, seed: int, device: str | torch.device) -> None:
    """Build ``model_name``'s warm start into ``building`` in a fresh interpreter (:func:`main`); RuntimeError with
    the end of its output when it fails or runs past :data:`BUILD_APART_TIMEOUT_S`."""
    command = [sys.executable, "-m", __name__, model_name, str(building), "--seed", str(seed), "--device", str(device)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_APART_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"building the warm start {model_name} in a separate process ran past {BUILD_APART_TIMEOUT_S:.0f} s"
        ) from None
    if result.returncode != 0:
        raise RuntimeError(
            f"building the warm start {model_name} in a separate process (its parallel state is split) failed with "
            f"exit code {result.returncode}:\n{(result.stdout + result.stderr)[-3000:]}"
        )


def main(argv: list[str] | None = None) -> None:
    """``python -m sc_lightning.models.warm_start NAME DIRECTORY --seed S --device D``: build a :data:`WARM_STARTS`
    warm start into ``DIRECTORY`` (what a process with a split parallel state runs to build one)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("name", choices=sorted(WARM_STARTS))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    warm_start(args.directory, seed=args.seed, device=args.device, recipe=WARM_STARTS[args.name])


def _publish(building: Path, path: Path) -> None:
    """Move a finished warm start into place in one step, so another run never reads it half written; where a run
    beside this one published the same warm start first, keep theirs."""
    try:
        building.rename(path)
    except OSError:  # the directory is there now (and whole): the same recipe and seed, so the same model
        if not path.is_dir():
            raise
        shutil.rmtree(building, ignore_errors=True)


def _recipe_digest(recipe: WarmRecipe) -> str:
    """A short digest of the recipe, its architecture and the warm-start code (with the worked-arithmetic task's own
    warm start and task), so a changed recipe never reuses a stale cache."""
    sources = [Path(__file__)]
    if recipe.task == "worked_arithmetic":
        sources += [Path(__file__).with_name("warm_worked.py"), Path(worked_arithmetic.__file__)]
    if recipe.task == "clevr":
        sources += [Path(__file__).with_name("warm_vlm.py"), Path(clevr.__file__)]
    text = repr(recipe) + repr(builtin_spec(recipe.base)) + "".join(path.read_text() for path in sources)
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def _examples(tokenizer: CharTokenizer, count: int, seed: int, task: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` worked examples of ``task`` as right-padded rows of token ids, and the mask of the model's tokens.

    addition: ``<bos>a+b=S<eos>`` (the model's tokens: the sum and eos); multiplication: ``<bos>a*b=P<eos>`` alike;
    mixed: either, half each (single digits throughout). calculator: the conversation
    ``<bos>a*b=a*b<eos>P=P<eos>`` of two-digit factors in the built-in chat template (the model's tokens: its call
    ``a*b<eos>`` and its answer ``P<eos>``).
    """
    g = torch.Generator().manual_seed(seed)
    bos, eos, encode = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.encode
    rows: list[list[int]] = []
    masks: list[list[bool]] = []
    if task in ("addition", "multiplication", "mixed"):
        operators = {"addition": "+", "multiplication": "*"}.get(task, "+*")
        for n, (a, b) in enumerate(torch.randint(0, 10, (count, 2), generator=g, device="cpu").tolist()):
            op = operators[n % len(operators)]
            rows.append([bos, *encode(f"{a}{op}{b}={a + b if op == '+' else a * b}"), eos])
            masks.append([i >= 5 for i in range(len(rows[-1]))])
    else:
        for a, b in torch.randint(10, 100, (count, 2), generator=g, device="cpu").tolist():
            call, product = encode(f"{a}*{b}"), encode(str(a * b))
            rows.append([bos, *call, *encode("="), *call, eos, *product, *encode("="), *product, eos])
            masks.append([False] * 7 + [True] * 6 + [False] * (len(product) + 1) + [True] * (len(product) + 1))
    width = max(len(row) for row in rows)
    padded = [row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows]
    return torch.tensor(padded, device="cpu"), torch.tensor([m + [False] * (width - len(m)) for m in masks])


def greedy_accuracy(model: torch.nn.Module, batch: torch.Tensor, mask: torch.Tensor, vocab_size: int) -> float:
    """Fraction of rows whose model tokens (``mask``) are all the model's greedy choices given the tokens before.

    With the environment's tokens determined by the model's (a calculator result, a prompt), this is the greedy
    end-to-end success rate.
    """
    with torch.no_grad():
        logits = model(batch, None, None)[..., :vocab_size]  # (B, T, V): logits[t] predicts token t+1
    predicted = logits.argmax(-1)[:, :-1]
    target, scored = batch[:, 1:], mask[:, 1:].to(batch.device)
    return float(((predicted == target) | ~scored).all(-1).float().mean())


def warm_start(
    path: Path,
    *,
    seed: int,
    target_accuracy: float | None = None,
    max_steps: int = 2000,
    device: str | torch.device = "cpu",
    recipe: WarmRecipe = WARM_STARTS["builtin:tiny-arith"],
) -> float:
    """Train ``recipe``'s model on ``device`` until greedy accuracy reaches ``target_accuracy`` (None: the recipe's);
    save it as an HF dir
    at ``path``. A GPU run warms up on its GPU: building a model on the CPU would patch megatron for the CPU in a
    process whose models live on CUDA. The worked-arithmetic recipe measures and bounds itself instead
    (:mod:`~sc_lightning.models.warm_worked`: the reward sampling would earn, within a token budget) and returns that
    reward; the CLEVR recipe trains the VLM until sampling would earn ``target_accuracy`` as reward
    (:mod:`~sc_lightning.models.warm_vlm`) and returns that reward."""
    from sc_lightning.models import build_gpt_model, token_logprobs  # megatron-core, only when a model is built

    if recipe.task == "worked_arithmetic":
        spec, budget = builtin_spec(recipe.base), recipe.budget or WorkedBudget()
        return warm_start_worked(
            path, spec, lr=recipe.lr, seed=seed, check_every=recipe.check_every, device=device, budget=budget
        )
    target = recipe.target_accuracy if target_accuracy is None else target_accuracy
    if recipe.task == "clevr":
        spec = builtin_spec(recipe.base)
        return warm_start_clevr(
            path, spec, lr=recipe.lr, seed=seed, check_every=recipe.check_every, target_reward=target, device=device
        )
    tokenizer, spec = CharTokenizer(), builtin_spec(recipe.base)
    model = build_gpt_model(spec, precision="fp32", seed=seed, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr)
    (data, mask), (held_out, held_out_mask) = (
        _examples(tokenizer, 512, seed, recipe.task),
        _examples(tokenizer, 256, seed + 1, recipe.task),
    )
    data, mask, held_out = data.to(device), mask.to(device), held_out.to(device)
    accuracy = 0.0
    for step in range(max_steps):
        pick = torch.randint(0, len(data), (64,), generator=torch.Generator().manual_seed(step), device="cpu")
        batch, answer_mask = data[pick.to(data.device)], mask[pick.to(data.device)]
        logprobs = token_logprobs(model, batch, vocab_size=spec.vocab_size)  # (B, T)
        loss = -(logprobs * answer_mask).sum() / answer_mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % recipe.check_every == 0:
            accuracy = greedy_accuracy(model.eval(), held_out, held_out_mask, spec.vocab_size)
            model.train()
            if accuracy >= target:
                break
    save_hf_directory(spec, export_hf_weights(model, spec), path)
    return accuracy


if __name__ == "__main__":
    main()
