"""``python -m sc_lightning generate --config X [--ckpt_path BUNDLE] ...``: a policy's answers to a split's prompts.

The policy comes up as ``validate`` brings it up (:mod:`sc_lightning.cli.policy_run`: the initial policy — a
``--policy.model_name`` Hugging Face directory too — or a bundle's); :class:`~sc_lightning.callbacks.generate.
GenerateOnce` answers the prompts and scores them with the config's environment; then this writes one JSONL row per
answer and prints the summary and a few examples (:mod:`sc_lightning.rollout.answer_sheet`). See docs/evaluation.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sc_lightning.cli.args import UsageError, parse_fit_arguments
from sc_lightning.cli.exits import usage_error
from sc_lightning.cli.policy_run import PolicyRun, fit_once, run_on_policy, take_options
from sc_lightning.config import ConfigError, ConfigIssue, SCConfig

if TYPE_CHECKING:
    from sc_lightning.callbacks.generate import GenerateRequest

GENERATE_USAGE = """\
python -m sc_lightning generate --config CONFIG.yaml [--config MORE.yaml] [--a.b.c VALUE ...] [--ckpt_path BUNDLE]
                                [--split val|train] [--num_prompts N|all] [--greedy] [--output FILE.jsonl]

  --ckpt_path     a checkpoint bundle (checkpointing.checkpoint_dir/step_N) or its trainer.ckpt: its policy
                  (default: the initial policy, policy.model_name — a Hugging Face directory too)
  --split         val: the validation set (data.val_dataset_name, or the arithmetic task's); train: the training
                  set (data.dataset_name); default: val when the config has a validation set, else train
  --num_prompts   the first N prompts of the split, in file order (default 100; all: every prompt)
  --greedy        decode greedily (temperature 0); default: sample as policy.generation says (seeded per prompt)
  --output        the JSONL file of answers (default: <trainer.default_root_dir>/generations.jsonl)
  requests in flight and the deadline are the validation knobs: {algo}.val_batch_size, {algo}.val_timeout_s
"""
DEFAULT_PROMPTS = 100
"""How many prompts ``generate`` answers without ``--num_prompts``."""
EXAMPLES = 4
"""How many answers the summary shows."""
_VALUED, _FLAGS = ("--ckpt_path", "--split", "--num_prompts", "--output"), ("--greedy",)


def generate_command(args: list[str]) -> int:
    """``generate``: load the policy, answer the split's prompts, write the rows, print the summary."""
    from sc_lightning.callbacks.generate import GenerateRequest
    from sc_lightning.rollout.answer_sheet import SPLITS

    try:
        options, rest = take_options(args, _VALUED, _FLAGS)
        split = options.get("--split")
        if split is not None and split not in SPLITS:
            raise UsageError(f"--split takes {' or '.join(SPLITS)}, got {split!r}")
        count = _prompt_count(options.get("--num_prompts", str(DEFAULT_PROMPTS)))
        output = options.get("--output")
        if output is not None and Path(output).is_dir():  # found now, not after every prompt is answered
            raise UsageError(f"--output {output} is a directory; give the JSONL file to write, e.g. {output}/x.jsonl")
        request = parse_fit_arguments(rest, "generate")
    except UsageError as exc:
        return usage_error(GENERATE_USAGE, str(exc))
    if request is None:
        print(GENERATE_USAGE)
        return 0
    ask = GenerateRequest(split=split, count=count, greedy=options.get("--greedy") == "true")
    return run_on_policy(
        options.get("--ckpt_path"),
        request,
        lambda run: _generate(run, ask, output),
        adjust=lambda config: _answerable(config, split),
    )


def _prompt_count(text: str) -> int | None:
    if text == "all":
        return None
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"--num_prompts takes a positive number or all, got {text!r}")
    return int(text)


def _answerable(config: SCConfig, split: str | None) -> SCConfig:
    """``config``, or a ConfigError when its environment cannot score one completion per prompt, or when ``split``
    is ``val`` and the config has no validation set."""
    from sc_lightning.rollout.datasets import validation_set_name

    issues = []
    if config.env.is_multiturn() or config.env.name == "external":
        kind = "is multi-turn" if config.env.is_multiturn() else "leaves the rewards to external agents"
        issues.append(
            ConfigIssue(
                "env.name",
                f"is {config.env.name!r}, which {kind}; generate scores one completion per prompt with a verifier "
                "(env.name arithmetic, math or a custom single-turn environment)",
            )
        )
    if split == "val" and validation_set_name(config.data) is None:
        issues.append(
            ConfigIssue(
                "data.val_dataset_name",
                "is null and data.dataset_name has no built-in validation set, so --split val has no prompts; give "
                "data.val_dataset_name a dataset file, or use --split train",
            )
        )
    if issues:
        raise ConfigError(issues)
    return config


def _generate(run: PolicyRun, ask: GenerateRequest, output: str | None) -> int:
    from sc_lightning.callbacks.generate import GenerateOnce
    from sc_lightning.rollout.answer_sheet import AnswerSummary, example_lines, write_rows

    once = GenerateOnce(run.config, ask)
    run.lightning.setdefault("trainer", {})["logger"] = False  # a look at answers logs no metrics
    fit_once(run, once)
    assert once.split is not None, "on_fit_start answers on the one rank"
    path = Path(output) if output is not None else run.root / "generations.jsonl"
    write_rows(path, once.rows)
    policy = "the initial policy" if run.bundle is None else f"the policy of step {run.step} ({run.bundle})"
    print(
        f"generate: {len(once.rows)} prompts of the {once.split.name} split ({once.split.source}), "
        f"{_sampling(run.config, ask.greedy)}, {policy} ({run.config.policy.model_name})"
    )
    print("\n".join(AnswerSummary.of(once.rows).lines()))
    print("examples:\n" + "\n".join(example_lines(once.rows, EXAMPLES)))
    print(f"wrote {len(once.rows)} answers to {path}")
    return 0


def _sampling(config: SCConfig, greedy: bool) -> str:
    if greedy:
        return "greedy"
    generation = config.policy.generation
    top_k = "" if generation.top_k is None else f", top_k {generation.top_k}"
    return f"sampled at temperature {generation.temperature:g}, top_p {generation.top_p:g}{top_k}"
