"""``python -m sc_lightning export --ckpt_path BUNDLE --output DIR``: a bundle's policy as a Hugging Face directory.

The bundle is checked against its manifest first (as a resume checks it); the work is
:func:`~sc_lightning.trainer.bundle_policy.export_bundle`'s (docs/models.md, "Export", says what the directory holds).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sc_lightning.checkpoint.bundle import TRAINER_FILE
from sc_lightning.cli.args import UsageError, take_value
from sc_lightning.cli.exits import EXIT_CANNOT_RESUME, EXIT_INVALID_CONFIG, cannot_resume_errors, usage_error

if TYPE_CHECKING:
    from sc_lightning.models.hf_export import PolicySource

EXPORT_USAGE = """\
python -m sc_lightning export --ckpt_path BUNDLE --output DIR [--max_shard_size 5GB] [--config CONFIG.yaml ...]

  --ckpt_path       a checkpoint bundle (checkpointing.checkpoint_dir/step_N) or its trainer.ckpt, of one trainer
                    rank or several (TP/PP/DP: its sharded/ policy is gathered into one full model)
  --output          the Hugging Face directory to write (new, or an empty directory); transformers loads it with
                    AutoModelForCausalLM.from_pretrained, and fit --policy.model_name DIR trains on from it
  --max_shard_size  the largest safetensors file: bytes, or with a unit (KB, MB, GB; KiB, MiB, GiB); above it the
                    weights are split, with model.safetensors.index.json (default 5GB)
  --config          the run's config, read only for a bundle that does not record its policy's source (written
                    before exports existed): its policy.model_name, policy.tokenizer_name and policy.precision
"""

HF_EXPORT_DIR = "hf_export"
"""Where ``checkpointing.export_hf_at_end`` writes, inside ``checkpointing.checkpoint_dir``: ``hf_export/step_N``."""
FINAL_EXPORT_TIMEOUT_S = 3600.0
"""How long ``checkpointing.export_hf_at_end``'s export may take (an 8B policy's, read and written whole: minutes)."""
_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE")
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


@dataclass
class ExportRequest:
    """What ``export``'s arguments asked for."""

    ckpt_path: str | None = None
    output: str | None = None
    max_shard_bytes: int = 5 * 10**9
    configs: list[str] = field(default_factory=list)


def export_command(args: list[str]) -> int:
    """``export``: check the bundle, then write its policy as a Hugging Face directory."""
    try:
        request = parse_export_arguments(args)
    except UsageError as exc:
        return usage_error(EXPORT_USAGE, str(exc))
    if request is None:
        print(EXPORT_USAGE)
        return 0
    from sc_lightning.checkpoint.atomic import BundleError, verify_bundle
    from sc_lightning.cli.policy_run import bundle_directory, not_a_bundle
    from sc_lightning.config import ConfigError
    from sc_lightning.models.hf_export import ExportError, check_output_dir
    from sc_lightning.tokenizer import TokenizerLoadError

    given = Path(request.ckpt_path)
    bundle = bundle_directory(given)
    output = Path(request.output)
    if bundle is None:  # as generate and validate say it
        print(f"error: --ckpt_path {given}: {not_a_bundle(given)}", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    try:
        verify_bundle(bundle)
    except BundleError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CANNOT_RESUME
    try:
        check_output_dir(output)  # in moments, before the policy is loaded
        written = _export(bundle / TRAINER_FILE, output, request)
    except (ExportError, TokenizerLoadError, ConfigError) as err:  # the output, the policy's source or the run's config
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    except cannot_resume_errors() as err:  # the bundle's models do not fit the policy it records
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CANNOT_RESUME
    print(f"exported {bundle} to {written}")
    return 0


def export_final_bundle(checkpoint_dir: Path) -> int:
    """``checkpointing.export_hf_at_end``: export the newest bundle of ``checkpoint_dir`` (a fit's final one) to
    ``checkpoint_dir/hf_export/step_N``, kept as is when it exists; returns the exit code.

    The export runs as ``python -m sc_lightning export`` in a child process: it builds the policy unsharded, which
    a trainer rank's process (its megatron parallel state set for the run's layout) cannot.
    """
    from sc_lightning.checkpoint.atomic import complete_bundles

    bundles = complete_bundles(checkpoint_dir)
    if not bundles:
        print(f"checkpointing.export_hf_at_end: {checkpoint_dir} holds no bundle to export", file=sys.stderr)
        return 0
    bundle = bundles[-1][1]
    output = checkpoint_dir / HF_EXPORT_DIR / bundle.name
    if output.exists():
        print(f"checkpointing.export_hf_at_end: {output} exists already, kept as is", file=sys.stderr)
        return 0
    command = [sys.executable, "-m", "sc_lightning", "export", "--ckpt_path", str(bundle), "--output", str(output)]
    env = {k: v for k, v in os.environ.items() if k not in _RENDEZVOUS}  # a world of its own, not the run's
    try:
        return subprocess.run(command, env=env, check=False, timeout=FINAL_EXPORT_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:  # the child is killed; the bundle stands, and export can be run by hand
        print(
            f"checkpointing.export_hf_at_end: exporting {bundle} to {output} ran past {FINAL_EXPORT_TIMEOUT_S:.0f} s "
            f"and was stopped; run python -m sc_lightning export --ckpt_path {bundle} --output OUT",
            file=sys.stderr,
        )
        return 1  # a failure of the export, not of the fit: its bundles stand


def _export(trainer_checkpoint: Path, output: Path, request: ExportRequest) -> Path:
    from sc_lightning.console import quiet_libraries
    from sc_lightning.trainer.bundle_policy import export_bundle

    quiet_libraries()
    fallback = _config_source(request.configs) if request.configs else None
    return export_bundle(
        trainer_checkpoint, output, fallback=fallback, max_shard_bytes=request.max_shard_bytes, progress=True
    )


def _config_source(configs: list[str]) -> PolicySource:
    """The policy source the run's config names (its warm start resolved, as the run resolved it)."""
    from sc_lightning.cli.load import LIGHTNING_KEYS
    from sc_lightning.config import load_config
    from sc_lightning.config.yaml_io import load_yaml_layers
    from sc_lightning.models.policy_source import model_spec
    from sc_lightning.models.warm_start import resolve_model_name
    from sc_lightning.trainer.bundle_policy import policy_source_for

    config = load_config(load_yaml_layers(configs, []), extra_top_level=LIGHTNING_KEYS)
    model_name = resolve_model_name(config.policy.model_name, seed=config.algo.seed)
    return policy_source_for(config.policy, model_name, model_spec(model_name))


def parse_export_arguments(argv: list[str]) -> ExportRequest | None:
    """``export``'s arguments; None when they ask for help. Raises UsageError."""
    request, rest = ExportRequest(), list(argv)
    while rest:
        arg = rest.pop(0)
        key, eq, value = arg.partition("=")
        if key in ("-h", "--help"):
            return None
        if key not in ("--ckpt_path", "--output", "--max_shard_size", "--config", "-c"):
            options = "--ckpt_path, --output, --max_shard_size and --config"
            raise UsageError(f"unexpected argument {arg!r}; export takes {options}")
        value = value if eq else take_value(key, rest)
        if key == "--ckpt_path":
            request.ckpt_path = value
        elif key == "--output":
            request.output = value
        elif key == "--max_shard_size":
            request.max_shard_bytes = parse_size(value)
        else:
            request.configs.append(value)
    missing = [name for name in ("ckpt_path", "output") if getattr(request, name) is None]
    if missing:
        raise UsageError(f"export needs {' and '.join(f'--{name}' for name in missing)}")
    return request


def parse_size(text: str) -> int:
    """Bytes in ``text``: a count, or a number with a unit (``5GB`` = 5e9, ``20KiB`` = 20480); UsageError else."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]i?b|b)?\s*", text.lower())
    if match is None or float(match.group(1)) * _UNITS[match.group(2) or ""] < 1:
        raise UsageError(f"--max_shard_size takes a positive size such as 5GB, 500MB or 20KiB, got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2) or ""])
