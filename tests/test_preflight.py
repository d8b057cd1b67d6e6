"""What a config needs from this machine is checked before anything starts, by ``fit`` and ``fit --dry_run`` alike.

Each test calls the command line in this process (``main([...])``): a refused config ends with exit code 2 and
one ``error:`` block naming the dotpath, the value and the fix, before any model, engine, Ray or Trainer starts
(no ``lightning_logs`` under the run's root). The device counts torch reports are pinned, so the outcome does not
depend on the machine the tests run on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from sc_lightning.cli.main import main
from sc_lightning.models.spec import BUILTIN_SPECS
from sc_lightning.models.warm_start import WARM_STARTS
from tests.helpers.configs import REPO

TINY = "configs/grpo_tiny.yaml"
QUICK = ("--config", TINY, "--config", "configs/colocated.yaml", "--data_plane.backend", "memory")


@pytest.fixture(autouse=True)
def _cpu_only_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from the repository on a machine whose torch sees no CUDA or MPS device."""
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run ``python -m sc_lightning *args``; assert exit code 2 and no traceback; return stderr."""
    code = main(list(args))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("command", [("fit", "--dry_run"), ("fit",), ("validate",)], ids=lambda c: "-".join(c))
def test_a_gpu_accelerator_on_a_machine_without_one_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: tuple[str, ...]
) -> None:
    """``--trainer.accelerator gpu`` (and cuda, mps) with no such device: exit 2 naming the knob and what torch sees."""
    for accelerator in ("gpu", "cuda", "mps"):
        args = (*QUICK, f"--trainer.accelerator={accelerator}", f"--trainer.default_root_dir={tmp_path}")
        err = refused(capsys, command[0], *args, *command[1:])
        assert f"trainer.accelerator: is '{accelerator}' but this machine has no " in err
        assert "torch sees 0 CUDA device(s), MPS unavailable" in err and "set trainer.accelerator: cpu" in err
    assert not (tmp_path / "lightning_logs").exists()


def test_more_devices_than_the_machine_has_are_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One CUDA device: asking for device index 1 is exit 2 naming trainer.devices and the count."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    err = refused(capsys, "fit", *QUICK, "--trainer.accelerator=cuda", "--trainer.devices=[1]", "--dry_run")
    assert "trainer.devices: is [1], asking for cuda device(s) [1], but this machine has 1" in err


def test_an_accelerator_name_lightning_does_not_know_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(capsys, "fit", *QUICK, "--trainer.accelerator=gpuu", "--dry_run")
    assert "trainer.accelerator: is 'gpuu', which Lightning does not know; did you mean gpu?" in err


@pytest.mark.parametrize(
    ("devices", "said"),
    [
        ("lots", "is 'lots': not a device count, a list of device indices, 'auto' or -1"),
        ("0", "is 0: asks for no device; ask for at least 1, or 'auto'"),
        ("-5", "is -5: not a device count"),
        ("[0,1]", "is [0, 1]: lists device indices, but a CPU run takes a count of processes"),
    ],
)
def test_a_devices_value_lightning_would_refuse_is_refused_at_dry_run(
    capsys: pytest.CaptureFixture[str], devices: str, said: str
) -> None:
    """On a CPU run too (which always fits the machine): Lightning's Trainer would raise on it after the start."""
    err = refused(capsys, "fit", *QUICK, "--data_plane.backend=simple", f"--trainer.devices={devices}", "--dry_run")
    assert f"trainer.devices: {said}" in err


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry_run", "fit"])
def test_unknown_built_in_models_and_missing_model_paths_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, dry_run: bool
) -> None:
    """Every model and tokenizer knob: an unknown built-in lists the known ones, warm-started names included."""
    args = (
        "fit",
        "--config",
        "configs/ppo_tiny.yaml",
        "--policy.model_name=builtin:tiny-arithmetic",
        f"--policy.tokenizer_name={tmp_path / 'no-tokenizer'}",
        f"--value.model_name={tmp_path / 'no-model'}",
        f"--trainer.default_root_dir={tmp_path}",
    )
    err = refused(capsys, *args, *(["--dry_run"] if dry_run else []))
    known = sorted({*BUILTIN_SPECS, *WARM_STARTS})  # every built-in shape and warm start, by name
    assert "builtin:tiny" in known and "builtin:tiny-arith" in known
    assert f"policy.model_name: is 'builtin:tiny-arithmetic': unknown built-in model; known: {', '.join(known)}" in err
    assert f"policy.tokenizer_name: is '{tmp_path / 'no-tokenizer'}': neither a local directory" in err
    assert f"value.model_name: is '{tmp_path / 'no-model'}': neither a local directory" in err
    assert "3 problems" in err
    assert not (tmp_path / "lightning_logs").exists()


def test_a_model_directory_of_an_architecture_or_feature_not_trained_is_refused_at_dry_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """config.json names another architecture, or a feature megatron-core cannot hold: one line naming the file and
    the architecture (with the supported list) or the key."""
    configs = {
        "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral"},
        "sliding": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": True},
    }
    for name, config in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    mistral, sliding = (tmp_path / name / "config.json" for name in configs)
    err = refused(capsys, "fit", *QUICK, f"--policy.model_name={mistral.parent}", "--dry_run")
    assert (
        f"policy.model_name: {mistral} has architectures ['MistralForCausalLM']; sc_lightning trains "
        "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"
    ) in err
    err = refused(capsys, "fit", *QUICK, f"--policy.model_name={sliding.parent}", "--dry_run")
    assert f"policy.model_name: {sliding} has use_sliding_window: true; sliding-window attention is not" in err


def test_a_model_directory_whose_weights_or_config_do_not_read_is_refused_at_dry_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A config.json that is no object, a directory without safetensors weights, a truncated safetensors file: each
    is named before anything starts (the load would fail with a traceback after the run started)."""
    qwen = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    cases = {"listed": ([1, 2], None), "weightless": (qwen, None), "truncated": (qwen, b"\x10\x00\x00\x00\x00")}
    for name, (config, weights) in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        if weights is not None:
            (tmp_path / name / "model.safetensors").write_bytes(weights)
    said = {
        "listed": f"{tmp_path / 'listed' / 'config.json'} holds a JSON list, not the object of a model's config",
        "weightless": f"{tmp_path / 'weightless'} has neither model.safetensors nor model.safetensors.index.json",
        "truncated": f"{tmp_path / 'truncated' / 'model.safetensors'} is not a readable safetensors file",
    }
    for name, text in said.items():
        err = refused(capsys, "fit", *QUICK, f"--policy.model_name={tmp_path / name}", "--dry_run")
        assert f"policy.model_name: {text}" in err


def test_a_checkpoint_directory_that_cannot_be_created_is_refused_before_any_step(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """checkpointing.checkpoint_dir under a regular file (and a root dir that is a file): exit 2, nothing trained."""
    (tmp_path / "a-file").write_text("")
    args = (
        "fit",
        *QUICK,
        "--checkpointing.enabled=true",
        "--checkpointing.save_data_plane=true",
        f"--checkpointing.checkpoint_dir={tmp_path / 'a-file' / 'checkpoints'}",
        f"--trainer.default_root_dir={tmp_path / 'root'}",
        "--grpo.max_num_steps=2",
    )
    err = refused(capsys, *args)
    assert (
        f"checkpointing.checkpoint_dir: is '{tmp_path / 'a-file' / 'checkpoints'}', which cannot be created: "
        f"{tmp_path / 'a-file'} is a file; choose a writable directory"
    ) in err
    assert not (tmp_path / "root").exists()
    err = refused(capsys, "fit", *QUICK, f"--trainer.default_root_dir={tmp_path / 'a-file'}", "--dry_run")
    assert f"trainer.default_root_dir: is '{tmp_path / 'a-file'}', which is a file, not a directory" in err


def test_a_dry_run_finds_missing_dataset_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Training and validation prompt files that do not exist: exit 2 naming each knob and path."""
    missing = tmp_path / "prompts.jsonl"
    args = (
        "fit",
        *QUICK,
        f"--data.dataset_name={missing}",
        f"--data.val_dataset_name={tmp_path / 'val.jsonl'}",
        "--grpo.val_period=1",
        "--dry_run",
    )
    err = refused(capsys, *args)
    assert f"data.dataset_name: is '{missing}': no such file" in err
    assert f"data.val_dataset_name: is '{tmp_path / 'val.jsonl'}': no such file" in err


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("nope", "env.name: unknown environment 'nope'; known: arithmetic, clevr,"),
        ("nope.mod:Cls", "env.name: 'nope.mod:Cls': cannot import module 'nope.mod'"),
        ("collections:OrderedDict", "env.name: 'collections:OrderedDict' is not an Environment: it needs a name"),
    ],
)
def test_a_dry_run_finds_an_environment_that_cannot_be_built(
    capsys: pytest.CaptureFixture[str], name: str, said: str
) -> None:
    """An env.name the run could not build once started (after Ray and the data plane were up, before this check)."""
    err = refused(capsys, "fit", *QUICK, f"--env.name={name}", "--dry_run")
    assert said in err


def test_a_dry_run_finds_a_missing_vllm(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """generation.backend vllm where vLLM cannot be imported: the dry run refuses it, as fit does."""
    monkeypatch.setitem(sys.modules, "vllm", None)  # importlib finds no vllm
    err = refused(capsys, "fit", "--config", "configs/grpo_tiny_vllm.yaml", "--dry_run")
    assert "policy.generation.backend is 'vllm' but vLLM is not installed" in err


@pytest.mark.parametrize(
    "args",
    [
        ("fit", "--config", TINY, "--grpo.max_num_steps", "--trainer.max_time", "5"),
        ("fit", "--grpo.max_num_steps", "--dry_run"),
        ("fit", "--config", "--grpo.max_num_steps", "2"),
        ("fit", "-c", "--dry_run"),
        ("validate", "--config", TINY, "--ckpt_path", "--grpo.seed", "3"),
    ],
    ids=["override-before-override", "override-before-flag", "config", "short-config", "ckpt_path"],
)
def test_an_option_missing_its_value_is_a_usage_error_naming_it(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    """The next option is never taken as the value: exit 2 and an error naming the option that lacks one."""
    option = next(a for i, a in enumerate(args) if a.startswith("-") and args[i + 1].startswith("--"))
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert f"error: {option} needs a value, but the next argument is the option " in err


@pytest.mark.parametrize(
    ("device_gib", "extra", "expected"),
    [
        (80, (), None),  # the long example as shipped fits an 80 GB GPU
        (16, (), "policy.train_micro_batch_tokens: needs at least"),  # its 32K-token micro-batches do not fit 16 GB
        (80, ("--policy.train_micro_batch_tokens", "null"), "policy.train_micro_batch_tokens: needs at least"),
        (4, (), "policy.model_name: needs at least"),  # nor does the 312M model's state fit 4 GB
    ],
)
def test_a_gpu_run_that_cannot_fit_its_device_is_refused_naming_the_knob(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    device_gib: int,
    extra: tuple[str, ...],
    expected: str | None,
) -> None:
    """One CUDA device of ``device_gib``: the memory floor (sc_lightning/models/memory.py) is checked at start."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    properties = type("Properties", (), {"total_memory": device_gib * 1024**3})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: properties)
    args = ("fit", "--config", "configs/grpo_1gpu_long.yaml", *extra, "--dry_run")
    if expected is None:
        assert main(list(args)) == 0, capsys.readouterr().err
        return
    err = refused(capsys, *args)
    assert expected in err and f"on a {device_gib}.0 GiB device" in err
    assert "set it to at most" in err or "does not fit one rank" in err


@pytest.mark.parametrize(
    ("model", "is_vlm", "text"),
    [
        ("builtin:tiny", True, "is a text model; use builtin:tiny-vlm"),
        ("builtin:tiny-vlm", False, "is a vision-language model; set policy.is_vlm: true"),
        ("builtin:tiny-arith", True, "no Hugging Face VLM architecture imports yet"),
    ],
)
def test_policy_is_vlm_must_say_what_the_model_is(model: str, is_vlm: bool, text: str) -> None:
    from sc_lightning.cli.load import LIGHTNING_KEYS
    from sc_lightning.config import load_config
    from sc_lightning.preflight import preflight_issues
    from tests.helpers.configs import variant

    def vision_issues(model: str, is_vlm: bool) -> list[str]:
        config = load_config(
            variant({"policy": {"model_name": model, "is_vlm": is_vlm}}), extra_top_level=LIGHTNING_KEYS
        )
        return [issue.message for issue in preflight_issues(config, {}) if issue.path == "policy.is_vlm"]

    assert any(text in message for message in vision_issues(model, is_vlm))
    assert vision_issues("builtin:tiny-vlm", True) == vision_issues("builtin:tiny", False) == []
