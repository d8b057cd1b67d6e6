"""``python -m sc_lightning SUBCOMMAND ...``: the subcommands and their dispatch.

The subcommands are ``fit`` (:mod:`sc_lightning.cli.fit`), ``validate`` (:mod:`sc_lightning.cli.validate`),
``knobs`` (the config reference in a terminal), ``report`` (a run's HTML report), ``generate``
(:mod:`sc_lightning.cli.generate`) and ``export`` (:mod:`sc_lightning.cli.export`: a bundle's policy as a Hugging Face
directory); :mod:`sc_lightning.cli.args` holds the usage texts and ``fit``'s argument parser.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from sc_lightning.cli.args import KNOBS_USAGE, usage
from sc_lightning.cli.exits import EXIT_INVALID_CONFIG, usage_error
from sc_lightning.cli.fit import fit_command
from sc_lightning.cli.load import LIGHTNING_KEYS
from sc_lightning.interrupt import EXIT_INTERRUPTED, clear_unhandled_interrupt_mark


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0
    command = _SUBCOMMANDS.get(args[0])
    if command is None:
        return usage_error(usage(), f"unknown subcommand {args[0]!r}; the subcommands are {', '.join(_SUBCOMMANDS)}")
    try:
        return command(args[1:])
    except KeyboardInterrupt:  # Ctrl-C: whatever had started has been stopped on the way here
        clear_unhandled_interrupt_mark()
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def knobs_command(args: list[str]) -> int:
    """``knobs [SECTION]``: each knob's type, default, unit and meaning, and the rules that tie it to others."""
    if any(arg in ("-h", "--help") for arg in args):
        print(KNOBS_USAGE)
        return 0
    if len(args) > 1 or (args and args[0].startswith("-")):
        return usage_error(KNOBS_USAGE, f"knobs takes at most one SECTION, got {' '.join(args)!r}")
    from sc_lightning.config.reference_text import UnknownKnobPath, render_knobs

    if args and args[0].split(".")[0] in LIGHTNING_KEYS:
        print(f"error: {args[0]} is Lightning's: see lightning.pytorch.Trainer, or fit --print_config", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    try:
        text = render_knobs(args[0] if args else None)
    except UnknownKnobPath as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    print(text, end="")
    return 0


def generate_command(args: list[str]) -> int:
    """``generate --config X [--ckpt_path BUNDLE]``: one policy's answers to a split's prompts, scored."""
    from sc_lightning.cli.generate import generate_command as run_generation

    return run_generation(args)


def report_command(args: list[str]) -> int:
    """``report RUN_DIR [--out PATH]``: the run's self-contained HTML report with its PNG plots."""
    from sc_lightning.report.main import main as report_main

    return report_main(args)


def export_command(args: list[str]) -> int:
    """``export --ckpt_path BUNDLE --output DIR``: a bundle's policy as a Hugging Face model directory."""
    from sc_lightning.cli.export import export_command as run_export

    return run_export(args)


def validate_command(args: list[str]) -> int:
    """``validate --config X [--ckpt_path BUNDLE]``: one validation of the initial or a bundle's policy."""
    from sc_lightning.cli.validate import validate_command as run_validation

    return run_validation(args)


_SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "fit": fit_command,
    "validate": validate_command,
    "generate": generate_command,
    "knobs": knobs_command,
    "report": report_command,
    "export": export_command,
}
"""Each subcommand's function, given the arguments after its name; args.SUBCOMMANDS_HELP says what each does."""
