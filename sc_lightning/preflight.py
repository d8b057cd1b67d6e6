"""Preflight: what a valid config needs from this machine, checked before anything starts (``fit``, ``--dry_run``).

The config rules (:mod:`sc_lightning.config.validate`) check a config against itself; preflight checks it against
the box it is about to run on: the trainer's hardware request (``trainer.accelerator`` / ``trainer.devices``, seen
through torch), the model and tokenizer names (a built-in, a warm start, a local directory or the local Hugging Face
cache; a directory's ``config.json`` must describe an architecture sc_lightning trains), the environment
(``env.name``: built as the run builds it), the dataset files and the columns their schemas hold, vLLM when
generation uses it, and the directories the run writes. It is cheap — no Ray, no model build, no Lightning Trainer,
no dataset row read, nothing created — and reports every problem at once as a ConfigError whose issues name the
dotpath, the value and the fix.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from sc_lightning.config import ConfigError, ConfigIssue, SCConfig

_ALL_DEVICES = ("auto", "-1", -1)
"""``trainer.devices`` values that ask for every device of the accelerator."""
_DEVICE_NAMES = {"gpu": "GPU", "cuda": "CUDA GPU", "mps": "Apple MPS device", "tpu": "TPU"}
_UNCOUNTED = ("tpu",)
"""Accelerators whose device count needs their own runtime: only their presence is checked."""


def check_preflight(config: SCConfig, trainer: dict[str, Any]) -> None:
    """Raise one ConfigError listing every :func:`preflight_issues` problem; return when there is none."""
    issues = preflight_issues(config, trainer)
    if issues:
        raise ConfigError(issues)


def preflight_issues(config: SCConfig, trainer: dict[str, Any]) -> list[ConfigIssue]:
    """Every reason ``config`` (with the resolved ``trainer:`` arguments) cannot start on this machine."""
    return [
        *hardware_issues(trainer),
        *_model_issues(config),
        *_environment_issues(config),
        *_dataset_issues(config),
        *_generation_issues(config),
        *_endpoint_issues(config),
        *_directory_issues(config, trainer),
        *memory_issues(config, trainer),
    ]


def hardware_issues(trainer: dict[str, Any]) -> list[ConfigIssue]:
    """``trainer.accelerator`` / ``trainer.devices`` asking for devices this machine lacks (a CPU run always fits),
    or a ``trainer.devices`` that is no device request."""
    accelerator = trainer.get("accelerator") or "auto"
    if not isinstance(accelerator, str):  # an Accelerator object: Lightning checks its own
        return []
    kind = accelerator
    counts = _device_counts()
    if kind == "auto":
        kind = "gpu" if counts["gpu"] else "cpu"
    devices = trainer.get("devices", "auto")
    if kind not in _UNCOUNTED and (problem := _devices_problem(devices, kind)):
        return [ConfigIssue("trainer.devices", f"is {devices!r}: {problem}")]
    if kind not in counts:  # cpu, or an accelerator torch alone cannot see (Lightning checks it)
        return []
    have = counts[kind]
    box = _describe(counts)
    if not have:
        return [
            ConfigIssue(
                "trainer.accelerator",
                f"is {accelerator!r} but this machine has no {_DEVICE_NAMES[kind]} ({box}); set "
                "trainer.accelerator: cpu (with policy.precision: fp32) or run on a machine that has one",
            )
        ]
    wanted = _requested_indices(devices) if kind not in _UNCOUNTED else None
    if wanted is not None and max(wanted, default=0) >= have:
        return [
            ConfigIssue(
                "trainer.devices",
                f"is {devices!r}, asking for {kind} device(s) {sorted(wanted)}, but this machine has {have} ({box}); "
                f"ask for at most {have} (indices 0..{have - 1}) or run on a machine with more",
            )
        ]
    return []


def _devices_problem(devices: Any, kind: str) -> str | None:
    """Why ``trainer.devices`` is no request Lightning takes on accelerator ``kind`` (None: it is one)."""
    if devices in _ALL_DEVICES or devices is None:
        return None
    wanted = _requested_indices(devices)
    if wanted is None:
        return "not a device count, a list of device indices, 'auto' or -1"
    if not wanted:
        return "asks for no device; ask for at least 1, or 'auto'"
    if kind == "cpu" and (isinstance(devices, (list, tuple)) or "," in str(devices)):
        return "lists device indices, but a CPU run takes a count of processes (e.g. trainer.devices: 2)"
    return None


def _device_counts() -> dict[str, int]:
    """How many devices torch sees of each accelerator kind Lightning names."""
    import torch  # not at import time: the command line's other subcommands never need it

    cuda = torch.cuda.device_count()
    mps = int(torch.backends.mps.is_available())
    tpu = int(importlib.util.find_spec("torch_xla") is not None)  # present or not: see _UNCOUNTED
    return {"gpu": cuda or mps, "cuda": cuda, "mps": mps, "tpu": tpu}


def _describe(counts: dict[str, int]) -> str:
    parts = [f"{counts['cuda']} CUDA device(s)", f"MPS {'available' if counts['mps'] else 'unavailable'}"]
    return "torch sees " + ", ".join(parts) + ("" if counts["tpu"] else ", no torch_xla for TPUs")


def _requested_indices(devices: Any) -> set[int] | None:
    """The device indices ``trainer.devices`` asks for (a count n means 0..n-1); None for every device or unknown."""
    if devices in _ALL_DEVICES or devices is None:
        return None
    parts = devices if isinstance(devices, (list, tuple)) else str(devices).split(",")
    texts = [str(part).strip() for part in parts if str(part).strip()]
    if not all(text.isdigit() for text in texts):
        return None  # not a count or indices: Lightning's own parser says what is wrong
    if isinstance(devices, (list, tuple)) or "," in str(devices):
        return {int(text) for text in texts}
    return set(range(int(texts[0]))) if texts else None


def _model_issues(config: SCConfig) -> list[ConfigIssue]:
    """Model and tokenizer names that resolve to nothing here (nothing is downloaded at run time), and model
    directories whose ``config.json`` describes a model that cannot train (one issue per problem)."""
    names = [("policy.model_name", config.policy.model_name, _model_problem)]
    if config.policy.tokenizer_name is not None:
        names.append(("policy.tokenizer_name", config.policy.tokenizer_name, _tokenizer_problem))
    if config.value is not None:
        names.append(("value.model_name", config.value.model_name, _model_problem))
    issues = []
    for knob, name, problem_of in names:
        problem = problem_of(name)
        if problem:
            issues.append(ConfigIssue(knob, f"is {name!r}: {problem}"))
        elif problem_of is _model_problem and not name.startswith("builtin:"):
            issues += [ConfigIssue(knob, line) for line in _architecture_problems(name)]
    if not _model_problem(config.policy.model_name):
        issues += _vision_issues(config.policy.model_name, config.policy.is_vlm)
    return issues


def _vision_issues(name: str, is_vlm: bool) -> list[ConfigIssue]:
    """``policy.is_vlm`` disagreeing with what the policy ``name`` is (a vision-language model or a text one)."""
    if is_vlm == _is_vision_language(name):
        return []
    if is_vlm:
        return [
            ConfigIssue(
                "policy.is_vlm",
                f"is true, but policy.model_name ({name!r}) is a text model; use builtin:tiny-vlm or its CLEVR warm "
                "start builtin:tiny-vlm-clevr (no Hugging Face VLM architecture imports yet, docs/vlm.md)",
            )
        ]
    return [
        ConfigIssue(
            "policy.is_vlm",
            f"is false, but policy.model_name ({name!r}) is a vision-language model; set policy.is_vlm: true",
        )
    ]


def _is_vision_language(name: str) -> bool:
    """Whether the loadable model ``name`` is a vision-language one: a built-in (or the warm start of one) with a
    vision side, or a model directory with a vision config (a warm-started VLM's)."""
    from sc_lightning.models.hf_dir import read_vision_config
    from sc_lightning.models.spec import BUILTIN_SPECS
    from sc_lightning.models.warm_start import WARM_STARTS

    if name.startswith("builtin:"):
        return BUILTIN_SPECS[WARM_STARTS[name].base if name in WARM_STARTS else name].vision is not None
    root = _local_dir(name)
    return root is not None and read_vision_config(root) is not None


def _model_problem(name: str) -> str | None:
    """Why the model ``name`` cannot be loaded here, or None."""
    from sc_lightning.models.spec import BUILTIN_SPECS
    from sc_lightning.models.warm_start import WARM_STARTS

    known = sorted({*BUILTIN_SPECS, *WARM_STARTS})
    if name.startswith("builtin:"):
        return None if name in known else f"unknown built-in model; known: {', '.join(known)}"
    root = _local_dir(name)
    if root is None:
        return (
            "neither a local directory nor a model in the local Hugging Face cache (nothing is downloaded at run "
            f"time); give the path of a Hugging Face model directory, download it beforehand, or use a built-in: "
            f"{', '.join(known)}"
        )
    if not (root / "config.json").is_file():
        return f"{root} has no config.json, so it is not a Hugging Face model directory; point at the one that has"
    return None


def _architecture_problems(name: str) -> list[str]:
    """Why the model directory ``name`` (which has a config.json) cannot train, each naming its config.json and the
    architecture or key at fault."""
    from sc_lightning.models.hf_config import hf_config_problems

    root = _local_dir(name)
    if root is None:
        return []
    config_json = root / "config.json"
    try:
        raw = json.loads(config_json.read_text())
    except (OSError, ValueError) as err:
        return [f"{config_json} is not readable JSON: {err}"]
    if not isinstance(raw, dict):
        return [f"{config_json} holds a JSON {type(raw).__name__}, not the object of a model's config"]
    return [f"{config_json} {problem}" for problem in hf_config_problems(raw)] + _weights_problems(root)


def _weights_problems(root: Path) -> list[str]:
    """The model directory's safetensors files that are missing or whose header does not read (a truncated or
    foreign file); their tensors are not read."""
    from safetensors import SafetensorError, safe_open

    from sc_lightning.models.convert import weight_files

    try:
        files = weight_files(root)
    except (FileNotFoundError, ValueError) as err:
        return [f"{err}; sc_lightning loads a model's weights from safetensors"]
    problems = []
    for file in files:
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            problems.append(f"{file} is not a readable safetensors file: {err}")
    return problems


def _tokenizer_problem(name: str) -> str | None:
    """Why the tokenizer ``name`` cannot be loaded here, or None."""
    from sc_lightning.tokenizer import BUILTIN_TOKENIZER_NAMES

    if name.startswith("builtin:"):
        known = ", ".join(BUILTIN_TOKENIZER_NAMES)
        return None if name in BUILTIN_TOKENIZER_NAMES else f"unknown built-in tokenizer; known: {known}"
    if _local_dir(name) is None:
        return (
            "neither a local directory nor in the local Hugging Face cache (nothing is downloaded at run time); "
            "give a tokenizer's directory, download it beforehand, or leave it unset to use policy.model_name's"
        )
    return None


def _local_dir(name: str) -> Path | None:
    """The local directory of a Hugging Face model or tokenizer ``name``, or None when there is none."""
    from sc_lightning.models.hf_dir import resolve_model_dir

    try:
        return resolve_model_dir(name)
    except FileNotFoundError:
        return None


def _environment_issues(config: SCConfig) -> list[ConfigIssue]:
    """An ``env.name`` that builds no environment here: an unknown name, or a custom class that does not import, is
    of the wrong kind or cannot be built without arguments (the run builds it the same way once it starts)."""
    from sc_lightning.rollout.envs import build_environment
    from sc_lightning.rollout.envs.base import RewardError

    try:
        build_environment(config.env)
    except RewardError as error:
        return [ConfigIssue("env.name", str(error).replace(" (env.name)", "").removeprefix("env.name "))]
    return []


def _dataset_issues(config: SCConfig) -> list[ConfigIssue]:
    """Dataset files that are missing, unreadable or of no known format, or whose schema lacks a column the key knobs
    name (``data.prompt_key``: ``'question' is not a column of ...``); no row is read."""
    from sc_lightning.rollout.dataset_base import BUILTIN_NAMES
    from sc_lightning.rollout.prompt_files import prompt_file_issues

    data = config.data
    names = [("data.dataset_name", data.dataset_name)]
    if config.algo.validates() and data.val_dataset_name is not None:
        names.append(("data.val_dataset_name", data.val_dataset_name))
    issues = []
    for knob, name in names:
        if name not in BUILTIN_NAMES[knob]:
            issues += prompt_file_issues(name, data, knob)[1]
    return issues


def memory_issues(config: SCConfig, trainer: dict[str, Any]) -> list[ConfigIssue]:
    """A GPU run whose trainer rank cannot hold the policy (and critic), a micro-batch and a colocated engine: the
    floor of :mod:`sc_lightning.models.memory` over the first GPU's memory, naming the knob that fixes it."""
    from sc_lightning.models.memory import Parallel, memory_problem, training_memory

    device_bytes = _gpu_bytes(trainer)
    spec = _spec_or_none(config.policy.model_name) if device_bytes else None
    if device_bytes is None or spec is None:
        return []  # a CPU run (host memory is the operating system's to give), or a model name reported above
    policy, megatron = config.policy, config.policy.megatron_cfg
    split = megatron.tensor_model_parallel_size * megatron.pipeline_model_parallel_size
    wanted = _requested_indices(trainer.get("devices", "auto"))
    ranks = (len(wanted) if wanted else _device_counts()["cuda"]) * int(trainer.get("num_nodes") or 1)
    parallel = Parallel(
        megatron.tensor_model_parallel_size,
        megatron.pipeline_model_parallel_size,
        max(1, ranks // split),
        megatron.use_distributed_optimizer,
    )
    longest = policy.max_total_sequence_length  # the micro-batch a long-tailed step can form: rows x the longest
    rows = policy.train_micro_batch_size * longest
    tokens = max(longest, min(rows, policy.train_micro_batch_tokens or rows))
    generation = policy.generation
    plan = training_memory(
        spec,
        precision=policy.precision,
        micro_batch_tokens=tokens,
        parallel=parallel,
        checkpointing=megatron.activation_checkpointing,
        colocated_context=longest if generation.colocated.enabled and generation.backend == "megatron" else None,
        critic=_spec_or_none(config.value.model_name) if config.value is not None else None,
    )
    problem = memory_problem(
        plan,
        device_bytes,
        model_knob="policy.model_name",
        tokens_knob="policy.train_micro_batch_tokens",
        micro_batch_tokens=tokens,
        row=("policy.max_total_sequence_length", longest),
    )
    return [] if problem is None else [ConfigIssue(*problem)]


def _gpu_bytes(trainer: dict[str, Any]) -> int | None:
    """Memory of the first CUDA device when the trainer runs on CUDA GPUs, else None."""
    import torch

    accelerator = trainer.get("accelerator") or "auto"
    if accelerator not in ("gpu", "cuda", "auto") or not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(0).total_memory)


def _spec_or_none(name: str) -> Any:
    """The architecture a model name names (a warm start's base for a warm start), or None where it cannot be read
    here (the model checks report why)."""
    from sc_lightning.models.policy_source import model_spec
    from sc_lightning.models.spec import builtin_spec
    from sc_lightning.models.warm_start import WARM_STARTS

    if name in WARM_STARTS:
        return builtin_spec(WARM_STARTS[name].base)
    try:
        return model_spec(name)
    except (OSError, ValueError, KeyError, NotImplementedError):
        return None


def _endpoint_issues(config: SCConfig) -> list[ConfigIssue]:
    """An endpoint served beyond this machine without an API key: anyone who reaches it could post rewards."""
    from sc_lightning.rollout.serving.listen import is_loopback
    from sc_lightning.rollout_side.parts import (
        http_api_key,
        http_api_key_variable,
        http_host,
        http_knobs,
        http_server_port,
    )

    host = http_host(config)
    if http_server_port(config) is None or is_loopback(host) or http_api_key(config) is not None:
        return []
    knobs, variable = http_knobs(config), http_api_key_variable(config)
    return [
        ConfigIssue(
            f"{knobs}http_host",
            f"is {host!r}, serving the endpoint beyond this machine, but the environment variable {variable} "
            f"({knobs}http_api_key_env) holds no API key: without one anyone who reaches the port could generate and "
            f"post rewards into training. Export a key in {variable} (clients send 'Authorization: Bearer <key>'), "
            "or serve on 127.0.0.1",
        )
    ]


def _generation_issues(config: SCConfig) -> list[ConfigIssue]:
    """vLLM generation on a machine without vLLM."""
    if config.policy.generation.backend != "vllm":
        return []
    from sc_lightning.engines.base import EngineError
    from sc_lightning.engines.vllm import require_vllm

    try:
        require_vllm()
    except EngineError as err:
        return [ConfigIssue("", str(err))]
    return []


def _directory_issues(config: SCConfig, trainer: dict[str, Any]) -> list[ConfigIssue]:
    """Directories the run writes (logs and run info; bundles with checkpointing on) that it cannot create or write."""
    directories = [("trainer.default_root_dir", trainer.get("default_root_dir") or os.getcwd())]
    if config.checkpointing.enabled:
        directories.append(("checkpointing.checkpoint_dir", config.checkpointing.checkpoint_dir))
    issues = []
    for knob, directory in directories:
        problem = _writable_dir_problem(Path(directory).expanduser())
        if problem:
            issues.append(ConfigIssue(knob, f"is {str(directory)!r}, which {problem}; choose a writable directory"))
    return issues


def _writable_dir_problem(path: Path) -> str | None:
    """Why the run cannot create ``path`` as a directory, or write into it; None when it can."""
    if path.exists():
        if not path.is_dir():
            return "is a file, not a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else "is not writable"
    ancestor = path.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot be created: {ancestor} is a file"
    return None if os.access(ancestor, os.W_OK | os.X_OK) else f"cannot be created: {ancestor} is not writable"
