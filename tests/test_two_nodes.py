"""Two trainer nodes on one box, started as a cluster starts them: a two-node Ray cluster on 127.0.0.1 and two node
processes (one rank each, joined at MASTER_ADDR; by Lightning's launcher with NODE_RANK 0 and 1, or by torchrun with
--node-rank 0 and 1) from ``scripts/two_nodes_local.sh``; and the SLURM recipe, dry-run.

The Ray head has no CPUs (as Ray advises for large clusters), so the engine and the TransferQueue data plane live on
the second Ray node: every rank reads its rows across the Ray cluster. GRPO trains 4 steps as DP=2 (one replica per
node, started by torchrun) and PPO as TP=2 (each layer split across the nodes, by Lightning's launcher), every prompt
exactly once. Four ranks, two per node, write a bundle together and resume from it. These
runs share one two-node Ray cluster (the script's ``RAY_CLUSTER``), as runs on a long-lived cluster do; a node that
dies is tested on the script's own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import child_pid, step_metrics, user_environment, wait_for
from tests.helpers.configs import REPO
from tests.helpers.recovery import assert_trained_once, write_dataset
from tests.helpers.shims import install_shims
from tests.helpers.two_nodes import TwoNodes, finish, start_two_nodes, two_node_cluster, two_node_run

STEPS = 4
ROWS_PER_STEP = 16  # 4 groups x 4 generations (tests/small_steps.yaml, tests/small_ppo_steps.yaml)
ALGOS = {  # the configs, and the first step that trains the policy (PPO's critic warms up for one)
    "grpo": (("--config", "configs/grpo_tiny.yaml", "--config", "tests/small_steps.yaml"), 0),
    "ppo": (("--config", "configs/ppo_tiny.yaml", "--config", "tests/small_ppo_steps.yaml"), 1),
}
LAYOUTS = {"dp2": ("TP 1 x PP 1 x DP 2", "1"), "tp2": ("TP 2 x PP 1 x DP 1", "2")}
CASES = [  # each algorithm, layout and launcher once (the bundle test: GRPO, DP=2 across the nodes, Lightning)
    ("grpo", "dp2", "torchrun"),
    ("ppo", "tp2", "lightning"),
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    """One two-node Ray cluster (a head of no CPUs, a second node of 4) that the runs of the tests below join, each
    with its own node processes, engine and data plane; the dead-node test starts the script's own cluster, as a
    user's run does."""
    with two_node_cluster(head_cpus=0, node1_cpus=4) as env:
        yield env


def _fit(tmp_path: Path, algo: str, steps: int, tp: str) -> list[str]:
    """``fit``'s arguments: ``algo``'s tiny example at 4 groups x 4 generations for ``steps`` steps on a dataset it
    writes in ``tmp_path``, one step ahead, TransferQueue as the data plane, the train-data log on, TP ``tp``."""
    configs, _ = ALGOS[algo]
    dataset = tmp_path / "prompts.jsonl"
    write_dataset(dataset)
    return [
        *configs,
        f"--{algo}.max_num_steps", str(steps),
        f"--{algo}.max_num_epochs", "1",
        "--data.dataset_name", str(dataset),
        "--data.train_data_log", "true",
        "--data_plane.backend", "simple",
        "--async_rl.max_buffered_rollouts", "8",  # one step ahead, as the tiny examples
        "--async_rl.max_inflight_prompts", "8",
        "--policy.megatron_cfg.tensor_model_parallel_size", tp,
        *(["--value.megatron_cfg.tensor_model_parallel_size", tp] if algo == "ppo" else []),
        "--trainer.default_root_dir", str(tmp_path),
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip


def _assert_steps_trained_once(tmp_path: Path) -> None:
    """The run's train-data log holds STEPS steps of ROWS_PER_STEP rows each (every data-parallel replica's), every
    prompt of them trained exactly once."""
    assert len(assert_trained_once(tmp_path, STEPS)) == STEPS * ROWS_PER_STEP // 4
    rows = (tmp_path / "train_data.jsonl").read_text().splitlines()
    assert Counter(json.loads(row)["step"] for row in rows) == dict.fromkeys(range(STEPS), ROWS_PER_STEP)


@pytest.mark.slow
@pytest.mark.long(minutes=1.5)
@pytest.mark.timeout(400)
@pytest.mark.parametrize(("algo", "layout", "launcher"), CASES, ids=["-".join(case) for case in CASES])
def test_two_nodes_train_every_prompt_once(
    tmp_path: Path, cluster: dict[str, str], algo: str, layout: str, launcher: str
) -> None:
    split, tp = LAYOUTS[layout]
    stderr = two_node_run(
        tmp_path,
        *_fit(tmp_path, algo, STEPS, tp),
        launcher=launcher,
        head_cpus=0,
        node1_cpus=4,
        cluster=cluster,
        timeout_s=300,
    )
    assert f"trainer: 2 ranks = {split} on cpu (1 device x 2 nodes)" in stderr
    assert f"fit stopped after step {STEPS}: {algo}.max_num_steps ({STEPS}) reached" in stderr
    _assert_steps_trained_once(tmp_path)
    policy_start = ALGOS[algo][1]
    counted = [
        float(row["train/num_valid_samples"]) for row in step_metrics(tmp_path) if row["train/num_valid_samples"]
    ]
    # every row of each step that trained the policy, node 1's replica's included
    assert counted == [float(ROWS_PER_STEP)] * (STEPS - policy_start)


@pytest.mark.slow
@pytest.mark.long(minutes=2)
@pytest.mark.timeout(600)
def test_two_ranks_per_node_write_a_bundle_together_and_resume_every_prompt_once(
    tmp_path: Path, cluster: dict[str, str]
) -> None:
    """Four ranks, two per node (node 1's launcher starts its second rank), TP=2 in each node x DP=2 across them:
    every rank writes its shards of a bundle at step 2 into the leader's, and the same command resumes from it for two
    steps more."""
    checkpoints = tmp_path / "checkpoints"
    bundles = ("--checkpointing.enabled", "true", "--checkpointing.checkpoint_dir", str(checkpoints))
    bundles += ("--checkpointing.save_period", "2", "--checkpointing.save_data_plane", "true")
    for steps in (2, STEPS):
        stderr = two_node_run(
            tmp_path,
            *_fit(tmp_path, "grpo", steps, "2"),
            *bundles,
            launcher="lightning",
            ranks_per_node=2,
            head_cpus=0,
            node1_cpus=4,
            cluster=cluster,
            timeout_s=300,
        )
        assert "trainer: 4 ranks = TP 2 x PP 1 x DP 2 on cpu (2 devices x 2 nodes)" in stderr
        assert (steps == STEPS) == (f"resuming from {checkpoints / 'step_2'}" in stderr)
        assert (checkpoints / f"step_{steps}" / "sharded" / ".metadata").is_file()
    _assert_steps_trained_once(tmp_path)


@pytest.mark.slow
@pytest.mark.long(minutes=1)
@pytest.mark.timeout(400)
def test_a_node_that_dies_ends_the_other_within_seconds(tmp_path: Path) -> None:
    """SIGKILL of node 1's process mid-run: node 0's next collective with it fails and node 0 ends by itself within
    seconds (the script stops nothing), and the script names the node that died."""
    run = start_two_nodes(tmp_path, *_fit(tmp_path, "grpo", 40, "1"), launcher="lightning", head_cpus=0, node1_cpus=4)
    trained = tmp_path / "train_data.jsonl"
    try:
        reached = wait_for(lambda: trained.exists() and trained.stat().st_size > 0, run.process, "a trained step")
        node1 = child_pid(run.process.pid, "NODE_RANK=1") if reached else None
        if node1 is not None:
            os.kill(node1, signal.SIGKILL)
        killed = time.monotonic()
    finally:
        stderr = finish(run, 120)
    assert node1 is not None, f"the run ended before node 1 trained a step:\n{stderr[-5000:]}"
    took = time.monotonic() - killed
    assert run.process.returncode == 128 + signal.SIGKILL, stderr[-3000:]
    assert took < 30, f"the run outlived its dead node by {took:.0f} s"
    assert "error: node 1 exited with code 137" in stderr
    # node 0's own error, saying where to look
    assert "node 0 lost its connection to another trainer rank: if a rank of another node (node 1) ended" in stderr
    assert "Received SIGTERM" not in stderr  # nobody had to stop node 0


def test_the_slurm_recipe_starts_ray_on_every_node_and_the_trainer_on_the_first_nodes(tmp_path: Path) -> None:
    """scripts/slurm.sbatch (shown whole in docs/distributed.md) run with srun, scontrol, ray and python replaced by
    recording shims: the Ray head on the first node, a Ray node on each other (no GPUs on the trainer nodes), the
    trainer ranks on the first TRAINER_NODES nodes with the first node as the rendezvous and the Ray address."""
    script = (REPO / "scripts" / "slurm.sbatch").read_text()
    assert f"```bash\n{script}```" in (REPO / "docs" / "distributed.md").read_text()
    log = install_shims(tmp_path / "bin")
    env = user_environment(without=("RAY_ADDRESS",)) | {
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "SHIM_LOG": str(log),
        "SHIM_NODES": "gpu-a gpu-b gpu-c",
        "SLURM_JOB_NODELIST": "gpu-[a-c]",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_GPUS_ON_NODE": "8",
        "TRAINER_NODES": "2",
    }
    argv = ["bash", "scripts/slurm.sbatch", "--config", "configs/grpo_math_1B_megatron.yaml"]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rendezvous = "MASTER_ADDR=gpu-a MASTER_PORT=29500 RAY_ADDRESS=gpu-a:6379"
    fit = "python -m sc_lightning fit --config configs/grpo_math_1B_megatron.yaml"
    fit += " --trainer.num_nodes 2 --trainer.devices 2"
    ray = {
        "gpu-a": "ray start --block --num-gpus=0 --head --port=6379",
        "gpu-b": "ray start --block --num-gpus=0 --address=gpu-a:6379",
        "gpu-c": "ray start --block --num-gpus=8 --address=gpu-a:6379",
    }
    expected = [
        *(
            f"srun --nodes=1 --ntasks=1 --nodelist={node} --overlap {start} | {rendezvous}"
            for node, start in ray.items()
        ),
        *ray.values(),
        "ray status --address=gpu-a:6379",  # the head answered at once
        "ray status --address=gpu-a:6379",
        f"srun --nodes=2 --ntasks-per-node=2 --nodelist=gpu-a,gpu-b --kill-on-bad-exit=1 {fit} | {rendezvous}",
        fit,
    ]
    assert sorted(log.read_text().splitlines()) == sorted(expected)  # the Ray nodes start in the background


def test_a_run_past_its_deadline_fails_with_what_it_printed_and_where_it_waits(tmp_path: Path) -> None:
    """The helper's own failure path: a run that hangs (a Python process in its own session, waiting in a function)
    is stopped at its deadline, and the failure carries its stderr so far and its stack (py-spy), naming the
    function it waits in."""
    hang = "import sys, time\nprint('node 0 started', file=sys.stderr, flush=True)\n"
    hang += "def waits_for_its_peer():\n    time.sleep(600)\nwaits_for_its_peer()\n"
    stderr_path = tmp_path / "hung.stderr"
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen([sys.executable, "-c", hang], stderr=stderr, start_new_session=True)
    run = TwoNodes(process, stderr_path)
    assert wait_for(lambda: "started" in run.stderr(), process, "the hung run's first line", timeout_s=60)
    with pytest.raises(AssertionError) as failure:
        finish(run, 1)
    message = str(failure.value)
    assert "the two-node run outlived 1 s:" in message and "node 0 started" in message
    # its stack, taken before it was stopped (the traceback that SIGINT printed is part of the stderr above it)
    assert f"--- {process.pid}: " in message, message
    assert "waits_for_its_peer (<string>:4)" in message.split(f"--- {process.pid}: ")[1]
    assert process.returncode is not None
