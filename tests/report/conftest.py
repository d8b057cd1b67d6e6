"""A real tiny run, once per session: 6 asynchronous GRPO steps (one version of lookahead, so staleness 0 and 1
both occur) through the real CLI, with the train-data log and the ``run_info.yaml`` fit writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import run
from tests.helpers.configs import REPO, TINY_PATH
from tests.helpers.run_dirs import TINY_RUN_STEPS


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of a finished 6-step run; tests copy it before changing anything."""
    run_dir = tmp_path_factory.mktemp("tiny_run")
    layers = (TINY_PATH, REPO / "tests" / "small_steps.yaml")
    overrides = [
        "async_rl.max_buffered_rollouts=8",  # room for step k+1's groups while step k trains
        f"grpo.max_num_steps={TINY_RUN_STEPS}",
        "data.train_data_log=true",
        f"trainer.default_root_dir={run_dir}",
        "trainer.enable_progress_bar=false",
    ]
    configs = [arg for path in layers for arg in ("--config", str(path))]
    flags = [arg for override in overrides for arg in ("--" + override.split("=")[0], override.split("=", 1)[1])]
    result = run("fit", *configs, *flags)  # in a user's environment: not this process's torch.distributed
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run_dir / "run_info.yaml").is_file(), "fit writes the resolved config and versions at the start"
    return run_dir
