"""GPU smoke run of sc_lightning.models (not collected by pytest): ``python -m tests.models.gpu_smoke``.

On one GPU: HF parity, exact export, builtin:tiny forward/backward in fp32/bf16 with and without activation
recomputation, and a ~254M-parameter bf16 training step. With two GPUs it also runs ``tests.models.tp_worker`` at
TP=2 over NCCL and compares with TP=1. Prints numbers; exits non-zero on a failed check.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore")
VARIANTS = {
    "qwen2": ("qwen2", False, {}),
    "llama-tied": ("llama", True, {}),
    "qwen2-vocab19": ("qwen2", False, {"vocab_size": 19}),
}


def _timed(step, repeats: int = 8) -> float:
    """Median wall time of ``step()`` in ms after 3 warm-ups."""
    times = []
    for _ in range(repeats + 3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[3:]) * 1e3


def parity(root: Path) -> dict[str, Path]:
    """Megatron vs transformers on the GPU for each tiny variant; returns the model directories."""
    from transformers import AutoModelForCausalLM

    from sc_lightning.models.convert import export_hf_weights
    from sc_lightning.models.logprobs import logits_of, token_logprobs
    from sc_lightning.models.megatron import load_policy
    from tests.helpers.models import make_tiny_model, random_ids

    dirs = {}
    for name, (arch, tied, extra) in VARIANTS.items():
        dirs[name] = make_tiny_model(root / name, arch=arch, tie_word_embeddings=tied, **extra)
        model, spec, _ = load_policy(str(dirs[name]), device="cuda")
        hf = AutoModelForCausalLM.from_pretrained(str(dirs[name]), attn_implementation="eager", dtype=torch.float32)
        hf = hf.cuda().eval()
        ids = random_ids(3, 24, seed=11, vocab=spec.vocab_size).cuda()
        with torch.no_grad():
            expected, logits, logprobs = hf(ids).logits, logits_of(model, ids), token_logprobs(model, ids)
        ref = torch.log_softmax(expected, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
        exported, state = dict(export_hf_weights(model, spec)), hf.state_dict()
        exact = exported.keys() == state.keys() and all(torch.equal(exported[k], state[k]) for k in state)
        diff = (expected - logits).abs().max().item()
        print(f"{name}: logits diff {diff:.2e}, logprob diff {(logprobs[:, 1:] - ref).abs().max():.2e}, exact {exact}")
        assert diff < 1e-4 and exact
        torch.save({"logits": logits.cpu(), "logprobs": logprobs.cpu()}, root / f"tp1_{name}.pt")
    return dirs


def speed() -> None:
    """builtin:tiny forward/backward and a ~254M-parameter bf16 AdamW step."""
    from sc_lightning.models.logprobs import token_logprobs
    from sc_lightning.models.megatron import build_gpt_model
    from sc_lightning.models.spec import ModelSpec, builtin_spec
    from tests.helpers.models import random_ids

    ids = random_ids(16, 32).cuda()
    for precision in ("fp32", "bf16"):
        for ckpt in (False, True):
            model = build_gpt_model(
                builtin_spec("builtin:tiny"), precision=precision, activation_checkpointing=ckpt, device="cuda"
            )
            ms = _timed(lambda m=model: token_logprobs(m, ids).sum().backward())
            print(f"builtin:tiny {precision} recompute={ckpt}: fwd+bwd {ms:.2f} ms")
    spec = ModelSpec(32000, 1024, 16, 16, 8, 2816, 4096, arch="llama")
    model = build_gpt_model(spec, precision="bf16", device="cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, 32000, (8, 2048), device="cuda")

    def step() -> None:
        optimizer.zero_grad()
        (-token_logprobs(model, ids).mean()).backward()
        optimizer.step()

    ms = _timed(step)
    params = sum(p.numel() for p in model.parameters())
    print(f"{params / 1e6:.0f}M params bf16, 8x2048 tokens: step {ms:.1f} ms")


def tensor_parallel(dirs: dict[str, Path], root: Path) -> None:
    """TP=2 over NCCL (two processes) against the TP=1 numbers parity() saved."""
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""), "TP_DEVICE": "cuda"}
    cmd = [sys.executable, "-m", "tests.models.tp_worker"]
    models = [f"{k}={v}" for k, v in dirs.items()]
    procs = [subprocess.Popen([*cmd, str(r), "2", "29517", str(root), *models], env=env) for r in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    for r in range(2):
        got = torch.load(root / f"rank{r}.pt", map_location="cpu")
        for name in dirs:
            ref = torch.load(root / f"tp1_{name}.pt")
            diff = (got[name]["logits"] - ref["logits"]).abs().max().item()
            print(f"TP=2 rank {r} {name}: logits vs TP=1 {diff:.2e}")
            assert diff < 1e-4


def main() -> None:
    """Run every check the machine allows."""
    from sc_lightning.models.megatron import init_model_parallel

    assert torch.cuda.is_available()
    print(torch.__version__, torch.cuda.get_device_name(), "GPUs:", torch.cuda.device_count())
    init_model_parallel(1, device="cuda")
    root = Path("/tmp/sc_lightning_gpu_smoke")
    dirs = parity(root)
    speed()
    if torch.cuda.device_count() >= 2:
        tensor_parallel(dirs, root)


if __name__ == "__main__":
    main()
