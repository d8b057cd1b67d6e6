"""Training-step throughput and MFU: sc_lightning's GRPO step against the bare model, in one run.

The model is a megatron-core ``GPTModel`` built by sc_lightning at a Llama-style shape (default: the 1.26B one of
issue 16: 24 layers, hidden 2048, 16 heads, 8 KV groups, FFN 5632, vocab 32000). A step trains ``--rows`` rows of
``--seq`` tokens:

    bare    the same model: forward, ``-mean(token logprobs)`` backward, one optimizer step, one micro-batch
    grpo    ``PolicyUpdate`` + ``ClippedPGLoss`` (begin, one chunk, finish) with ``--micro-batch`` rows per micro-batch
            (and ``--micro-batch-tokens``, the ``policy.train_micro_batch_tokens`` budget, when given)

Both use sc_lightning's optimizer recipe (``trainer/optim.py``): with ``--precision bf16``, bf16 parameters with fp32
gradient accumulation, fp32 master weights and fp32 AdamW state through megatron-core's optimizer; with fp32, torch
AdamW.

MFU = (6 x parameters x tokens + 12 x layers x hidden x seq x tokens) / step time / peak (the formula of
``perf/mfu``, ``sc_lightning/trainer/perf.py``), where the peak is the device's dense bf16 datasheet figure
(989 TFLOP/s for an H200; ``--peak-tflops`` for others). The GPU is synchronised before every clock read; figures
are medians after two warm-up steps.

Under ``torchrun`` every rank builds its share of the model: ``--tp`` ranks split each layer (tensor parallelism),
the rest are data-parallel replicas, each training ``--rows`` rows of its own (so a step's tokens grow with the
replicas). Times are the slowest rank's; MFU is per GPU (each rank's share of the whole model's FLOPs). The first
GRPO step's loss and gradient norm are printed before any timing: with the same rows (one replica) they must not
depend on ``--tp``.

    python benchmarks/train_step.py --device cuda --precision bf16              # the 1.26B shape on one GPU
    torchrun --nproc-per-node 2 benchmarks/train_step.py --device cuda --precision bf16 --tp 2   # TP = 2
    torchrun --nproc-per-node 4 benchmarks/train_step.py --device cuda --precision bf16          # DP = 4
    python benchmarks/train_step.py --layers 2 --hidden 128 --heads 4 --groups 2 --ffn 256 --vocab 512 --seq 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import torch
from engine import SHAPES, synchronize  # benchmarks/engine.py (the script's folder is on sys.path)

from sc_lightning.algorithms import ClippedPGLoss
from sc_lightning.config.model import OptimizerConfig
from sc_lightning.models import build_gpt_model, token_logprobs
from sc_lightning.models.spec import ModelSpec
from sc_lightning.trainer.chunks import TrainChunk
from sc_lightning.trainer.data_parallel import data_parallel_rank, parallel_layout
from sc_lightning.trainer.optim import adamw
from sc_lightning.trainer.perf import rank_training_flops
from sc_lightning.trainer.policy_update import PolicyUpdate, normalised_step


def median_ms(step, device: torch.device, reps: int, warmups: int = 2) -> float:
    """Median wall time of ``step()`` in ms, after ``warmups`` warm-up calls."""
    for _ in range(warmups):
        step()
    times = []
    for _ in range(reps):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def rank_device(name: str) -> torch.device:
    """The device ``--device`` names, for this rank: under torchrun a CUDA rank takes the GPU of its ``LOCAL_RANK``."""
    device = torch.device(name)
    if device.type == "cuda" and device.index is None and "LOCAL_RANK" in os.environ:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return device


def slowest(ms: float, device: torch.device) -> float:
    """The largest of every rank's ``ms`` (itself in a single process)."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return ms
    value = torch.tensor([ms], device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return float(value)


def rows(args: argparse.Namespace, device: torch.device) -> TrainChunk:
    """One chunk of ``--rows`` full-length rows (the data-parallel replica's own): prompt in the first quarter, the
    rest generated."""
    g = torch.Generator().manual_seed(data_parallel_rank())
    ids = torch.randint(3, args.vocab, (args.rows, args.seq), generator=g)
    token_mask = torch.zeros(args.rows, args.seq)
    token_mask[:, args.seq // 4 :] = 1
    return TrainChunk(
        input_ids=ids,
        token_mask=token_mask,
        generation_logprobs=-torch.rand(args.rows, args.seq, generator=g),
        sample_mask=torch.ones(args.rows),
        advantages=torch.randn(args.rows, 1, generator=g) * token_mask,  # (B, T): the row's advantage on its tokens
        rewards=torch.rand(args.rows, generator=g),
        group_ids=[f"g{i // 8}" for i in range(args.rows)],
        start_weights=[0] * args.rows,
    ).to(device)


def main() -> None:
    """Command line: print ms/step, MFU and peak memory of both steps, and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shape = SHAPES["1.26b"]  # the defaults: the engine benchmark's 1.26B shape
    for name, field in [
        ("layers", "num_layers"),
        ("hidden", "hidden_size"),
        ("heads", "num_attention_heads"),
        ("groups", "num_query_groups"),
        ("ffn", "ffn_hidden_size"),
        ("vocab", "vocab_size"),
    ]:
        parser.add_argument(f"--{name}", type=int, default=getattr(shape, field))
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=4, help="the 1B exemplar's train_micro_batch_size")
    parser.add_argument("--micro-batch-tokens", type=int, default=None, help="policy.train_micro_batch_tokens")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (under torchrun: each rank's LOCAL_RANK GPU)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (under torchrun; the rest is DP)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the device")
    parser.add_argument("--unfused", action="store_true", help="megatron's unfused SwiGLU and RoPE (models/fused.py)")
    parser.add_argument("--profile", action="store_true", help="then print the GPU kernels of one GRPO step")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    device = rank_device(args.device)
    spec = ModelSpec(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_attention_heads=args.heads,
        num_query_groups=args.groups,
        ffn_hidden_size=args.ffn,
        max_position_embeddings=args.seq,
        arch="llama",
    )
    model = build_gpt_model(
        spec,
        precision=args.precision,
        device=device,
        tensor_parallel_size=args.tp,
        fused_kernels=not args.unfused and None,
    )
    leader = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    say = print if leader else lambda *_: None
    optimizer, _ = adamw(model, OptimizerConfig(lr=1e-6), total_steps=1)
    chunk = rows(args, device)

    def bare() -> None:
        optimizer.zero_grad(set_to_none=True)
        (-token_logprobs(model, chunk.input_ids, vocab_size=args.vocab).mean()).backward()
        normalised_step(model, optimizer, 1.0, clip_grad=1.0)

    update = PolicyUpdate(
        model,
        optimizer,
        ClippedPGLoss(reference_policy_kl_penalty=0.0),  # the exemplars' GRPO loss: no reference model
        micro_batch_size=args.micro_batch,
        micro_batch_tokens=args.micro_batch_tokens,
        clip_grad=1.0,
        vocab_size=args.vocab,
    )

    def grpo() -> dict[str, float]:
        update.begin()
        update.train_chunk(chunk)
        return update.finish()

    first = grpo()  # before any other step: the same weights and rows whatever the layout
    flops = rank_training_flops(spec, [args.seq] * args.rows, model_parallel=args.tp)
    say(
        f"{spec.num_parameters / 1e9:.2f}B parameters ({args.precision} on {device.type}; {parallel_layout()}), "
        f"{args.rows} x {args.seq} tokens a step per replica, grpo micro-batch {args.micro_batch} rows / "
        f"{args.micro_batch_tokens} tokens, optimizer {type(optimizer).__name__}, fused SwiGLU/RoPE "
        f"{model.config.apply_rope_fusion}; MFU per GPU against {args.peak_tflops:.0f} TFLOP/s"
    )
    say(f"first GRPO step: loss {first['loss']:.8f} grad_norm {first['grad_norm']:.8f}")
    say("| step | ms | MFU | peak GiB |\n|---|---:|---:|---:|")
    results = {}
    for name, step in (("bare model", bare), ("sc_lightning GRPO", grpo)):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        ms = slowest(median_ms(step, device, args.reps), device)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
        results[name] = ms
        mfu = flops / (ms / 1e3) / (args.peak_tflops * 1e12)
        say(f"| {name} | {ms:.1f} | {mfu:.1%} | {peak:.1f} |")
    say(f"GRPO step / bare step: {results['sc_lightning GRPO'] / results['bare model']:.2f}x the time")
    if args.profile:
        profile(grpo)


def profile(step) -> None:
    """Print the GPU kernels of one call of ``step`` by total time (torch.profiler)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    print(f"profile of one GRPO step: GPU kernels {kernel_us / 1e3:.1f} ms busy")
    print(events.table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=80))


if __name__ == "__main__":
    main()
