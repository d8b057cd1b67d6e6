"""A fault drill: SIGKILL one trainer rank of a multi-rank fit mid-run, check that the run ends naming that rank,
resume it with the same command, and check that every prompt it trained was trained exactly once.

    python scripts/kill_drill.py --dir /tmp/drill -- --config configs/grpo_tiny.yaml --trainer.devices 2 \\
        --data_plane.backend simple --grpo.max_num_epochs 1

The arguments after ``--`` go to ``python -m sc_lightning fit``; the drill adds a bundle every ``--save-period``
steps (rollouts included), the train-data log, and ``--dir`` as the run's root. The fit's ranks must be started by
Lightning's launcher (one node, ``trainer.devices`` > 1), and the run must not go past one epoch of its dataset:
then "exactly once" means each prompt in one group. Once ``--after-bundles`` bundles are complete, rank ``--rank``
(not the leader: ``LOCAL_RANK`` >= 1) is killed; the run must end within ``--end-within-s`` naming it, and the same
command must then resume from the last bundle and finish. Each check prints a line; the exit status is 0 only if
all hold. ``tests/lightning/test_multi_rank.py`` runs the drill on two CPU ranks; ``scripts/gpu_multi.sh`` on two
GPUs (``MULTI_PARTS=kill``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from sc_lightning.checkpoint.atomic import complete_bundles
from sc_lightning.report.tables import read_train_data
from sc_lightning.trainer.train_data_log import FILENAME as TRAIN_DATA

NAMED = (
    "trainer rank {rank} (pid {pid}) died",  # the strategy, from the leader's broken collective
    "[rank: {rank}] Child process with PID {pid} terminated",  # Lightning's launcher, whose observer ends the run
)
"""How the run's output may name the killed rank (either suffices)."""

POLL_S = 0.05


class DrillFailed(RuntimeError):
    """A check of the drill did not hold."""


def rank_pid(launcher_pid: int, local_rank: int) -> int | None:
    """The pid of the rank that Lightning's launcher in ``launcher_pid`` started with ``LOCAL_RANK=local_rank``."""
    wanted = f"LOCAL_RANK={local_rank}".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == launcher_pid and wanted in (proc / "environ").read_bytes().split(b"\0"):
                return int(proc.name)
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile, or not ours to read
    return None


def fit_command(run_dir: Path, fit_args: list[str], save_period: int) -> list[str]:
    """``fit`` with ``fit_args``, a bundle (with its rollouts) every ``save_period`` steps and the train-data log, in
    ``run_dir``."""
    return [
        sys.executable, "-m", "sc_lightning", "fit", *fit_args,
        "--checkpointing.enabled", "true",
        "--checkpointing.checkpoint_dir", str(run_dir / "checkpoints"),
        "--checkpointing.save_period", str(save_period),
        "--checkpointing.save_data_plane", "true",
        "--data.train_data_log", "true",
        "--trainer.default_root_dir", str(run_dir),
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip


def wait_until(condition: object, process: subprocess.Popen, what: str, timeout_s: float) -> None:
    """Poll ``condition()`` until it holds; DrillFailed if the run ends first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if process.poll() is not None:
            raise DrillFailed(f"the run ended (exit code {process.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise DrillFailed(f"no {what} within {timeout_s:.0f} s")
        time.sleep(POLL_S)


def kill_and_end(command: list[str], run_dir: Path, args: argparse.Namespace) -> None:
    """Start the run, kill rank ``args.rank`` once ``args.after_bundles`` bundles are complete, and check that the
    run ends within ``args.end_within_s`` naming it."""
    started = time.monotonic()
    with (run_dir / "killed_run.log").open("w+") as log:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        try:
            bundles = run_dir / "checkpoints"
            wait_until(lambda: len(complete_bundles(bundles)) >= args.after_bundles, process, "bundles", args.timeout_s)
            pid = rank_pid(process.pid, args.rank)
            if pid is None:
                raise DrillFailed(f"the launcher (pid {process.pid}) has no rank with LOCAL_RANK={args.rank}")
            last = complete_bundles(bundles)[-1][1].name
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            print(f"killed rank {args.rank} (pid {pid}) with SIGKILL {killed - started:.1f} s in, after {last}")
            try:
                code = process.wait(timeout=args.end_within_s)
            except subprocess.TimeoutExpired:
                raise DrillFailed(f"the run outlived rank {args.rank} by more than {args.end_within_s:.0f} s") from None
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.seek(0)
        output = log.read()
    print(f"the run ended {time.monotonic() - killed:.1f} s later with exit code {code}")
    if code == 0:
        raise DrillFailed("the run exited 0 after losing a rank")
    said = [line.format(rank=args.rank, pid=pid) for line in NAMED]
    named = next((line for line in output.splitlines() if any(text in line for text in said)), None)
    if named is None:
        raise DrillFailed(f"the run's output never names rank {args.rank}; its end:\n{output[-3000:]}")
    print(f"it named the rank: {named.strip()[:200]}")


def resume(command: list[str], run_dir: Path, timeout_s: float) -> None:
    """Run the same command again: it must resume from a bundle and finish."""
    started = time.monotonic()
    with (run_dir / "resumed_run.log").open("w+") as log:
        try:
            code = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=log, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            raise DrillFailed(f"the resumed run did not finish within {timeout_s:.0f} s") from None
        log.seek(0)
        output = log.read()
    resumed = next((line for line in output.splitlines() if "resuming from" in line), None)
    print(f"the same command ran {time.monotonic() - started:.1f} s, exit code {code}: {(resumed or '').strip()}")
    if code != 0 or resumed is None:
        raise DrillFailed(f"the same command did not resume and finish; its end:\n{output[-3000:]}")


def check_trained_once(run_dir: Path) -> None:
    """train_data.jsonl (the finished run's history): steps 0..N-1 with none missing, each prompt in one group, and
    no row of a group twice."""
    rows = read_train_data(run_dir / TRAIN_DATA)
    steps = sorted({row["step"] for row in rows})
    groups_of: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        groups_of[row["prompt_id"]].add(row["group_id"])
    twice = [prompt for prompt, groups in groups_of.items() if len(groups) > 1]
    repeated = [key for key, n in Counter((r["group_id"], r["generation_index"]) for r in rows).items() if n > 1]
    print(f"trained: {len(steps)} steps, {len(rows)} rows, {len(groups_of)} prompts")
    if not rows or steps != list(range(len(steps))):
        raise DrillFailed(f"train_data.jsonl's steps are not 0..N-1: {steps[:20]}")
    if twice or repeated:
        raise DrillFailed(f"trained more than once: prompts {twice[:5]}, rows (group, generation) {repeated[:5]}")
    print("every prompt trained exactly once (one group each, no row twice)")


def main() -> None:
    """Parse the arguments, run the drill, print each check; exit 1 on the first that fails."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="the run's root (made; must not hold a run)")
    parser.add_argument("--rank", type=int, default=1, help="the local rank to kill (>= 1)")
    parser.add_argument("--after-bundles", type=int, default=2, help="complete bundles before the kill")
    parser.add_argument("--save-period", type=int, default=2, help="steps between bundles")
    parser.add_argument("--end-within-s", type=float, default=60.0, help="how soon the run must end after the kill")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="deadline of each run's other waits")
    parser.add_argument("fit_args", nargs=argparse.REMAINDER, help="-- then fit's arguments")
    args = parser.parse_args()
    fit_args = args.fit_args[1:] if args.fit_args[:1] == ["--"] else args.fit_args
    if args.rank < 1 or not fit_args:
        parser.error("--rank must be >= 1 (the leader is not this drill's) and fit's arguments must follow --")
    args.dir.mkdir(parents=True, exist_ok=True)
    if (args.dir / "checkpoints").exists():
        parser.error(f"{args.dir} holds a run already: give an empty --dir")
    command = fit_command(args.dir, fit_args, args.save_period)
    try:
        kill_and_end(command, args.dir, args)
        resume(command, args.dir, args.timeout_s)
        check_trained_once(args.dir)
    except DrillFailed as failed:
        print(f"FAILED: {failed}")
        sys.exit(1)
    print("PASSED")


if __name__ == "__main__":
    main()
