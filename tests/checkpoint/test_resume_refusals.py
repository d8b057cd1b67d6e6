"""A resume that cannot work, through the command line: one ``error: cannot resume:`` line, exit 3, nothing started.

One two-step fit writes the bundle every test here reads (never changes): resumes with another seed, batch size,
shuffle setting, group size or a buffer smaller than the bundle holds are refused before any model, engine, Ray or
data plane starts; ``validate --ckpt_path`` checks the bundle's manifest as ``fit`` does and takes its
``trainer.ckpt`` too.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.cli import run
from tests.helpers.configs import TINY

pytestmark = pytest.mark.slow

QUICK = ("--config", TINY, "--config", "configs/colocated.yaml", "--data_plane.backend", "memory")
QUICK += ("--trainer.enable_progress_bar=false",)


def checkpointing(root: Path) -> list[str]:
    """Bundles in ``root/ckpt``, logs in ``root``."""
    return [
        "--checkpointing.enabled=true",
        "--checkpointing.save_data_plane=true",
        f"--checkpointing.checkpoint_dir={root / 'ckpt'}",
        f"--trainer.default_root_dir={root}",
    ]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run's root after two steps with seed 7, 8 groups of 8 per step, its bundle in ``ckpt/step_2`` holding at least
    one buffered group of step 3 (the group-size refusal needs one)."""
    root = tmp_path_factory.mktemp("finished")
    holds = '--trainer.callbacks=[{"class_path": "tests.helpers.callbacks.BundleHoldsABufferedGroup"}]'
    result = run("fit", *QUICK, *checkpointing(root), "--grpo.max_num_steps=2", holds)
    assert result.returncode == 0, result.stderr[-3000:]
    assert held_groups(root / "ckpt" / "step_2")[0] >= 1, "the bundle holds a buffered group"
    return root


def held_groups(bundle: Path) -> tuple[int, int]:
    """The bundle's buffered groups and dispatched pending groups: those that held buffer permits at its cut."""
    state = json.loads((bundle / "controller_state.json").read_text())
    groups = json.loads((bundle / "replay_index.json").read_text())["groups"]
    return len(groups) - state["claimed"], state["pending_holding_permits"]


def the_error(stderr: str) -> str:
    """The one ``error:`` line of a command that printed no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    (error,) = [line for line in stderr.splitlines() if line.startswith("error:")]
    return error


def assert_refused_before_anything_starts(root: Path, change: list[str], said: str) -> None:
    """Exit 3, ``said`` in the one error line, and no new log directory, banner or resume line."""
    result = run("fit", *QUICK, *checkpointing(root), "--grpo.max_num_steps=4", *change)
    assert result.returncode == 3, result.stderr[-3000:]
    error = the_error(result.stderr)
    assert error.startswith(f"error: cannot resume: {root}/ckpt/step_2 does not fit this run: "), error
    assert said in error
    assert error.endswith("or start afresh with a new checkpointing.checkpoint_dir (nothing was deleted)")
    assert sorted(p.name for p in (root / "lightning_logs").iterdir()) == ["version_0"]  # no Trainer was built
    assert "resuming from" not in result.stderr and "sc_lightning grpo:" not in result.stderr  # no banner


BIGGER_STEPS = ["--grpo.num_prompts_per_step=16", "--policy.train_global_batch_size=128"]
BIGGER_STEPS += ["--policy.train_micro_batch_size=128", "--async_rl.min_groups_for_streaming_train=16"]
BIGGER_STEPS += ["--async_rl.max_buffered_rollouts=16", "--async_rl.max_inflight_prompts=16"]
SMALLER_GROUPS = ["--grpo.num_generations_per_prompt=4", "--policy.train_global_batch_size=32"]
SMALLER_GROUPS += ["--policy.train_micro_batch_size=32"]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (["--grpo.seed=8"], "grpo.seed is 8 but the checkpoint's prompt stream has 7"),
        (BIGGER_STEPS, "grpo.num_prompts_per_step is 16 but the checkpoint's prompt stream has 8"),
        (["--data.shuffle=false"], "data.shuffle is false but the checkpoint's prompt stream has true"),
        (SMALLER_GROUPS, "grpo.num_generations_per_prompt is 4 but the checkpoint's buffered group"),
    ],
    ids=["seed", "batch-size", "shuffle", "group-size"],
)
def test_another_prompt_stream_or_group_size_is_refused_before_anything_starts(
    finished: Path, change: list[str], said: str
) -> None:
    """Another seed, batch size, shuffle setting or group size than the bundle's."""
    assert_refused_before_anything_starts(finished, change, said)


def test_a_buffer_smaller_than_the_bundle_holds_is_refused_before_anything_starts(finished: Path) -> None:
    """One permit fewer than the bundle's groups held (a windowed sampler, so that buffer is a valid config)."""
    buffered, dispatched = held_groups(finished / "ckpt" / "step_2")
    held = buffered + dispatched
    assert held >= 2, "the bundle holds step 3's groups: the pump dispatches them at step 2's refit"
    smaller = ["--policy.generation.colocated.enabled=false", "--async_rl.sampler.name=windowed"]
    smaller += ["--async_rl.min_groups_for_streaming_train=1", f"--async_rl.max_buffered_rollouts={held - 1}"]
    smaller += [f"--async_rl.max_inflight_prompts={held - 1}"]
    said = (
        f"async_rl.max_buffered_rollouts is {held - 1} but the checkpoint holds {buffered} buffered and {dispatched} "
        f"dispatched prompt groups; resume with async_rl.max_buffered_rollouts >= {held}"
    )
    assert_refused_before_anything_starts(finished, smaller, said)


def test_validate_refuses_a_truncated_trainer_checkpoint_by_its_manifest(finished: Path, tmp_path: Path) -> None:
    """As fit does: exit 3 naming the file and MANIFEST.json, no torch traceback."""
    bundle = shutil.copytree(finished / "ckpt" / "step_2", tmp_path / "step_2")
    trainer_ckpt = bundle / "trainer.ckpt"
    trainer_ckpt.write_bytes(trainer_ckpt.read_bytes()[:1000])
    result = run("validate", *QUICK, f"--trainer.default_root_dir={tmp_path}", "--ckpt_path", str(bundle))
    assert result.returncode == 3, result.stderr[-3000:]
    error = the_error(result.stderr)
    assert error.startswith(f"error: cannot resume: {trainer_ckpt}: does not match MANIFEST.json"), error


def test_validate_takes_the_trainer_checkpoint_inside_a_bundle(finished: Path, tmp_path: Path) -> None:
    """``--ckpt_path BUNDLE/trainer.ckpt`` validates that bundle's policy, version 2."""
    ckpt = finished / "ckpt" / "step_2" / "trainer.ckpt"
    result = run("validate", *QUICK, f"--trainer.default_root_dir={tmp_path}", "--ckpt_path", str(ckpt))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "validation.json").read_text())["step"] == 2


def test_a_model_of_another_shape_is_refused_in_one_line(finished: Path, tmp_path: Path) -> None:
    """Found as the trainer checkpoint loads: exit 3, torch's reason and the fix, no traceback."""
    root = shutil.copytree(finished, tmp_path / "run")
    result = run("fit", *QUICK, *checkpointing(root), "--grpo.max_num_steps=4", "--policy.model_name=builtin:small")
    assert result.returncode == 3, result.stderr[-3000:]
    error = the_error(result.stderr)
    assert error.startswith(f"error: cannot resume: {root}/ckpt/step_2/trainer.ckpt: its models do not fit"), error
    assert "Missing key(s) in state_dict" in error and "size mismatch for" in error  # 12 layers, not 2, wider
    assert "resume with the model and optimizer settings of the run that wrote it" in error


def test_a_dataset_of_another_size_is_refused_in_one_line_once_it_is_loaded(finished: Path, tmp_path: Path) -> None:
    """The restore's own check (the dataset must be loaded to count it) ends the same way: exit 3, no traceback."""
    root = shutil.copytree(finished, tmp_path / "run")
    rows = [json.dumps({"problem": f"{a}+{b}=", "expected_answer": str(a + b)}) for a in range(4) for b in range(4)]
    (tmp_path / "prompts.jsonl").write_text("\n".join(rows) + "\n")
    other = [f"--data.dataset_name={tmp_path / 'prompts.jsonl'}"]
    result = run("fit", *QUICK, *checkpointing(root), "--grpo.max_num_steps=4", *other)
    assert result.returncode == 3, result.stderr[-3000:]
    error = the_error(result.stderr)
    assert error.startswith("error: cannot resume: the number of prompts of data.dataset_name is 16 but the "), error
    assert "checkpoint's prompt stream has 512" in error
