"""The tiny example on two trainer ranks (CPU, gloo), started by Lightning's launcher from the real CLI.

Runs at DP=2, then TP=2, then PP=2, each resuming the last one's bundle (resharded), train every prompt exactly once
(resharding back to DP=2: tests/trainer/test_sharded_checkpoint.py); scripts/kill_drill.py's SIGKILL of the
non-leader rank ends the whole run within a deadline with that rank named, and the same command resumes with nothing
lost or trained twice (its AdamW state sliced over the two replicas by megatron's distributed optimizer); SIGKILL of
the leader ends the other rank within seconds, and the same command resumes from the newest bundle.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from megatron.core import dist_checkpointing

from tests.helpers.cli import child_rank_pid, run, start, user_environment, wait_for
from tests.helpers.configs import REPO, TINY_PATH
from tests.helpers.recovery import assert_each_prompt_trained_once, command, write_dataset

pytestmark = pytest.mark.slow

TWO_RANKS = (TINY_PATH, REPO / "tests" / "small_steps.yaml")  # the tiny example (engine in a Ray actor), small steps
ASYNC = ("--async_rl.max_buffered_rollouts", "8", "--async_rl.max_inflight_prompts", "8")  # one step ahead, as tiny


@pytest.mark.long(minutes=3)
@pytest.mark.timeout(900)
def test_the_kill_drill_on_two_ranks_ends_the_run_naming_the_rank_and_resumes_every_prompt_once(
    tmp_path: Path,
) -> None:
    """scripts/kill_drill.py (what scripts/gpu_multi.sh runs on two GPUs): SIGKILL of rank 1 after two bundles ends
    the run within 30 s naming it, and the same command resumes, its AdamW state sliced over the two replicas."""
    write_dataset(tmp_path / "prompts.jsonl")
    sliced = ("--policy.megatron_cfg.use_distributed_optimizer", "true")  # AdamW state sliced over the replicas
    fit = [arg for path in TWO_RANKS for arg in ("--config", str(path))] + [
        "--data.dataset_name", str(tmp_path / "prompts.jsonl"),
        "--grpo.max_num_epochs", "1",  # one epoch: the drill's "exactly once" is each prompt in one group
        "--grpo.max_num_steps", "1000",  # the dataset ends the run
        "--data_plane.backend", "simple",
        "--trainer.devices", "2", *ASYNC, *sliced,
    ]  # fmt: skip
    run_dir = tmp_path / "drill"
    drill = [sys.executable, "scripts/kill_drill.py", "--dir", str(run_dir), "--save-period", "3"]
    drill += ["--end-within-s", "30", "--", *fit]
    done = subprocess.run(drill, cwd=REPO, env=user_environment(), capture_output=True, text=True, timeout=800)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("PASSED"), done.stdout + done.stderr[-3000:]
    assert "killed rank 1 (pid" in done.stdout and "it named the rank: " in done.stdout
    assert_each_prompt_trained_once(run_dir)  # every prompt of the dataset, not only those trained: none lost
    bundles = list((run_dir / "checkpoints").glob("step_*"))
    assert len(bundles) >= 2
    for bundle in bundles:
        common = dist_checkpointing.load_common_state_dict(str(bundle / "sharded"))
        assert common["policy"]["optimizer_form"] == "distributed"


@pytest.mark.long(minutes=1.5)
@pytest.mark.timeout(600)
def test_sigkill_of_the_leader_ends_the_other_rank_within_seconds_and_the_same_command_resumes(tmp_path: Path) -> None:
    """The leader is the parent of the rank Lightning's launcher started: that rank ends within seconds, whichever
    notices first — its parent watch (sc_lightning/trainer/parent_watch.py, which says so; pinned alone by
    tests/trainer/test_parent_watch.py) or, when it is in a collective with the leader, gloo's broken connection."""
    write_dataset(tmp_path / "prompts.jsonl")
    argv = command(tmp_path, TWO_RANKS, "--trainer.devices", "2", *ASYNC, "--checkpointing.save_period", "2")
    first = start(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    bundles = tmp_path / "checkpoints"
    if not wait_for(lambda: any(bundles.glob("step_*")), first, "a bundle"):
        raise AssertionError(f"the run ended early: {first.communicate()[1].decode()[-3000:]}")
    rank1 = child_rank_pid(first.pid, 1)
    assert rank1 is not None
    os.kill(first.pid, signal.SIGKILL)
    killed = time.monotonic()
    stderr = first.communicate(timeout=120)[1].decode()  # returns once rank 1, which shares the pipe, has ended too
    assert time.monotonic() - killed < 30, f"rank 1 outlived the leader by {time.monotonic() - killed:.0f} s"
    ended = (
        f"trainer rank 1: its parent process {first.pid} (the launcher or the leader rank) has ended",
        "remote worker",
    )
    assert any(reason in stderr for reason in ended), stderr[-3000:]
    newest = max(int(path.name.split("_")[1]) for path in bundles.glob("step_*"))
    resumed = run(*argv[3:], "--grpo.max_num_steps", str(newest + 2), timeout_s=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {bundles / f'step_{newest}'}" in resumed.stderr


@pytest.mark.long(minutes=3.5)
@pytest.mark.timeout(900)
def test_bundles_resume_across_dp2_tp2_and_pp2_training_every_prompt_once(tmp_path: Path) -> None:
    """Bundles hold megatron-core distributed checkpoints: each resume reshards the policy and its AdamW state."""
    write_dataset(tmp_path / "prompts.jsonl")
    tp2 = ("--policy.megatron_cfg.tensor_model_parallel_size", "2")
    pp2 = ("--policy.megatron_cfg.pipeline_model_parallel_size", "2")
    split = {(): "TP 1 x PP 1 x DP 2", tp2: "TP 2 x PP 1 x DP 1", pp2: "TP 1 x PP 2 x DP 1"}
    for steps, layout in ((4, ()), (8, tp2), (12, pp2)):
        extra = ("--grpo.max_num_steps", str(steps), "--checkpointing.save_period", "2", *layout)
        argv = command(tmp_path, TWO_RANKS, "--trainer.devices", "2", *ASYNC, *extra)
        result = run(*argv[3:], timeout_s=400)
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"trainer: 2 ranks = {split[layout]}" in result.stderr  # the layout asked for is the one trained
        assert (steps == 4) != (f"resuming from {tmp_path / 'checkpoints' / f'step_{steps - 4}'}" in result.stderr)
        assert (tmp_path / "checkpoints" / f"step_{steps}" / "sharded" / ".metadata").is_file()
    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    assert Counter(row["step"] for row in rows) == dict.fromkeys(range(12), 16)  # both replicas' rows, logged once
    per_prompt = Counter(row["prompt_index"] for row in rows)
    assert len(per_prompt) == 12 * 4 and set(per_prompt.values()) == {4}
    for metrics in tmp_path.glob("lightning_logs/version_*/metrics.csv"):  # one logger per run: the leader's
        header, *lines = metrics.read_text().splitlines()
        index = header.split(",").index("train/num_valid_samples")
        counted = [float(line.split(",")[index]) for line in lines if line.split(",")[index]]
        assert counted == [16.0] * 4  # every row of the step, over both replicas (one replica trains about 8)
