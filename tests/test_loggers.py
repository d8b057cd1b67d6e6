"""The loggers users pick (``configs/loggers/*.yaml``): TensorBoard and W&B beside the default CSV, same names."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml

from sc_lightning.checkpoint.fingerprint import compatibility_identity
from sc_lightning.cli.main import main
from tests.helpers.cli import run, user_environment
from tests.helpers.configs import REPO, TEST_BASE

# Each run test starts a Python process that imports Lightning and trains a few tiny steps (about 10 s each).
pytestmark = pytest.mark.slow

LOGGERS = REPO / "configs" / "loggers"
OVERLAYS = sorted(p.name for p in LOGGERS.glob("*.yaml"))
WANDB_OWN_KEYS = {"_step", "_runtime", "_timestamp", "trainer/global_step"}  # W&B's bookkeeping, and the x-axis


def offline_wandb_env(tmp_path: Path) -> dict[str, str]:
    """W&B offline with every file inside ``tmp_path``: no account, no network, no telemetry, no git or code scan."""
    homes = {
        f"WANDB_{name}_DIR": str(tmp_path / f"wandb_{name.lower()}") for name in ("CONFIG", "CACHE", "DATA", "ARTIFACT")
    }
    return {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wandb_dir"),  # overridden by the overlay's save_dir: the run's root wins
        **homes,
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_X_DISABLE_STATS": "true",
        "WANDB_X_DISABLE_META": "true",
        "WANDB_X_DISABLE_MACHINE_INFO": "true",
        "WANDB_X_SAVE_REQUIREMENTS": "false",
    }


def fit(root: Path, tmp_path: Path, *overlays: str, steps: int) -> None:
    """Train ``steps`` tiny colocated steps with ``overlays`` layered on the tests' base config, into ``root``."""
    env = user_environment(without_prefix="WANDB_")
    configs = [arg for path in (*TEST_BASE, *overlays) for arg in ("--config", str(path))]
    result = run(
        "fit", *configs,
        "--data_plane.backend", "memory",
        "--grpo.max_num_steps", str(steps),
        f"--trainer.default_root_dir={root}",
        "--trainer.enable_progress_bar=false",
        env={**env, **offline_wandb_env(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def csv_rows(root: Path) -> list[dict[str, float]]:
    """The one CSV run's per-step rows (every column, ``step`` included) as numbers."""
    (path,) = root.glob("lightning_logs/version_*/metrics.csv")
    header, *lines = path.read_text().splitlines()
    return [{k: float(v) for k, v in zip(header.split(","), line.split(","), strict=True)} for line in lines]


def tensorboard_scalars(root: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of the one TensorBoard run under ``root``: ``[(step, value), ...]``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run_dir,) = root.glob("tensorboard/version_*")
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def wandb_history(root: Path) -> list[dict[str, Any]]:
    """The history rows of the one offline W&B run under ``root``, read from its ``run-*.wandb`` file.

    The file is W&B's record log (the LevelDB log layout): a 7-byte header (``:W&B``, magic, version), then
    32 KiB blocks of records, each a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)
    and a chunk of a serialized ``wandb_internal_pb2.Record``; a block's tail shorter than a header is padding.
    """
    from wandb.proto import wandb_internal_pb2

    (path,) = root.glob("wandb/offline-run-*/run-*.wandb")
    data, block, pos, record, rows = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        record = (b"" if kind in (1, 2) else record) + data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            parsed = wandb_internal_pb2.Record()
            parsed.ParseFromString(record)
            if parsed.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in parsed.history.item})
    return rows


def test_tensorboard_and_offline_wandb_hold_the_csv_metrics_at_every_rl_step(tmp_path: Path) -> None:
    root = tmp_path / "run"
    fit(root, tmp_path, str(LOGGERS / "tensorboard_wandb.yaml"), steps=3)
    rows = csv_rows(root)
    assert [int(r["step"]) for r in rows] == [0, 1, 2]  # one row per RL step
    rewards = [r["train/reward"] for r in rows]

    scalars = tensorboard_scalars(root)
    assert [step for step, _ in scalars["train/reward"]] == [0, 1, 2]  # TensorBoard's x-axis is the RL step
    assert [value for _, value in scalars["train/reward"]] == pytest.approx(rewards)

    history = wandb_history(root)
    assert [r["trainer/global_step"] for r in history] == [0, 1, 2]  # W&B's x-axis (step_metric) is the RL step
    assert [r["train/reward"] for r in history] == pytest.approx(rewards)

    # the same names everywhere: train/..., timing/train/..., perf/..., rollout/..., and epoch
    names = set(rows[0]) - {"step"}
    assert {"train/reward", "train/loss", "timing/train/weight_sync", "perf/tokens_per_s"} <= names
    assert set(scalars) == names
    assert all(set(r) - WANDB_OWN_KEYS == names for r in history)
    assert all(len(points) == 3 for points in scalars.values())

    # every logger wrote under trainer.default_root_dir (not WANDB_DIR, not the working directory), beside the
    # run's own records (run_info.yaml, samples/)
    assert not (tmp_path / "wandb_dir").exists()
    expected = ["lightning_logs", "run_info.yaml", "samples", "tensorboard", "wandb"]
    assert sorted(p.name for p in root.iterdir()) == expected


def test_without_an_overlay_the_csv_logger_stays_the_default_with_tensorboard_installed(tmp_path: Path) -> None:
    """Lightning's own default (``logger: null``) is TensorBoard once the package is installed; ours stays CSV."""
    import tensorboard  # noqa: F401  (installed by the test extra: the case this test is about)

    fit(tmp_path, tmp_path, steps=1)
    assert [int(r["step"]) for r in csv_rows(tmp_path)] == [0]
    assert not list(tmp_path.rglob("events.out.tfevents.*"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_logger_overlay_layers_on_a_shipped_config_with_its_files_under_the_root_dir(
    overlay: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In this process: the overlay passes a dry run, and every logger's save_dir resolves to default_root_dir."""
    monkeypatch.chdir(REPO)
    args = ["fit", "--config", "configs/grpo_tiny.yaml", "--config", f"configs/loggers/{overlay}"]
    assert main([*args, "--dry_run"]) == 0, capsys.readouterr().err
    assert "config is valid" in capsys.readouterr().out
    assert main([*args, f"--trainer.default_root_dir={tmp_path}", "--print_config"]) == 0
    loggers = yaml.safe_load(capsys.readouterr().out)["trainer"]["logger"]
    assert loggers[0]["class_path"] == "lightning.pytorch.loggers.CSVLogger"  # Lightning's log_dir stays the CSV's
    assert [entry["init_args"]["save_dir"] for entry in loggers] == [str(tmp_path)] * len(loggers)


def test_switching_loggers_leaves_the_resume_identity_unchanged() -> None:
    """trainer.logger is operational: a run may resume under another logger."""
    base = {"grpo": {"seed": 7}, "trainer": {"logger": None}}
    wandb = {"grpo": {"seed": 7}, "trainer": {"logger": [{"class_path": "lightning.pytorch.loggers.WandbLogger"}]}}
    assert compatibility_identity(wandb) == compatibility_identity(base)
    assert compatibility_identity({"grpo": {"seed": 8}, "trainer": {}}) != compatibility_identity(base)
