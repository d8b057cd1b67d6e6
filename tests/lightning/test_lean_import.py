"""The CLI's lean imports: Lightning without transformers, matplotlib or TorchDynamo (each still works when used),
megatron-core without TorchInductor or wandb."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers.configs import REPO, TINY


def probe(code: str) -> dict:
    """Run ``code`` in a fresh interpreter from the repository root; the JSON object its last line prints."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


_PROBE = """
import json, sys
from sc_lightning.cli.lean_imports import leave_out_model_metrics
leave_out_model_metrics()
import lightning.pytorch
import torchmetrics.functional.text.bert as bert
after_lightning = sorted(m for m in ("transformers", "matplotlib") if m in sys.modules)
try:
    bert.bert_score(["a cat"], ["a cat"])
    bert_error = None
except ModuleNotFoundError as err:
    bert_error = str(err)
from transformers import PreTrainedTokenizerFast
import matplotlib.pyplot
print(json.dumps({"after_lightning": after_lightning, "bert_error": bert_error}))
"""


def test_lightning_imports_without_transformers_or_matplotlib() -> None:
    """After leave_out_model_metrics, Lightning's import pulls in neither; torchmetrics' BERTScore says it needs
    transformers; transformers and matplotlib themselves import as usual."""
    result = probe(_PROBE)
    assert result["after_lightning"] == []
    assert result["bert_error"] is not None and "transformers" in result["bert_error"]


def test_checking_a_config_imports_no_heavy_backend() -> None:
    """``fit --dry_run`` (load, validate, preflight: everything before fit's first line of work) imports neither
    transformers, matplotlib, Ray, vLLM nor megatron."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sc_lightning", "fit", "--config", str(TINY), "--dry_run"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert "lightning.pytorch" in imported  # the trainer: keys were checked
    assert imported & {"transformers", "matplotlib", "ray", "vllm", "megatron", "megatron.core"} == set()
    assert "torch._dynamo" not in imported


_DYNAMO_PROBE = """
import json, sys
import torch
from sc_lightning.cli.lean_imports import NeverCompiled, import_lightning
import_lightning()
from lightning.pytorch.utilities.compile import OptimizedModule
from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection
after_lightning = "torch._dynamo" in sys.modules
import torch._dynamo
compiled = torch.compile(torch.nn.Linear(2, 2))
print(json.dumps({
    "after_lightning": after_lightning,
    "stand_in_checked": OptimizedModule is NeverCompiled,
    "real_dynamo_after": isinstance(compiled, torch._dynamo.OptimizedModule),
    "logging_method_eager": not hasattr(_ResultCollection.log, "_torchdynamo_disable"),
}))
"""


def test_lightning_imports_without_dynamo_which_imports_whole_afterwards() -> None:
    """Lightning's import leaves TorchDynamo out (its compile checks see a stand-in class, its ``@disable``d methods
    are the plain functions); the real ``torch._dynamo`` imports and compiles afterwards."""
    result = probe(_DYNAMO_PROBE)
    assert result == {
        "after_lightning": False,
        "stand_in_checked": True,
        "real_dynamo_after": True,
        "logging_method_eager": True,
    }


_MEGATRON_PROBE = """
import json, sys, torch
from sc_lightning.models.megatron_import import import_megatron_without_compile
compile_ = torch.compile
import_megatron_without_compile()
import megatron.core.jit
def f(x):
    return x
import megatron.core.inference.contexts.dynamic_context as dynamic_context
wandb_left_out = "wandb" not in sys.modules and not dynamic_context.HAVE_WANDB
import wandb
print(json.dumps({
    "inductor": "torch._inductor.compile_fx" in sys.modules,
    "fuser_is_a_no_op": megatron.core.jit.jit_fuser(f) is f,
    "compile_restored": torch.compile is compile_,
    "wandb_left_out": wandb_left_out,
    "wandb_imports_after": hasattr(wandb, "init"),
}))
"""


def test_megatron_imports_without_compiling_its_fusers() -> None:
    """megatron-core's jit fuser becomes a no-op, TorchInductor and wandb stay unimported (megatron sees no wandb),
    torch.compile is torch's again, and wandb imports as usual afterwards."""
    result = probe(_MEGATRON_PROBE)
    assert result == {
        "inductor": False,
        "fuser_is_a_no_op": True,
        "compile_restored": True,
        "wandb_left_out": True,
        "wandb_imports_after": True,
    }


def test_lightning_imports_beside_torchvision_without_importing_it(tmp_path) -> None:
    """torchmetrics' image metrics import torchvision with the package, and torchvision imports ``torch._dynamo.utils``
    (GPU images ship it): the CLI's Lightning import leaves it out, so the stand-in TorchDynamo is never asked for it.
    A planted ``torchvision`` that imports what the real one does stands in for it (this box has none)."""
    planted = tmp_path / "torchvision"
    planted.mkdir()
    (planted / "__init__.py").write_text("from torch._dynamo.utils import is_compile_supported\n")
    metadata = tmp_path / "torchvision-0.0.1.dist-info"  # installed, as far as importlib.metadata can tell
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.0.1\n")
    code = (
        "import json, sys\n"
        "from sc_lightning.cli.lean_imports import import_lightning\n"
        "import_lightning()\n"
        "print(json.dumps({'torchvision': 'torchvision' in sys.modules, 'dynamo': 'torch._dynamo' in sys.modules}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"torchvision": False, "dynamo": False}
