"""tensordict (TransferQueue's container) imports without TorchDynamo, in the driver and in the data plane's Ray
workers, and torch's compile marks are torch's own again afterwards."""

from __future__ import annotations

import json
import subprocess
import sys

from sc_lightning.data_plane.lean_tensordict import SETUP_HOOK
from sc_lightning.data_plane.tq_runtime import tq_ray_runtime_env
from tests.helpers.configs import REPO

_PROBE = """
import json, sys
import torch.compiler
marks = torch.compiler.allow_in_graph, torch.compiler.assume_constant_result
from sc_lightning.data_plane.tq_runtime import import_tq
import_tq()
from tensordict import TensorDict
summed = TensorDict({"a": torch.ones(2, 3)}, batch_size=[2]).apply(lambda x: x * 2)["a"].sum().item()
dynamo_after_import = "torch._dynamo" in sys.modules
import torch._dynamo
print(json.dumps({
    "dynamo_after_import": dynamo_after_import,
    "tensordict_works": summed == 12.0,
    "marks_restored": (torch.compiler.allow_in_graph, torch.compiler.assume_constant_result) == marks,
    "dynamo_imports_after": hasattr(torch._dynamo, "OptimizedModule"),
}))
"""


def test_transfer_queue_imports_without_dynamo_and_leaves_torch_as_it_was() -> None:
    """After import_tq, TransferQueue and a TensorDict work, TorchDynamo is still unimported, torch.compiler's marks
    are the originals, and the real TorchDynamo imports afterwards."""
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, cwd=REPO, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "dynamo_after_import": False,
        "tensordict_works": True,
        "marks_restored": True,
        "dynamo_imports_after": True,
    }


def test_the_data_planes_ray_job_runs_the_hook_in_every_worker() -> None:
    """The job settings a TransferQueue run starts or joins Ray with carry the hook and the thread settings
    (tests/data_plane/test_contract.py checks a worker of such a job imports TransferQueue without TorchDynamo)."""
    runtime_env = tq_ray_runtime_env({"TQ_NUM_THREADS": "2"})
    assert runtime_env == {"env_vars": {"TQ_NUM_THREADS": "2"}, "worker_process_setup_hook": SETUP_HOOK}
    module, _, function = SETUP_HOOK.rpartition(".")
    assert callable(getattr(__import__(module, fromlist=[function]), function))
