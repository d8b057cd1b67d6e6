"""The command line's words: the usage texts and the parser of ``fit``'s arguments (no Lightning, no config load).

``fit --help`` lists the config's sections with their one-line docs, from the schema, and points to ``knobs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sc_lightning.config.reference import section_summaries

SUBCOMMANDS_HELP = {
    "fit": "train: validate the whole config, then run it (fit --help lists the config sections)",
    "validate": "validate one policy (initial, or --ckpt_path BUNDLE's) on the run's validation set, then exit",
    "generate": "answer a split's prompts with one policy (initial or --ckpt_path BUNDLE's): JSONL rows, summary",
    "knobs": "print each knob of a config section: type, default, unit, meaning and the rules that tie it",
    "report": "write RUN_DIR's HTML report with PNG plots (reward, staleness, step time, goodput, throughput)",
    "export": "write a bundle's policy (--ckpt_path BUNDLE) as a Hugging Face model directory (--output DIR)",
}
"""One line per subcommand, for ``python -m sc_lightning --help``; cli/main.py dispatches the same names."""

FIT_USAGE = """\
python -m sc_lightning fit --config CONFIG.yaml [--config MORE.yaml] [--a.b.c VALUE ...]
                           [--print_config] [--dry_run [true|false]]

  --config        YAML file(s), deep-merged in order; spec sections at top level, Lightning's under trainer:
  --a.b.c VALUE   override one knob, e.g. --grpo.max_num_steps 5 or --trainer.accelerator=cpu
  --print_config  print the fully resolved config (defaults included) and exit
  --dry_run       validate everything (spec sections and trainer:) and exit 0 without starting anything
"""

KNOBS_USAGE = """\
python -m sc_lightning knobs [SECTION]

  SECTION         a section's dotpath (e.g. async_rl.sampler) or one knob's; without it, every knob
"""

_LIGHTNING_SECTIONS = (
    ("trainer", "Lightning's Trainer arguments (lightning.pytorch.Trainer); --print_config shows them all."),
    ("seed_everything", "Lightning's global seed (default: the algorithm block's seed)."),
)


_SHORT_OPTIONS = ("-h", "-c")
"""The one-dash options: help and ``-c`` for ``--config``."""


class UsageError(ValueError):
    """The command line itself is malformed."""


@dataclass
class FitRequest:
    """What ``fit``'s arguments asked for."""

    configs: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    print_config: bool = False
    dry_run: bool = False


def usage() -> str:
    """``python -m sc_lightning --help``: the subcommands, then ``fit``'s options."""
    commands = "\n".join(f"  {name:<15} {text}" for name, text in SUBCOMMANDS_HELP.items())
    return f"python -m sc_lightning SUBCOMMAND ...\n\n{commands}\n\n{FIT_USAGE}"


def fit_help() -> str:
    """``fit --help``: the options, then every config section with its one-line doc."""
    width = max(len(name) for name, _ in (*section_summaries(), *_LIGHTNING_SECTIONS)) + 2
    sections = "\n".join(f"  {name:<{width}}{doc}" for name, doc in (*section_summaries(), *_LIGHTNING_SECTIONS))
    return (
        f"{FIT_USAGE}\nConfig sections (every knob of one, with its type, default, unit and rules: "
        f"python -m sc_lightning knobs SECTION):\n{sections}\n"
    )


def parse_fit_arguments(argv: list[str], command: str = "fit") -> FitRequest | None:
    """``fit``'s arguments (after the subcommand ``command``, which takes them too); None when they ask for help.
    Raises UsageError."""
    request, rest = FitRequest(), list(argv)
    while rest:
        arg = rest.pop(0)
        key, eq, value = arg.partition("=")
        if key in ("-h", "--help"):
            return None
        if not is_option(key):
            raise UsageError(f"unexpected argument {arg!r}; options look like --key value")
        if key in ("--print_config", "--dry_run") and command != "fit":
            raise UsageError(f"{key} is fit's option ({command} always runs): fit --config X.yaml {key}")
        if key == "--print_config":
            request.print_config = True
        elif key == "--dry_run":
            request.dry_run = _flag_value(value if eq else _optional_value(rest))
        elif key in ("--config", "-c"):
            request.configs.append(value if eq else take_value(key, rest))
        else:
            request.overrides.append(f"{key[2:]}={value if eq else take_value(key, rest)}")
    if not request.configs and not request.overrides:
        raise UsageError(f"give a config: {command} --config configs/grpo_tiny.yaml")
    return request


def take_value(option: str, rest: list[str]) -> str:
    """Pop ``option``'s value off ``rest``; UsageError naming ``option`` when there is none, or when the next
    argument is another option (a value that starts with ``--`` is written ``option=--value``)."""
    if not rest or is_option(rest[0]):
        found = f"the next argument is the option {rest[0]}" if rest else "it is the last argument"
        raise UsageError(f"{option} needs a value, but {found}; write {option} VALUE (or {option}=VALUE)")
    return rest.pop(0)


def is_option(arg: str) -> bool:
    """Whether ``arg`` is an option name rather than a value (a negative number such as ``-1`` is a value)."""
    return arg.startswith("--") or arg in _SHORT_OPTIONS


def _optional_value(rest: list[str]) -> str:
    return rest.pop(0) if rest and not is_option(rest[0]) else "true"


def _flag_value(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false", "1", "0", "yes", "no"):
        raise UsageError(f"--dry_run takes true or false, got {text!r}")
    return lowered in ("true", "1", "yes")
